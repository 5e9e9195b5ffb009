"""Where the real router sends each request of the trace slice, through the model's caches.

``make bench-router-replay`` (``make engine-env router-env``; no root, no engine). The served
router phase of ``make bench-trace`` measures one run of SGLang's gateway per policy, and a run
is one draw: smg 1.13.0 picks among equally good pods (a prefix both pods' trees hold; equal
loads and request counts) in a way that changes from run to run. This bench repeats the
routing alone, cheaply:

1. the slice ``bench/trace_served.py`` routes (``--requests``, the first 500 by default), as
   the same text prompts (``prompt_text``, the tiny model's single-token words, seed 1);
2. ``--runs`` times: a fresh ``smg`` with the routing arguments the planner renders for the
   bench's two-pod CR, in front of two stand-in engines (``tests/e2e/sglang_standin.py``),
   every prompt sent in order, one at a time; which stand-in received it is its route;
3. each run's routes replayed through the model's caches of the served pods' capacities
   (``replay(..., routes=...)``): the hit ratio that run would have had, beside the model's
   own draws (``model_for_slice``: mean and spread over 32).

Also counted per run, on the trace's blocks: requests whose longest prefix on some pod is over
``cacheThreshold`` sent to a pod with that longest prefix (``to_best_match``), and misses sent
to the pod with fewer requests so far (``misses_to_fewer``). The last line is one JSON object.
Real: smg, its arguments, its tree and worker selection. Faked: the engines (the routing does
not read their caches: load polls report idle engines, as a one-at-a-time replay leaves them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.append(str(ROOT / "bench"))

from hicache_operator.api import OperatorConfig  # noqa: E402
from hicache_operator.plan import plan  # noqa: E402
from hicache_operator.planner.trace_model import (  # noqa: E402
    model_for_slice,
    prompt_text,
    replay,
    router_config,
)
from pod.trace_replay import (  # noqa: E402
    PAGE,
    capacity_of,
    single_token_words,
    trace_slice,
)
from router_load_lib import routing_args  # noqa: E402
from router_replay_lib import route_counts, smg_routes  # noqa: E402
from trace_served import router_cr  # noqa: E402

SMG = ROOT / ".cache" / "bin" / "smg"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--runs", type=int, default=8)
    a = ap.parse_args()
    if not SMG.exists():
        sys.exit(f"{SMG} is missing: run `make router-env`")
    trace = trace_slice(a.requests)
    cr = router_cr(trace)
    p = plan(cr, OperatorConfig())
    deployment = next(o for o in p.objects if o["kind"] == "Deployment"
                      and o["metadata"]["name"].endswith("-router"))
    args = routing_args(deployment)
    cap, policy = capacity_of(p, cr)
    rc = router_config(p.spec, p.router, 2, "cache_aware")
    model = model_for_slice(trace, cap, policy, pods=2, router=rc)
    robin = model_for_slice(trace, cap, policy, pods=2,
                            router=router_config(p.spec, p.router, 2, "round_robin"))
    low, high = model.hit_ratio_spread
    print(f"the model: cache_aware {model.hit_ratio:.4f} ({len(model.results)} draws "
          f"{low:.4f}-{high:.4f}), round_robin {robin.hit_ratio:.4f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="router-replay-") as tmp:
        models = Path(tmp) / "models"
        from hicache_cpu_engine.tiny_model import make_model
        make_model(models / "tiny-llama", "llama")
        words = single_token_words(models / "tiny-llama")
        cache: dict[int, list[int]] = {}
        texts = [prompt_text(r, PAGE, words, seed=1, cache=cache) for r in trace.requests]
        runs: list[dict[str, Any]] = []
        for i in range(a.runs):
            routes = smg_routes(SMG, args, texts, Path(tmp) / f"smg-{i}.log")
            got = replay(trace, cap, policy, pods=2, routes=routes)
            run = {"hit_ratio": round(got.hit_ratio, 4), "hit_tokens": got.hit_tokens,
                   "requests_per_pod": list(got.requests_per_pod),
                   **route_counts(trace, routes, rc.cache_threshold)}
            runs.append(run)
            print(f"smg run {i + 1}: " + json.dumps(run), flush=True)
    ratios = [r["hit_ratio"] for r in runs]
    rr = robin.hit_ratio
    print(json.dumps({
        "requests": a.requests, "runs": len(runs),
        "smg_hit_ratio": {"mean": round(statistics.mean(ratios), 4), "min": min(ratios),
                          "max": max(ratios)},
        "model_hit_ratio": {"mean": round(model.hit_ratio, 4), "min": round(low, 4),
                            "max": round(high, 4)},
        "smg_vs_model_mean": round(statistics.mean(ratios) / model.hit_ratio, 4),
        "smg_runs_within_model_spread": sum(low <= r <= high for r in ratios),
        "round_robin": round(rr, 4),
        "smg_vs_round_robin": {"mean": round(statistics.mean(ratios) / rr, 3),
                               "min": round(min(ratios) / rr, 3),
                               "max": round(max(ratios) / rr, 3)},
        "smg_runs_at_least_1_5x_round_robin": sum(r >= 1.5 * rr for r in ratios),
        "to_best_match": f"{sum(r['to_best_match'] for r in runs)} of "
                         f"{sum(r['hits'] for r in runs)}",
        "misses_to_fewer": f"{sum(r['misses_to_fewer'] for r in runs)} of "
                           f"{sum(r['misses_unequal'] for r in runs)}",
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
