"""The generated pod, really run: real SGLang serving over real mori from the operator's spec.

Real: the planner's StatefulSet and ConfigMap; the launcher (``python -m hicache_umbp.launch``,
the container's own command) probing the node, then exec'ing SGLang 0.5.23 (``launch_server``)
with our host-allocator hook and UMBP adapter over the real amd-mori 1.2.4; the pod's own
probes; the container's memory cgroup limit; hugepages reserved in the kernel; uid 10001 with
only IPC_LOCK. Faked: the GPUs (sysfs/dev of a MI355X node, see tests/pod/node.py) and the
device SGLang computes on (CPU, via tests/cpu_engine). See tests/pod/runtime.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .harness import load_cr, running_pod

pytestmark = pytest.mark.pod

PROMPT = " ".join(f"word{i} cache page" for i in range(200))


def fillers(n: int) -> list[str]:
    return [" ".join(f"other{i} filler{j} text" for j in range(120)) for i in range(n)]


def capture_metrics(text: str, name: str, responses: list[dict[str, Any]]) -> None:
    """Keep a real /metrics page as a fixture (HICACHE_CAPTURE_METRICS_DIR=tests/fixtures/...),
    with what SGLang told the clients of every request the page counts (``meta_info``'s prompt
    and cached tokens per tier), so the parser's figures are checked against SGLang's own
    answers to those requests, not against the page itself."""
    target = os.environ.get("HICACHE_CAPTURE_METRICS_DIR")
    if target:
        Path(target, f"real-0.5.23-{name}.txt").write_text(text)
        told = [{"prompt_tokens": r["meta_info"]["prompt_tokens"],
                 "cached_tokens_details": r["meta_info"].get("cached_tokens_details") or {}}
                for r in responses]
        Path(target, f"real-0.5.23-{name}.requests.json").write_text(
            json.dumps(told, indent=1) + "\n")


def expected_ratios(responses: list[dict[str, Any]]) -> dict[str, float]:
    """Hit ratio per tier from what SGLang told each client (meta_info)."""
    prompt = sum(r["meta_info"]["prompt_tokens"] for r in responses)
    out = {}
    for tier in ("device", "host", "storage"):
        cached = sum((r["meta_info"].get("cached_tokens_details") or {}).get(tier, 0)
                     for r in responses)
        out[tier] = cached / prompt
    return out


def assert_operator_reads(port: int, responses: list[dict[str, Any]]) -> None:
    """The operator's own scraper (status.cache) agrees with what the clients were told."""
    from hicache_operator.cachestats import scrape_cache_figures

    figures = scrape_cache_figures(f"http://127.0.0.1:{port}")
    for tier, want in expected_ratios(responses).items():
        assert figures.hit_ratio(tier) == pytest.approx(want, abs=1e-9), tier


@pytest.mark.timeout(900)
def test_embedded_pod_serves_with_host_hits(node, image, workdir: Path, models_dir: Path) -> None:
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    with running_pod(cr, node, image, workdir, models_dir) as (pod, c):
        cold = c.generate(PROMPT)
        again = c.generate(PROMPT)
        assert again["meta_info"]["cached_tokens_details"]["device"] > 0
        capture_metrics(c.metrics(), "tp1-umbp-embedded-t0", [cold, again])
        pushed = [c.generate(text) for text in fillers(4)]
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        assert cold["text"] == again["text"] == host["text"]
        assert_operator_reads(30000, [cold, again, *pushed, host])
        capture_metrics(c.metrics(), "tp1-umbp-embedded", [cold, again, *pushed, host])
        engine = pod.container("engine")
        from .podspec import probe

        liveness = probe(engine.spec, "livenessProbe")
        assert liveness is not None
        ok, msg = pod.run_probe(engine, liveness)
        assert ok, f"the pod's own liveness probe fails on a serving engine: {msg}"
