"""MLA with TP > 1 in the generated pod: two real SGLang ranks (gloo) serving a DeepSeek-V2-
architecture model, each rank a separate scheduler process that shares nothing with the other
but what production shares (the pod's L3 store: a standalone DRAM sidecar, the model volume).

SGLang backs an MLA page up from TP rank 0 only and prefetches the minimum of the ranks' hit
counts, so L3 hits need every rank to see rank 0's pages (issue: the embedded, per-rank store of
the old flagship example never hit). Real and faked parts: see test_serving_pod.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Client, load_cr, running_pod
from .test_serving_pod import assert_operator_reads, capture_metrics

pytestmark = pytest.mark.pod

PROMPT = " ".join(f"latent{i} page" for i in range(150))


def push_out(c: Client, n: int = 12) -> list[dict]:
    """Prompts that push PROMPT out of the device pool and out of the 2x host pool."""
    return [c.generate(" ".join(f"mla{i} other{j} text" for j in range(100))) for i in range(n)]


@pytest.mark.timeout(1200)
def test_mla_tp2_gets_l3_hits_from_one_store_per_pod(node, image, workdir: Path,
                                                      models_dir: Path) -> None:
    cr = load_cr("cpu/tiny-mla-tp2-standalone.yaml")
    with running_pod(cr, node, image, workdir, models_dir) as (_, c):
        cold = c.generate(PROMPT)
        device = c.generate(PROMPT)
        pushed = push_out(c)
        again = c.generate(PROMPT)
        assert device["meta_info"]["cached_tokens_details"]["device"] > 0
        details = again["meta_info"]["cached_tokens_details"]
        assert details["storage"] > 0, details  # the MIN over both ranks' batch_exists
        # The same cached prefix from L3 as from the device: same bytes, same greedy output.
        # (Not compared with the cold output: SGLang 0.5.23's torch_native backend computes
        # MLA differently with and without a cached prefix on CPU, so even a device hit
        # changes it; measured, and not a cache effect.)
        assert again["text"] == device["text"]
        told = [cold, device, *pushed, again]
        assert_operator_reads(cr["spec"]["engine"]["port"], told)
        capture_metrics(c.metrics(), "tp2-umbp-mla-standalone", told)
