"""Real SGLang 0.5.23 ``/metrics`` pages captured by the pod tier, and what SGLang told the clients.

Each ``tests/fixtures/sglang-metrics/real-0.5.23-<name>.txt`` is the page of a real
``sglang.launch_server --enable-metrics`` of a generated pod (the pod tier writes them with
``HICACHE_CAPTURE_METRICS_DIR``); ``<name>.requests.json`` lists every request that page counts,
with the prompt tokens and the cached tokens per tier SGLang returned in its ``meta_info``. A
figure parsed from a page is checked against those answers: two independent outputs of the same
real server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-metrics"
TIERS = ("device", "host", "storage")

#: The embedded CPU example after a cold prompt and the same prompt again (a device hit) ...
EMBEDDED_T0 = "tp1-umbp-embedded-t0"
#: ... and the same server later: four fillers pushed the prompt to the host pool, hit there.
EMBEDDED_T1 = "tp1-umbp-embedded"
#: The standalone CPU example after an engine restart: one prompt served from L3.
STANDALONE_RESTARTED = "tp1-umbp-standalone-after-restart"
#: Two SGLang ranks (TP2) of the MLA example over one standalone DRAM sidecar.
MLA_TP2 = "tp2-umbp-mla-standalone"
#: SGLang's built-in backend after its standalone sidecar restarted: every L3 write failed.
BUILTIN_SIDECAR_RESTARTED = "tp1-sglang-mori-sidecar-restarted"
ALL = (EMBEDDED_T0, EMBEDDED_T1, STANDALONE_RESTARTED, MLA_TP2, BUILTIN_SIDECAR_RESTARTED)


def page(name: str) -> str:
    return (FIXTURES / f"real-0.5.23-{name}.txt").read_text()


def told(name: str) -> list[dict[str, Any]]:
    """The requests a page counts: ``prompt_tokens`` and ``cached_tokens_details`` each."""
    requests: list[dict[str, Any]] = json.loads(
        (FIXTURES / f"real-0.5.23-{name}.requests.json").read_text())
    return requests


def told_ratios(requests: list[dict[str, Any]]) -> dict[str, float]:
    """Hit ratio per tier over ``requests``, from SGLang's own answers."""
    prompt = sum(r["prompt_tokens"] for r in requests)
    return {tier: sum(r["cached_tokens_details"].get(tier, 0) for r in requests) / prompt
            for tier in TIERS}
