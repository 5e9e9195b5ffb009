"""Long prompts served from the L3 tier after an engine restart, in the generated pod (see
test_serving_pod.py for what is real: the planner's pod, the launcher, real SGLang 0.5.23 over
real mori 1.2.4 in standalone sidecars, the kubelet's restart of the engine container).

What issue 24 (goal 7) was seen with: page 32, a warm-up request after the restart, then the
prompt. Here prompts of about 1k, 2k and 3.5k tokens, each counted: every full page of each
must come from storage (``cached_tokens_details.storage``), none from device or host, and the
greedy token must equal the cold one. Nothing here is timed (bench/l3_hit.py compares the
storage-hit TTFT with cold); what is asserted besides the counts is that the prefetch settings
the operator renders reached SGLang's command line, so the counts are those of that policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.settings import PREFETCH_POLICY, PREFETCH_THRESHOLD

from .harness import load_cr, running_pod
from .test_restart_pod import restart_engine
from .test_serving_pod import fillers

pytestmark = pytest.mark.pod

PAGE = 32
#: Words of each prompt: ~1.1k, ~1.9k and ~3.5k tokens with the tiny model's tokenizer (each
#: "lN wJ cache" is about 9 tokens), under its 4096-token context.
WORDS = (120, 230, 362)


def prompt(words: int) -> str:
    return " ".join(f"l{words} w{j} cache" for j in range(words))


def engine_argv(pod: Any) -> list[str]:
    report = json.loads((pod.volume_host_path("hicache-run") / "launch-report.json").read_text())
    return [str(a) for a in report["argv"]]


@pytest.mark.timeout(1200)
def test_long_prompts_come_whole_from_storage_after_an_engine_restart(
        node, image, workdir: Path, models_dir: Path) -> None:
    cr = load_cr("cpu/tiny-llama-standalone.yaml", **{"spec.engine.pageSize": PAGE})
    with running_pod(cr, node, image, workdir, models_dir) as (pod, c):
        argv = engine_argv(pod)
        policy = argv[argv.index("--hicache-storage-prefetch-policy") + 1]
        extra = json.loads(argv[argv.index("--hicache-storage-backend-extra-config") + 1])
        assert policy == PREFETCH_POLICY, argv
        assert extra["prefetch_threshold"] == PREFETCH_THRESHOLD, extra
        assert all(w * 7 > PREFETCH_THRESHOLD for w in WORDS)  # every prompt is prefetched
        c.generate("a warm-up request " * 20, max_new_tokens=1)
        texts = [prompt(w) for w in WORDS]
        cold = [c.generate(t, max_new_tokens=1) for t in texts]
        assert [o["meta_info"]["cached_tokens"] for o in cold] == [0, 0, 0]
        # write_back: a prompt reaches L2 (then L3) when pushed out of the 4,096-token device
        # pool; other text pushes the last ones out (as test_restart_pod.py does).
        for text in fillers(4):
            c.generate(text, max_new_tokens=1)
        c.wait_backups_in_l3()
        restart_engine(pod)
        c.generate("another warm-up request " * 20, max_new_tokens=1)
        for text, before in zip(texts, cold, strict=True):
            out = c.generate(text, max_new_tokens=1)
            meta = out["meta_info"]
            details = meta["cached_tokens_details"]
            full_pages = meta["prompt_tokens"] // PAGE * PAGE
            print(f"{meta['prompt_tokens']} prompt tokens: {details}")
            assert meta["prompt_tokens"] >= 1000
            assert details["storage"] == full_pages, meta
            assert details["device"] == details["host"] == 0, details
            assert out["text"] == before["text"]
