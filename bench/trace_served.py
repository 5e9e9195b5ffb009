"""The trace model's served phases (issue 26): a slice of Mooncake's conversation trace replayed
through real CPU pods, beside the model's prediction. Last line: one JSON object.

1. **One served pod vs the model** (what ``tests/pod/test_trace_served_pod.py`` asserts): the
   first ``--requests`` (800) requests, one trace block per 16-token page, every tier smaller
   than the slice's working set (``tests/pod/trace_replay.py``); hit tokens per tier from
   ``meta_info`` and the store's ``hicache_umbp_l3_read_pages_total{tier}``;
   ``served_vs_model_<tier>``.
2. **Two served pods behind the router under cache pressure**: the first ``--router-requests``
   (1,200) requests, SSD off (DRAM, host and device under pressure), through SGLang's
   real model gateway (smg 1.13.0, ``tests/pod/cluster``: the operator in the API emulator, the
   pods in a pod network), once with ``cache_aware`` (the tree the planner sizes) and once with
   ``round_robin``, on the same two pods (caches flushed, a different prompt seed per phase so
   no phase hits another's pages); measured hit ratios beside the model's for 2 pods of the
   same capacities (``routing.py``), and the bound (one pod holding both pods' caches).

Needs root (like the pod tier), ``make engine-env pod-node-tools router-env``. Run:
``make bench-trace`` (this is its served part: ``bench/trace.py --served``), or alone
``.cache/venvs/engine/bin/engine-python bench/trace_served.py [--requests N]
[--router-requests N] [--phases single,router]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hicache_operator.planner.trace_model import (  # noqa: E402
    TIERS,
    TierTokens,
    model_for_slice,
    prompt_text,
    router_config,
)
from pod.cluster import served_cluster  # noqa: E402
from pod.harness import admin_config, plan_pod, start_pod  # noqa: E402
from pod.image import served_files  # noqa: E402
from pod.node import Node  # noqa: E402
from pod.test_ssd_pod import metric  # noqa: E402
from pod.test_trace_served_pod import GAP_S  # noqa: E402
from pod.trace_replay import (  # noqa: E402
    PAGE,
    capacity_of,
    served_cr,
    single_token_words,
    trace_slice,
    vocab_size,
    with_store_sets,
)
from pod.trace_replay import replay as served_replay  # noqa: E402
from support.smg import generate, healthy_worker_ips, wait_until  # noqa: E402

NS, NAME, MODEL, PORT = "hicache-bench", "tiny-llama", "/models/tiny-llama", 30000
WARM_UP_S = 65


def _r(x: float, n: int = 4) -> float:
    return round(x, n)


def single_pod(root: Path, node: Node, image: Any, models: Path, requests: int,
               gap_s: float = GAP_S) -> dict[str, Any]:
    trace = trace_slice(requests)
    cr = served_cr(trace)
    planned = plan_pod(cr, admin_config(node))
    capacity, policy = capacity_of(planned.plan, cr)
    pod = start_pod(planned, node, image, root / "single", {"tiny-models": models})
    try:
        pod.wait_ready(600)
        served = served_replay(f"http://127.0.0.1:{PORT}", trace, vocab_size(models),
                               gap_s=gap_s)
        engine_log = pod.container("engine").log_text(10**8)
    finally:
        pod.close()
    # The store's own page -> set map (SGLang's page hashes under the keys the pod logged);
    # the mean over 32 other maps beside it is what a plan without the keys predicts.
    mapped = with_store_sets(policy, trace, engine_log, vocab_size(models))
    predicted = model_for_slice(trace, capacity, mapped)
    mean_of_maps = model_for_slice(trace, capacity, policy)
    # How much 2% of UMBP DRAM's capacity moves the DRAM / SSD split: at these capacities
    # prefixes reused at about what DRAM holds are kept or lost together.
    sensitivity = {}
    for factor in (0.98, 1.02):
        dram = int(capacity.l3_dram * factor) // PAGE * PAGE
        hits = model_for_slice(trace, replace(capacity, l3_dram=dram), mapped).hit_tokens
        sensitivity[str(factor)] = {t: hits[t] for t in ("l3_dram", "l3_ssd")}
    out = {"requests": requests, "page_size": PAGE, "prompt_tokens": served.prompt_tokens,
           "gap_s": gap_s, "capacity": capacity.__dict__,
           "predicted_hit_tokens": predicted.hit_tokens,
           "predicted_mean_of_32_maps": mean_of_maps.hit_tokens,
           "predicted_evicted_tokens": predicted.evicted_tokens,
           "served_hit_tokens": served.hit_tokens, "served_storage_tokens": served.storage_tokens,
           "replay_s": _r(served.seconds, 1),
           **{k: _r(v) for k, v in predicted.served_vs_model(served.hit_tokens).items()},
           "served_vs_model_l3": _r(served.storage_tokens / (
               predicted.hit_tokens["l3_dram"] + predicted.hit_tokens["l3_ssd"])),
           "dram_capacity_sensitivity": sensitivity,
           # the model promotes every SSD hit; the store skips one while a put still runs
           "promotions_keys": {k: int(metric(served.metrics, f"hicache_umbp_{k}_keys_total"))
                               for k in ("promoted", "promotions_skipped")}}
    print("single pod: " + json.dumps(out), flush=True)
    return out


def flush(ips: list[str]) -> None:
    for ip in ips:
        urllib.request.urlopen(urllib.request.Request(f"http://{ip}:{PORT}/flush_cache",
                                                      method="POST"), timeout=60).read()


def router_for(api: Any, kubelet: Any, spec: dict[str, Any], ips: set[str]) -> str:
    """Apply ``spec.router`` and wait for a router pod running it to route to both pods."""
    api.patch_cr(NS, NAME, {"router": spec})

    def current() -> str | None:
        dep = api.request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-router")
        if dep is None:
            return None
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        if args[args.index("--policy") + 1] != spec["policy"]:
            return None
        pods = [p for p in api.list(f"/api/v1/namespaces/{NS}/pods",
                                    "app.kubernetes.io/name=sglang-hicache-router")
                if p["spec"]["containers"][0]["args"] == args
                and p["metadata"]["name"] in kubelet.running]
        if not pods:
            return None
        base = f"http://{kubelet.ip(pods[0]['metadata']['name'])}:{PORT}"
        return base if healthy_worker_ips(base) == ips else None
    return wait_until(current, f"a router with {spec} routing to both pods", 900)


def router_phase(base: str, trace: Any, words: list[str], seed: int) -> dict[str, Any]:
    cache: dict[int, list[int]] = {}
    prompt = hits = 0
    tiers = {"device": 0, "host": 0, "storage": 0}
    pods: dict[str, int] = {}
    for req in trace.requests:
        out = generate(base, MODEL, prompt_text(req, PAGE, words, seed=seed, cache=cache))
        meta = out["meta_info"]
        prompt += int(meta["prompt_tokens"])
        hits += int(meta["cached_tokens"])
        for t in tiers:
            tiers[t] += int((meta.get("cached_tokens_details") or {}).get(t, 0))
        pods[out["worker_ip"]] = pods.get(out["worker_ip"], 0) + 1
    return {"hit_ratio": _r(hits / prompt), "hit_tokens": tiers, "prompt_tokens": prompt,
            "requests_by_pod": dict(sorted(pods.items()))}


def router_cr(trace: Any) -> dict[str, Any]:
    cr = served_cr(trace, name=NAME)
    cr["metadata"]["namespace"] = NS
    cr["spec"]["replicas"] = 2
    # L3 is DRAM only here: routing decides what each pod's GPU, host pool and DRAM hold, and a
    # shorter phase; the single-pod phase checks the SSD tier.
    cr["spec"]["l3"]["ssd"] = {"enabled": False}
    fast = {"intervalSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 1,
            "successThreshold": 1}
    # One router pod, as tests/pod/test_router_pod.py runs it: the phase measures where one
    # router sends each request (two routers and their mesh: tests/e2e/test_router_mesh.py).
    cr["spec"]["router"] = {"enabled": True, "replicas": 1, "healthCheck": fast,
                            "policy": "cache_aware", "tree": {"evictionIntervalSeconds": 2}}
    return cr


def two_pods(root: Path, node: Node, image: Any, models: Path, requests: int) -> dict[str, Any]:
    trace = trace_slice(requests)
    cr = router_cr(trace)
    planned = plan_pod(cr, admin_config(node))
    capacity, policy = capacity_of(planned.plan, cr)
    p = planned.plan
    model: dict[str, Any] = {}
    for name in ("cache_aware", "round_robin"):
        rc = router_config(p.spec, p.router, 2, name)  # type: ignore[arg-type]
        pred = model_for_slice(trace, capacity, policy, pods=2, router=rc)
        low, high = pred.hit_ratio_spread
        model[name] = {"hit_ratio": _r(pred.hit_ratio), "hit_ratio_spread": [_r(low), _r(high)],
                       "draws": len(pred.results), "hit_tokens": pred.hit_tokens,
                       "requests_per_pod": list(pred.result.requests_per_pod),
                       "tree_tokens": rc.tree_tokens}
    pooled = TierTokens(*(2 * capacity.get(t) for t in TIERS))
    model["bound"] = _r(model_for_slice(trace, pooled, policy).hit_ratio)
    print("two pods, the model: " + json.dumps(model), flush=True)
    words = single_token_words(models / "tiny-llama")
    measured: dict[str, Any] = {}
    t0 = time.monotonic()
    (root / "cluster").mkdir()
    (root / "cluster").chmod(0o755)
    with served_cluster(root / "cluster", node, image, models, NS) as (api, kubelet, _net):
        api.create_cr(cr)
        wait_until(lambda: all(f"{NAME}-{i}" in kubelet.running for i in range(2)), "two pods")
        ips = [kubelet.ip(f"{NAME}-{i}") for i in range(2)]
        for seed, name in ((1, "cache_aware"), (2, "round_robin")):
            base = router_for(api, kubelet, {**cr["spec"]["router"], "policy": name}, set(ips))
            for ip in ips:
                generate(f"http://{ip}:{PORT}", MODEL, "warm up")
            flush(ips)
            # smg diverts 1 request in 8 away from a worker it discovered less than 60 s ago
            # (its warm-up); a new router pod runs each policy: start after it.
            time.sleep(WARM_UP_S)
            start = time.monotonic()
            measured[name] = router_phase(base, trace, words, seed)
            measured[name]["replay_s"] = _r(time.monotonic() - start, 1)
            print(f"two pods, {name} (at {time.monotonic() - t0:.0f} s): "
                  + json.dumps(measured[name]), flush=True)
    aware, robin = measured["cache_aware"]["hit_ratio"], measured["round_robin"]["hit_ratio"]
    predicted = model["cache_aware"]["hit_ratio"] / model["round_robin"]["hit_ratio"]
    low, high = model["cache_aware"]["hit_ratio_spread"]
    return {"requests": requests, "capacity": capacity.__dict__, "model": model,
            "measured": measured, "served_within_model_spread": low <= aware <= high,
            "router_vs_round_robin_hit": _r(aware / robin, 3) if robin else None,
            "router_vs_round_robin_hit_predicted": _r(predicted, 3),
            "router_vs_bound": _r(aware / model["bound"], 3),
            "served_vs_model_cache_aware": _r(aware / model["cache_aware"]["hit_ratio"]),
            "served_vs_model_round_robin": _r(robin / model["round_robin"]["hit_ratio"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=800, help="the single-pod slice")
    # Two pods, each policy in turn. Where each new conversation lands is a draw (the
    # routing module): over the first 500 requests one run's hit ratio can fall anywhere in
    # 0.84-1.05x of the model's bound (its 32 draws); over 1,200 in 0.97-1.01x.
    ap.add_argument("--router-requests", type=int, default=1200, help="the two-pod slice")
    ap.add_argument("--phases", default="single,router")
    ap.add_argument("--gap-s", type=float, default=GAP_S,
                    help="seconds between a response and the next request (single pod)")
    args = ap.parse_args()
    phases = args.phases.split(",")
    result: dict[str, Any] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-trace-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        models, image = served_files(root)
        with Node(root / "node") as node:
            if "single" in phases:
                (root / "single").mkdir()
                (root / "single").chmod(0o755)
                result["single_pod"] = single_pod(root, node, image, models, args.requests,
                                                  args.gap_s)
            if "router" in phases:
                result["two_pods"] = two_pods(root, node, image, models,
                                              args.router_requests)
    single = result.get("single_pod", {})
    result.update({k: v for k, v in single.items() if k.startswith("served_vs_model_")})
    if "two_pods" in result:
        result["router_vs_round_robin_hit"] = result["two_pods"]["router_vs_round_robin_hit"]
    result["wall_s"] = _r(time.monotonic() - t0, 1)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
