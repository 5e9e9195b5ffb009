"""The served pod: time to Ready, and TTFT cold vs host hit vs storage hit after a restart.

Runs the standalone CPU example (examples/cpu/tiny-llama-standalone.yaml) as the pod tier does
(tests/pod: the planner's pod, the launcher, real SGLang 0.5.23 over real mori 1.2.4, the pod's
own probes, real hugepages and memory cgroups), then, in one run:

* time to Ready of the engine container, split into launcher checks (the launcher's own step
  timings from its report), host pool allocation + prefault (the host-allocator hook's record),
  model load (SGLang's ``Engine startup timings``: load_weight) and the rest of the server start
  (interpreter and SGLang imports, tokenizer and scheduler processes, HTTP server);
* TTFT of the same long prompts cold, on a host hit (pushed out of the device pool) and on a
  storage hit after the engine container was restarted (the L3 sidecars outlive it): one
  generated token, so the latency is the time to the first token; medians over the prompts.
  Before the restart it waits, by counting, until every token SGLang backed up to L2 reached L3
  (``Client.wait_backups_in_l3``); after it every prompt must be served from storage, whole
  (``storage_hit_prompts`` of ``prompts``, ``storage_hit_tokens`` of ``storage_tokens_possible``).

``time_to_ready_s`` splits into the launcher's checks, the host pool allocation + prefault, the
page-hash extension (SGLang's JIT-built C++ page hash, built and loaded before the engine is
ready; hicache_umbp.sglang.page_hash), the model load and the rest of the server start.

Last line: one JSON object (``storage_hit_ttft_vs_cold``, ``host_hit_ttft_vs_cold``,
``storage_hit_tokens``, ``time_to_ready_s`` and its parts). Needs root (like the pod tier).
Run: ``make bench-pod``; ``BENCH_POD_RUNS=N`` runs it N times in a row (one JSON line each, and
a last line counting the runs that served every prompt from storage).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pod.harness import Client, admin_config, load_cr, plan_pod, start_pod  # noqa: E402
from pod.image import served_files  # noqa: E402
from pod.node import Node  # noqa: E402

PROMPTS = 3
WORDS = 250  # ~3.5k tokens with the tiny model's tokenizer, under its 4096-token context


def prompt(i: int) -> str:
    return " ".join(f"bench{i} word{j} cache" for j in range(WORDS))


def ttft(c: Client, text: str) -> tuple[float, dict]:  # type: ignore[type-arg]
    out = c.generate(text, max_new_tokens=1)
    return out["client_latency_s"], out["meta_info"]


def ready_split(pod) -> dict[str, float]:  # type: ignore[no-untyped-def]
    engine = pod.container("engine")
    started = next(e.t for e in reversed(pod.events_of("engine", "Started")))
    total = engine.ready_at - started
    run_dir = pod.volume_host_path("hicache-run")
    report = json.loads((run_dir / "launch-report.json").read_text())
    launcher = sum(report.get("timings_s", {}).values())
    pools = [json.loads(p.read_text()) for p in run_dir.glob("host-pool-rank*.json")]
    pool = max((p.get("alloc_s", 0.0) for p in pools), default=0.0)
    page_hash = max((p.get("page_hash_s", 0.0) for p in pools), default=0.0)
    log = engine.log_text(400000)
    starts = log.rsplit("==== start", 1)[-1]
    m = re.search(r"load_weight=([0-9.]+)", starts)
    load = float(m.group(1)) if m else 0.0
    return {"time_to_ready_s": round(total, 2), "launcher_checks_s": round(launcher, 3),
            "pool_alloc_prefault_s": round(pool, 3), "page_hash_s": round(page_hash, 3),
            "model_load_s": round(load, 3),
            "server_start_s": round(total - launcher - pool - page_hash - load, 2)}


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench/pod.py runs a pod like the pod tier: it needs root")
    runs = int(os.environ.get("BENCH_POD_RUNS", "1"))
    results = [run_once() for _ in range(runs)]
    if runs > 1:
        whole = sum(r["storage_hit_prompts"] == r["prompts"] for r in results)
        print(json.dumps({"runs": runs, "runs_all_prompts_from_storage": whole,
                          "storage_hit_tokens": [r["storage_hit_tokens"] for r in results]}))


def run_once() -> dict:  # type: ignore[type-arg]
    root = Path(tempfile.mkdtemp(prefix="hicache-bench-pod-", dir="/var/tmp"))
    models, image = served_files(root)
    (root / "node").mkdir()
    with Node(root / "node") as node:
        planned = plan_pod(load_cr("cpu/tiny-llama-standalone.yaml"), admin_config(node))
        port = planned.cr["spec"]["engine"]["port"]
        page = int(planned.cr["spec"]["engine"]["pageSize"])
        pod = start_pod(planned, node, image, root / "pods", {"tiny-models": models})
        try:
            pod.wait_ready(600)
            first = ready_split(pod)
            c = Client(port)
            cold, host = [], []
            texts = [prompt(i) for i in range(PROMPTS)]
            for t in texts:
                cold.append(ttft(c, t)[0])
            for t in texts:  # each prompt pushes the others out of the 4096-token device pool
                lat, meta = ttft(c, t)
                details = meta.get("cached_tokens_details") or {}
                if details.get("host", 0) > 0:
                    host.append(lat)
            l2_tokens, l3_tokens = c.wait_backups_in_l3()
            engine = pod.container("engine")
            restarts = engine.restarts
            engine.kill(grace_s=30)
            pod.wait(lambda: engine.restarts > restarts, 120, "engine restarted")
            pod.wait_ready(600)
            second = ready_split(pod)
            storage, storage_tokens, possible = [], 0, 0
            for t in texts:
                lat, meta = ttft(c, t)
                details = meta.get("cached_tokens_details") or {}
                possible += meta["prompt_tokens"] // page * page
                if details.get("storage", 0) > 0:
                    storage.append(lat)
                    storage_tokens += details["storage"]
        finally:
            pod.close()
    med = {k: statistics.median(v) if v else None
           for k, v in (("cold", cold), ("host", host), ("storage", storage))}
    print(f"time to Ready (first start): {first}")
    print(f"time to Ready (after the restart): {second}")
    print(f"TTFT median over {PROMPTS} prompts: cold {med['cold']:.3f} s, host hit "
          f"{med['host'] or float('nan'):.3f} s ({len(host)} hits), storage hit after restart "
          f"{med['storage'] or float('nan'):.3f} s ({len(storage)} hits, {storage_tokens} tokens)")
    def ratio(tier: str) -> float | None:
        hit, cold_s = med[tier], med["cold"]
        return round(hit / cold_s, 3) if hit and cold_s else None

    result = {
        "storage_hit_ttft_vs_cold": ratio("storage"),
        "host_hit_ttft_vs_cold": ratio("host"),
        "storage_hit_tokens": storage_tokens,
        "storage_tokens_possible": possible,
        "storage_hit_prompts": len(storage),
        "prompts": PROMPTS,
        "l2_l3_backup_tokens_before_restart": [l2_tokens, l3_tokens],
        "ttft_cold_s": round(med["cold"], 4),
        "ttft_host_hit_s": round(med["host"], 4) if med["host"] else None,
        "ttft_storage_hit_s": round(med["storage"], 4) if med["storage"] else None,
        **first,
        "restart": second,
    }
    print(json.dumps(result), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
