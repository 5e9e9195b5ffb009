"""The trace model's router rule against the real router, request by request, on the trace.

Real: the planner's router Deployment for a two-pod CR (``plan()``) and SGLang's model gateway
``smg`` 1.13.0 started with its routing arguments; its string tree and worker selection; the
first requests of Mooncake's conversation trace as text (one page a block, as the served bench
scales it). Faked: the engines (``sglang_standin``: they record each prompt, and one prompt at a
time leaves both idle, as the served replay does). Counts only.

What the model (``trace_model/routing.py``) takes from smg and this pins: a request whose
longest prefix on some pod's tree is more than ``cacheThreshold`` of it goes to a pod with
that longest prefix, every time. Where it goes among equally good pods, and where a miss goes,
change from run to run (``make bench-router-replay``): the model draws those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_lib import REPO
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import plan
from hicache_operator.planner.trace_model import load_trace, prompt_text, scale_trace
from router_lib import SMG
from router_load_lib import routing_args
from router_replay_lib import route_counts, smg_routes

pytestmark = pytest.mark.e2e
PAGE = 16
#: Equal-length words: smg's tree matches characters, so no word is a prefix of another.
WORDS = [f" w{i:02d}" for i in range(95)]


def _deployment() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "minimal-dram-only.yaml").read_text())
    doc["metadata"] = {"name": "traced", "namespace": "default"}
    doc["spec"]["replicas"] = 2
    p = plan(doc, OperatorConfig())
    return next(o for o in p.objects if o["kind"] == "Deployment"
                and o["metadata"]["name"].endswith("-router"))


def test_smg_sends_every_prefix_hit_to_a_pod_holding_the_longest_prefix(
        tmp_path: Path) -> None:
    if not SMG.exists():
        pytest.fail(f"{SMG} is missing: run `make router-env` (bash scripts/build-router-env.sh)")
    args = routing_args(_deployment())
    threshold = float(args[args.index("--cache-threshold") + 1])
    trace = scale_trace(load_trace("mooncake-conversation"), PAGE, count=400)
    cache: dict[int, list[int]] = {}
    texts = [prompt_text(r, PAGE, WORDS, cache=cache) for r in trace.requests]

    routes = smg_routes(SMG, args, texts, tmp_path / "smg.log", ("127.0.0.36", "127.0.0.37"))

    counts = route_counts(trace, routes, threshold)
    # the slice has both kinds (else the check shows nothing)
    assert counts["hits"] >= 80 and counts["misses"] >= 80, counts
    assert counts["to_best_match"] == counts["hits"], counts
    assert 0 < routes.count(0) < len(routes)
