"""Benchmark the planner: plan 1,000 varied SGLangHiCache CRs, report time per CR and peak RSS.

The CRs vary every axis the planner branches on (TP/DP/DP-attention, host pool size and page
size, L3 mode, DRAM size and backing, SSD on PVC/emptyDir/hostPath or off, GPU model, explicit or
auto resources); one in ten is invalid on purpose so the rejection path is timed too. Ratios are
measured side by side in this run: standalone vs embedded plans, rejected vs planned CRs, and the
mean against the 1 s reconcile budget of DESIGN §8. Last line: one JSON object.

Run: ``make bench-plan`` (``.venv/bin/python bench/plan.py [--count N] [--seed S]``).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from typing import Any

from hicache_operator.api.config import AdminPolicy, OperatorConfig
from hicache_operator.plan import SpecError, plan

RECONCILE_BUDGET_MS = 1000.0


def varied_cr(rng: random.Random, i: int) -> dict[str, Any]:
    tp = rng.choice([1, 2, 4, 8])
    dp_attn = tp >= 2 and rng.random() < 0.2
    dp = rng.choice([d for d in (2, 4, 8) if tp % d == 0 and d <= tp]) if dp_attn else 1
    mode = rng.choice(["embedded", "standalone"])
    ssd_kind = rng.choice(["off", "claimTemplate", "emptyDir", "hostPath"])
    ssd: dict[str, Any] = {"enabled": ssd_kind != "off"}
    if ssd_kind != "off":
        ssd["capacity"] = f"{rng.choice([100, 500, 1000])}Gi"
        size = "1200Gi"
        ssd["volume"] = {
            "claimTemplate": {"claimTemplate": {"size": size, "storageClassName": "local-nvme"}},
            "emptyDir": {"emptyDir": {"sizeLimit": size}},
            "hostPath": {"hostPath": {"path": f"/mnt/nvme{i % 4}", "size": size}},
        }[ssd_kind]
    spec: dict[str, Any] = {
        "model": {"path": rng.choice(["deepseek-ai/DeepSeek-R1", "/models/llama-70b"])},
        "replicas": rng.randint(1, 4),
        "engine": {
            "tensorParallelSize": tp,
            "dataParallelSize": dp,
            "enableDpAttention": dp_attn,
            "extraArgs": ["--trust-remote-code"],
        },
        "hiCache": {
            "hostPoolPerRank": f"{rng.choice([8, 32, 64, 100])}Gi",
            "hostAllocator": {"hugePageSize": rng.choice(["2Mi", "1Gi", "none"])},
        },
        "l3": {
            "mode": mode,
            "dram": {
                "capacity": f"{rng.choice([16, 64, 128])}Gi",
                "hugePageSize": rng.choice(["none", "2Mi"]),
            },
            "ssd": ssd,
        },
        "placement": {"gpuModel": rng.choice(["MI355X", "MI355X", "MI300X", "MI350X"])},
        "resources": {"cpu": rng.choice(["auto", 48])},
    }
    if i % 10 == 9:  # invalid on purpose: an operator-owned flag and layer_first
        spec["engine"]["extraArgs"] = ["--tp-size=2"]
        spec["hiCache"]["memLayout"] = "layer_first"
    return {
        "apiVersion": "hicache.sglang.ai/v1alpha1",
        "kind": "SGLangHiCache",
        "metadata": {"name": f"shc-{i}", "namespace": "bench"},
        "spec": spec,
    }


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = OperatorConfig(policy=AdminPolicy(allowed_host_path_prefixes=["/mnt"]))
    rng = random.Random(args.seed)
    crs = [varied_cr(rng, i) for i in range(args.count)]
    plan(crs[0], config)  # import-time caches warm; not counted
    times: dict[str, list[float]] = {"embedded": [], "standalone": [], "rejected": []}
    all_ms: list[float] = []
    objects = 0
    for cr in crs:
        start = time.perf_counter_ns()
        try:
            p = plan(cr, config)
            kind: str = p.spec.l3.mode
            objects += len(p.objects)
        except SpecError:
            kind = "rejected"
        ms = (time.perf_counter_ns() - start) / 1e6
        times[kind].append(ms)
        all_ms.append(ms)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mean_ms = statistics.fmean(all_ms)
    for label, values in times.items():
        if values:
            print(
                f"{label:<11} n={len(values):<5} mean {statistics.fmean(values):.3f} ms  "
                f"p99 {p99(values):.3f} ms"
            )
    emb, sta = statistics.fmean(times["embedded"]), statistics.fmean(times["standalone"])
    planned = times["embedded"] + times["standalone"]
    rej_ratio = (
        statistics.fmean(times["rejected"]) / statistics.fmean(planned)
        if times["rejected"]
        else 0.0
    )
    print(f"standalone/embedded mean ratio: {sta / emb:.2f}x")
    print(f"rejected/planned mean ratio:    {rej_ratio:.2f}x")
    print(f"mean vs 1 s reconcile budget:   {mean_ms / RECONCILE_BUDGET_MS:.4f}")
    print(
        f"{len(planned)} planned ({objects} objects), {len(times['rejected'])} rejected; "
        f"peak RSS {peak_rss_mb:.1f} MiB; python {sys.version.split()[0]}"
    )
    print(
        json.dumps(
            {
                "count": len(all_ms),
                "mean_ms": round(mean_ms, 4),
                "p99_ms": round(p99(all_ms), 4),
                "peak_rss_mb": round(peak_rss_mb, 1),
                "standalone_over_embedded": round(sta / emb, 3),
                "rejected_over_planned": round(rej_ratio, 3),
                "budget_share": round(mean_ms / RECONCILE_BUDGET_MS, 5),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
