"""The trace model against one served pod (issue 26, the served check): per-tier hit tokens.

Real: a slice of Mooncake's published conversation trace (its first requests, one 512-token
block scaled to one 16-token page), each request's prompt made from its hash ids
(``trace_model.prompt_ids``: equal hashes, equal pages) and sent one at a time to the CPU
example's pod, planned by the real planner with every tier smaller than the slice's working set
and run by the pod tier (the launcher, SGLang 0.5.23 over our store on real mori 1.2.4 DRAM and
our SSD tier); hits per tier from each response's ``meta_info`` (device, host, storage) and the
store's ``hicache_umbp_l3_read_pages_total{tier}`` (DRAM, SSD). The prediction: the trace model
(``model_for_slice``) for the tiers as the pod has them (``trace_replay.capacity_of``: the
device and host pools as SGLang sizes them, L3 with the planner's sizing) and the policies the
CR gives (``pod_model``: page size, write-through, SGLang's prefetch threshold and gate and its
128-page storage calls, promotion, mori's DRAM keys, watermarks and per-call eviction, our SSD
tier's 16-way sets of page parts), with the store's own page -> set map
(``trace_replay.with_store_sets``: SGLang's page hashes under the key prefixes the pod's store
logged). Every tier's served hit tokens must be within 10% of the prediction (they have been
equal to the token). Requests go ``GAP_S`` apart: the model has a request's backups end before
the next request's prefetch, and back to back a promotion is sometimes skipped while the last
request's put still runs (the store never waits), which moves the DRAM / SSD split by up to
11% from run to run. The store writes DRAM -> SSD inside each put (tiering write_through), so
what L3 holds does not depend on how fast a write-back ring drains.
Faked: the GPUs (the pod tier's node) and the device SGLang computes on (CPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hicache_operator.planner.trace_model import model_for_slice

from .harness import Client, admin_config, plan_pod, start_pod
from .test_ssd_pod import metric
from .trace_replay import (
    capacity_of,
    replay,
    served_cr,
    trace_slice,
    vocab_size,
    with_store_sets,
)

pytestmark = pytest.mark.pod

REQUESTS = 800
#: Seconds between a response and the next request: the last request's backups end first.
GAP_S = 0.15
#: A tier whose predicted hits are below this share of all predicted hits is reported, not held
#: to 10%: a few pages either way would be a large relative error on a negligible count.
MEANINGFUL_SHARE = 0.05


@pytest.mark.timeout(1800)
def test_served_pod_hits_per_tier_agree_with_the_model(
        node: Any, image: Any, workdir: Path, models_dir: Path) -> None:
    trace = trace_slice(REQUESTS)
    cr = served_cr(trace)
    planned = plan_pod(cr, admin_config(node))
    capacity, policy = capacity_of(planned.plan, cr)
    vocab = vocab_size(models_dir)
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(600)
        served = replay(Client(30000).base, trace, vocab, gap_s=GAP_S)
        engine_log = pod.container("engine").log_text(10**8)
    finally:
        pod.close()
    # The store's own page -> set map: the model keeps the SSD's pages where the store does
    # (the mean over other maps, and its spread: bench/trace_served.py).
    mapped = model_for_slice(trace, capacity, with_store_sets(policy, trace, engine_log, vocab))
    ratios = mapped.served_vs_model(served.hit_tokens)
    total = sum(mapped.hit_tokens.values())
    report = {"capacity": capacity.__dict__, "predicted": mapped.hit_tokens,
              "served": served.hit_tokens, "served_storage": served.storage_tokens,
              "prompt_tokens": served.prompt_tokens, "replay_s": round(served.seconds, 1),
              # promotions the store skipped for a put still running (the gap is there to
              # make it 0: the model skips none)
              "promotions_skipped_keys": metric(served.metrics,
                                                "hicache_umbp_promotions_skipped_keys_total"),
              **{k: round(v, 4) for k, v in ratios.items()}}
    print("served check: " + json.dumps(report))
    if os.environ.get("HICACHE_SERVED_REPORT"):  # with every request's hits, for a diff
        Path(os.environ["HICACHE_SERVED_REPORT"]).write_text(json.dumps(
            {**report, "per_request": served.per_request, "metrics": served.metrics}) + "\n")
    assert served.prompt_tokens == trace.prompt_tokens
    # The store's pages read cover what SGLang reported as storage hits (more only when SGLang
    # dropped a prefetch it had read, past its timeout policy's deadline).
    assert served.hit_tokens["l3_dram"] + served.hit_tokens["l3_ssd"] >= served.storage_tokens
    # Every tier evicted in the model (the capacities put them all under pressure).
    assert all(mapped.evicted_tokens[t] > 0 for t in mapped.evicted_tokens), \
        mapped.evicted_tokens
    meaningful = [t for t, n in mapped.hit_tokens.items() if n >= MEANINGFUL_SHARE * total]
    assert len(meaningful) == 4, report  # the slice and capacities make every tier count
    for tier in ("device", "host"):
        assert ratios[f"served_vs_model_{tier}"] == pytest.approx(1.0, rel=0.10), (tier, report)
    # L3 as a whole (SGLang's storage hits).
    l3 = mapped.hit_tokens["l3_dram"] + mapped.hit_tokens["l3_ssd"]
    assert served.storage_tokens / l3 == pytest.approx(1.0, rel=0.10), report
    # Its split between DRAM and SSD.
    for tier in ("l3_dram", "l3_ssd"):
        assert ratios[f"served_vs_model_{tier}"] == pytest.approx(1.0, rel=0.10), (tier, report)
