"""Storage-hit TTFT from our SSD tier against cold, after an engine restart and after a
whole-pod restart, on the strict pod tier's CPU pod (issue 24's served benchmark).

The pod is the planner's for ``examples/cpu/tiny-llama-ssd.yaml`` (embedded L3: a mori DRAM
tier, here 16 MiB, in front of our SSD tier on the pod's claim) with what ``make bench-l3-hit``
measures with: page 32 and SGLang's CPU attention computing only the uncached tail
(``CPU_ENGINE_TAIL_ATTENTION``; on CPU, torch_native recomputes the cached prefix's attention,
which a GPU backend does not). Everything else as the pod tier runs it: the launcher, real
SGLang 0.5.23 and mori 1.2.4, uid 10001 under RuntimeDefault seccomp in a cpuset and memory
cgroup, hugepages; the SSD claim is a directory on this machine's disk that outlives the pod.

1. ``2 * BENCH_SSD_SERVED_PROMPTS + 2`` distinct prompts of ``BENCH_SSD_SERVED_TOKENS`` (1,536)
   tokens written (their pages reach the SSD: counted, as the pod tests wait), filler text
   pushing them out of the device pool. They are more than the DRAM tier holds (mori gives each
   16 KiB page a 64 KiB unit), and the restarts below empty the embedded DRAM tier anyway:
   every hit is counted from the SSD.
2. The engine container is killed and restarted (the embedded DRAM tier goes with it; the SSD
   tier stays). A warm-up of other text and one stored prompt (a new engine's first read).
   Then, interleaved, a never-seen prompt of the same length (cold) and a stored one (which
   must come whole from storage, counted).
3. The whole pod is deleted (every container) and started again on the same claim; the same
   warm-up, then the other half of the stored prompts, interleaved with cold ones.

Per phase: median TTFT cold and from SSD (one generated token), their ratio, the storage tokens
of every hit (``meta_info``), and the pages read per L3 tier (``/metrics``: from the SSD, none
from DRAM). The default prefetch policy (``timeout``), as users get it. Last line: one JSON
object (``ssd_hit_vs_cold`` per phase). Needs root. Run: ``make bench-ssd-served``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from l3_hit import TAIL_ENV, generate, make_prompts  # noqa: E402
from pod.harness import Client, admin_config, load_cr, plan_pod, start_pod  # noqa: E402
from pod.image import served_files  # noqa: E402
from pod.node import Node  # noqa: E402
from pod.test_restart_pod import restart_engine  # noqa: E402
from pod.test_serving_pod import fillers  # noqa: E402
from pod.test_ssd_pod import metric, metric_at_least, wait_ssd_caught_up  # noqa: E402

PAGE = 32
TOKENS = int(os.environ.get("BENCH_SSD_SERVED_TOKENS", "1536"))
PER_PHASE = int(os.environ.get("BENCH_SSD_SERVED_PROMPTS", "3"))


def phase(port: int, c: Client, warm: str, stored: list[str], fresh: list[str],
          name: str) -> dict[str, Any]:
    """A warm-up (other text, then one stored prompt), then cold and SSD hits interleaved."""
    page = c.metrics()
    before = {t: metric(page, "hicache_umbp_l3_read_pages_total", tier=t)
              for t in ("dram", "ssd")}
    generate(port, "another warm up " * 40, f"{name}-warm-text")
    _, meta, _ = generate(port, warm, f"{name}-warm-stored")
    warm_storage = (meta.get("cached_tokens_details") or {}).get("storage", 0)
    cold, hit, storage, full = [], [], [], []
    for i, (text, other) in enumerate(zip(stored, fresh, strict=True)):
        lat, meta, _ = generate(port, other, f"{name}-cold-{i}")
        assert meta["cached_tokens"] == 0, meta  # never seen: recomputed whole
        cold.append(lat)
        lat, meta, _ = generate(port, text, f"{name}-hit-{i}")
        hit.append(lat)
        storage.append((meta.get("cached_tokens_details") or {}).get("storage", 0))
        full.append(meta["prompt_tokens"] // PAGE * PAGE)
    want = before["ssd"] + (warm_storage + sum(storage)) // PAGE
    page = metric_at_least(c, "hicache_umbp_l3_read_pages_total", want, tier="ssd")
    after = {t: metric(page, "hicache_umbp_l3_read_pages_total", tier=t) for t in ("dram", "ssd")}
    c_med, h_med = statistics.median(cold), statistics.median(hit)
    out = {"ttft_cold_s": round(c_med, 4), "ttft_ssd_hit_s": round(h_med, 4),
           "ssd_hit_vs_cold": round(h_med / c_med, 3), "ttft_cold_all_s": [round(x, 4) for x
                                                                             in cold],
           "ttft_ssd_hit_all_s": [round(x, 4) for x in hit], "storage_tokens": storage,
           "full_page_tokens": full, "whole_from_storage": storage == full,
           "warm_up_storage_tokens": warm_storage,
           "l3_pages_read": {t: int(after[t] - before[t]) for t in after}}
    print(f"{name}: cold {c_med:.3f} s, from SSD {h_med:.3f} s (x{out['ssd_hit_vs_cold']}); "
          f"storage tokens {storage} of {full} (warm-up's: {warm_storage}); L3 pages "
          f"read {out['l3_pages_read']}", flush=True)
    return out


def run() -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="hicache-bench-ssd-served-", dir="/var/tmp"))
    try:
        models, image = served_files(root)
        texts = make_prompts(models / "tiny-llama", 4 * PER_PHASE + 2, (TOKENS,))[TOKENS]
        stored, fresh = texts[: 2 * PER_PHASE + 2], texts[2 * PER_PHASE + 2:]
        (root / "node").mkdir()
        with Node(root / "node") as node:
            cr = load_cr("cpu/tiny-llama-ssd.yaml", **{"spec.engine.pageSize": PAGE,
                                                        "spec.l3.dram.capacity": "16Mi"})
            cr["spec"]["engine"]["env"].append({"name": TAIL_ENV, "value": "1"})
            planned = plan_pod(cr, admin_config(node))
            port = int(cr["spec"]["engine"]["port"])
            c = Client(port)
            claims = {"tiny-models": models}
            pod = start_pod(planned, node, image, root / "pods", claims)
            try:
                pod.wait_ready(600)
                generate(port, "warm up " * 40, "warmup-0")
                for i, text in enumerate(stored):
                    generate(port, text, f"write-{i}")
                for text in fillers(4):  # write_back: out of the device pool, then to L3
                    generate(port, text, "push-out")
                wait_ssd_caught_up(c, 300)
                restart_engine(pod)
                engine = phase(port, c, stored[0], stored[2: 2 + PER_PHASE], fresh[:PER_PHASE],
                               "after an engine restart")
            finally:
                pod.close()
            again = start_pod(planned, node, image, root / "again", claims)
            try:
                again.wait_ready(600)
                whole = phase(port, c, stored[1], stored[2 + PER_PHASE:], fresh[PER_PHASE:],
                              "after a whole-pod restart")
            finally:
                again.close()
        return {"engine_restart": engine, "pod_restart": whole, "prompt_tokens": TOKENS,
                "prompts_per_phase": PER_PHASE,
                "ssd_hit_vs_cold": {"engine_restart": engine["ssd_hit_vs_cold"],
                                    "pod_restart": whole["ssd_hit_vs_cold"]}}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench/ssd_served.py runs a pod like the pod tier: it needs root")
    print(json.dumps(run()), flush=True)


if __name__ == "__main__":
    main()
