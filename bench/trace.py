"""The trace model's benchmark (issue 26), and its served phases. Last line: one JSON object.

1. **DeepSeek-R1 projection**: ``examples/deepseek-r1-mi355x.yaml`` planned, its tiers replayed
   on Mooncake's full conversation trace (as the example is, write_back, and with
   write_through): hit ratio with the host pool only (device + host), + UMBP DRAM, + UMBP
   SSD, and the tokens/s (and GB/s) each tier must deliver at the trace's rate, beside the
   rate at which it can (docs/performance.md bandwidths).
2. **Router vs round-robin under cache pressure**: N pods of the same plan with the host pool
   only (device + host, ~5.6 M tokens a pod against a 90.7 M-token working set), behind
   cache_aware (the CR's thresholds and tree), round_robin and prefix_hash; the bound is one pod
   holding all N pods' cache (a perfect partition of the sessions, nothing held twice).
3. **The served slice's prediction**: the first 800 requests at 16 tokens per block and
   pageSize 16 (the CPU test model), write-through, capacities that make every tier evict
   (``pressure_capacities``), and what the model predicts per tier.
4. **Served** (``--served``, what ``make bench-trace`` runs): ``bench/trace_served.py`` in the
   engine environment (root, the pod tier): that slice through one real CPU pod
   (``served_vs_model_<tier>``) and through two pods behind the real router, cache_aware vs
   round_robin (``router_vs_round_robin_hit``, measured, beside the model's); its JSON is
   merged into this one.

Run: ``make bench-trace`` (``.venv/bin/python bench/trace.py --served [--pods 2,4,8]``; without
``--served`` only the model runs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import plan
from hicache_operator.planner.trace_model import (
    MEASURED_BANDWIDTH,
    TIERS,
    Policy,
    TierTokens,
    estimate,
    footprint_tokens,
    load_trace,
    model_for_slice,
    pod_model,
    pressure_capacities,
    replay,
    router_config,
    scale_trace,
    theoretical_hit,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/deepseek-r1-mi355x.yaml"
PREFILL = 52_300.0  # LMSYS's DeepSeek-R1 on 8xH100 (DESIGN §12)
SLICE_REQUESTS, SLICE_BLOCK, SLICE_PAGE = 800, 16, 16
ENGINE_PY = ROOT / ".cache/venvs/engine/bin/engine-python"


def _r(x: float, n: int = 4) -> float:
    return round(x, n)


def projection(trace: Any, model: Any) -> dict[str, Any]:
    bw = {t: b.gb_per_s for t, b in MEASURED_BANDWIDTH.items()}
    out: dict[str, Any] = {}
    steps = [("host_only", model.capacity.without("l3_dram", "l3_ssd")),
             ("with_dram", model.capacity.without("l3_ssd")), ("with_ssd", model.capacity)]
    for name, cap in steps:
        t0 = time.perf_counter()
        r = replay(trace, cap, model.policy, prefill_tokens_per_s=PREFILL)
        seconds = time.perf_counter() - t0
        est = estimate(r, prefill_tokens_per_s=PREFILL, bandwidth=bw,
                       token_bytes=model.token_bytes,
                       l3_read_bytes=model.l3_read_bytes_per_token)
        out[name] = {"hit_ratio": _r(r.hit_ratio), "replay_s": _r(seconds, 2),
                     "tiers": {t.tier: {"hit_ratio": _r(t.hit_ratio), "tokens_per_s": round(
                         t.tokens_per_s), "read_gb_per_s": _r(t.read_gb_per_s, 3),
                         "can_load_tokens_per_s": round(t.rate_tokens_per_s)}
                         for t in est.tiers},
                     "ttft_s": _r(est.ttft_s), "ttft_cold_s": _r(est.ttft_cold_s)}
        print(f"{name:<10} hit {r.hit_ratio:.4f} in {seconds:.2f} s; " + ", ".join(
            f"{t.tier} {t.hit_ratio:.4f} ({t.tokens_per_s:,.0f} tok/s, "
            f"{t.read_gb_per_s:.3f} GB/s; loads at {t.rate_tokens_per_s:,.0f} tok/s)"
            for t in est.tiers), flush=True)
    return out


def router_pressure(trace: Any, p: Any, model: Any, pods_list: list[int]) -> dict[str, Any]:
    cap = model.capacity.without("l3_dram", "l3_ssd")
    out: dict[str, Any] = {}
    for pods in pods_list:
        row: dict[str, Any] = {}
        for policy in ("cache_aware", "round_robin", "prefix_hash"):
            rc = router_config(p.spec, p.router, pods, policy)
            r = replay(trace, cap, model.policy, pods=pods, router=rc,
                       prefill_tokens_per_s=PREFILL)
            row[policy] = _r(r.hit_ratio)
            row[f"{policy}_busiest_pod_share"] = _r(max(r.requests_per_pod) / r.requests)
        pooled = TierTokens(*(pods * cap.get(t) for t in TIERS))
        row["bound"] = _r(replay(trace, pooled, model.policy).hit_ratio)
        row["router_vs_round_robin_hit"] = _r(row["cache_aware"] / row["round_robin"], 3)
        row["router_vs_bound"] = _r(row["cache_aware"] / row["bound"], 3)
        row["bound_vs_round_robin"] = _r(row["bound"] / row["round_robin"], 3)
        out[str(pods)] = row
        print(f"{pods} pods (device + host {cap.device + cap.host:,} tokens each): "
              f"cache_aware {row['cache_aware']:.4f}, round_robin {row['round_robin']:.4f}, "
              f"prefix_hash {row['prefix_hash']:.4f}, bound {row['bound']:.4f}; router / rr "
              f"{row['router_vs_round_robin_hit']}x, router / bound {row['router_vs_bound']}x",
              flush=True)
    return out


def served_slice(trace: Any) -> dict[str, Any]:
    sliced = scale_trace(trace, SLICE_BLOCK, count=SLICE_REQUESTS)
    cap = pressure_capacities(sliced, SLICE_PAGE)
    pred = model_for_slice(sliced, cap, Policy(page_size=SLICE_PAGE,
                                               write_policy="write_through"))
    print(f"served slice {sliced.name}: {sliced.prompt_tokens:,} prompt tokens, capacities "
          f"{cap}; predicted hits {pred.hit_tokens} (ratio {pred.hit_ratio:.4f})",
          flush=True)
    return {"requests": SLICE_REQUESTS, "block_tokens": SLICE_BLOCK, "page_size": SLICE_PAGE,
            "prompt_tokens": sliced.prompt_tokens, "working_set": footprint_tokens(sliced),
            "capacity": asdict(cap), "predicted_hit_tokens": pred.hit_tokens,
            "predicted_evicted_tokens": pred.evicted_tokens,
            "predicted_hit_ratio": _r(pred.hit_ratio)}


def served(requests: int) -> dict[str, Any]:
    """bench/trace_served.py in the engine environment; its last line (JSON)."""
    cmd = [str(ENGINE_PY), str(ROOT / "bench/trace_served.py"), "--requests", str(requests)]
    print("served phases: " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    print("\n".join(lines[:-1] if proc.returncode == 0 else lines), flush=True)
    if proc.returncode:  # what the phases printed before they failed is above
        raise SystemExit(f"served phases failed (exit {proc.returncode})")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", default="2,4,8")
    ap.add_argument("--served", action="store_true",
                    help="also run the served phases (root, make engine-env router-env)")
    args = ap.parse_args()
    pods_list = [int(x) for x in args.pods.split(",")]
    t0 = time.perf_counter()
    trace = load_trace("mooncake-conversation")
    load_s = time.perf_counter() - t0
    ceiling = theoretical_hit(trace)
    print(f"{trace.name}: {len(trace.requests):,} requests, {trace.prompt_tokens:,} prompt "
          f"tokens over {trace.duration_s:,.0f} s, working set {footprint_tokens(trace):,} "
          f"tokens, theoretical hit {ceiling:.4f} (paper: 40%); loaded in {load_s:.2f} s",
          flush=True)
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["spec"]["replicas"] = max(pods_list)  # the router is planned from 2 replicas
    p = plan(cr, OperatorConfig())
    model = pod_model(p.spec, p.sizing, p.gpu_model)
    print(f"deepseek-r1 per pod: {model.capacity}, {model.policy}", flush=True)
    result = {
        "trace": trace.name, "theoretical_hit": _r(ceiling),
        "deepseek_r1": {"capacity": asdict(model.capacity), **projection(trace, model)},
        # The example keeps write_back, under which this trace never reads L3 (SGLang's lookup
        # gate, docs/capacity-planning.md); the same tiers with write_through:
        "deepseek_r1_write_through": projection(trace, replace(
            model, policy=replace(model.policy, write_policy="write_through"))),
        "router_under_pressure": router_pressure(trace, p, model, pods_list),
        "served_slice": served_slice(trace),
        "prefill_tokens_per_s": PREFILL,
        "bandwidth_gb_per_s": {t: b.gb_per_s for t, b in MEASURED_BANDWIDTH.items()},
        "wall_s": _r(time.perf_counter() - t0, 1),
    }
    worst = min(result["router_under_pressure"].values(),
                key=lambda row: row["router_vs_round_robin_hit"])
    # the model's, on the full trace; router_vs_round_robin_hit is the served measurement
    result["model_router_vs_round_robin_hit"] = worst["router_vs_round_robin_hit"]
    result["router_vs_bound"] = min(
        row["router_vs_bound"] for row in result["router_under_pressure"].values())
    if args.served:
        measured = served(SLICE_REQUESTS)
        result["served"] = measured
        result.update({k: v for k, v in measured.items()
                       if k.startswith("served_vs_model_") or k == "router_vs_round_robin_hit"})
    result["wall_s"] = _r(time.perf_counter() - t0, 1)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
