"""Where the time of one L3 hit goes; storage-hit TTFT vs cold for 1k, 2k and 3.5k-token prompts.

The pod tier's strict pod (tests/pod: the planner's pod, the launcher, real SGLang 0.5.23 over real
mori 1.2.4 in standalone sidecars, real hugepages and memory cgroups), with the model the issue
was seen with (hicache_cpu_engine.tiny_model kind ``llama3``: 3 layers, 2 KV heads) and page 32.
In one run:

1. a warm-up request, then ``BENCH_L3_PER_LENGTH`` distinct prompts of each length, written to
   L3 (SGLang's write-back: pushed out of the device pool, then backed up);
2. wait, by counting, until every token backed up to L2 reached L3, restart the engine container
   (the L3 sidecars outlive it), a warm-up request of other text;
3. per prompt, interleaved: a never-seen prompt of the same length (cold: recomputed whole,
   ``cached_tokens`` 0), then the stored prompt, which must come from storage
   (``cached_tokens_details.storage``, counted). One generated token: the latency is the TTFT.

The engine runs with the test-only measurement harness (``hicache_cpu_engine.l3trace``, SGLang's
plugin hooks; ``CPU_ENGINE_L3_TRACE``), whose time line per request id splits every
storage hit into: tokenizer -> scheduler, the hit query (our ``batch_exists``) and its rank sync,
the wait for the scheduler to allocate the host bounce, the transfer thread (our ``batch_get_v1``),
the progress acks, the scheduler's admission polls, the insert and L2 -> L1 load, the forward pass
of the uncached tail, and the way back to the client. Medians per component over the prompts.

Last line: one JSON object (``ratio_by_tokens``: storage-hit TTFT / cold TTFT, median per length;
``breakdown_ms``; counts). Needs root. Run: ``make bench-l3-hit``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pod.harness import Client, admin_config, load_cr, plan_pod, start_pod  # noqa: E402
from pod.image import served_files  # noqa: E402
from pod.node import Node  # noqa: E402

LENGTHS = (256, 512, 1024, 2048, 3500)
PAGE = 32
TRACE_ENV = "CPU_ENGINE_L3_TRACE"
#: SGLang's CPU torch_native extend computes the cached prefix's attention again
#: (hicache_cpu_engine.tail_attention); BENCH_L3_TAIL_ATTENTION=0 measures it as it is.
TAIL_ENV = "CPU_ENGINE_TAIL_ATTENTION"
RIDLESS = ("batch_exists", "batch_get_v1", "load_l2_l1", "start_loading", "prepare_transfers",
           "h2d_copy")


def make_prompts(model_dir: Path, per_length: int,
                 lengths: tuple[int, ...] = LENGTHS) -> dict[int, list[str]]:
    """Distinct prompts of each length in tokens (no shared first page between any two)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out: dict[int, list[str]] = {}
    for length in lengths:
        out[length] = []
        for i in range(per_length):
            words: list[str] = []
            j = 0
            while len(tok(" ".join(words))["input_ids"]) < length:
                words.append(f"q{length}x{i} word{j} cache")
                j += 1
            out[length].append(" ".join(words))
    return out


def generate(port: int, text: str, rid: str) -> tuple[float, dict[str, Any], float]:
    """(client TTFT s, meta_info, monotonic send time) of a one-token request."""
    body = json.dumps({"text": text, "rid": rid, "sampling_params": {
        "max_new_tokens": 1, "temperature": 0}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body,
                                 {"content-type": "application/json"})
    sent = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.load(r)
    return time.monotonic() - sent, out["meta_info"], sent


def read_trace(trace_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Trace events by request id (``forward.*`` events under each rid of the batch)."""
    by_rid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in trace_dir.glob("l3trace-*.jsonl"):
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            rids = ev.get("rids") or ev.get("rid")
            for rid in rids if isinstance(rids, list) else [rids]:
                if isinstance(rid, str):
                    by_rid[rid].append(ev)
    for evs in by_rid.values():
        evs.sort(key=lambda e: e["t"])
    return by_rid


def _first(evs: list[dict[str, Any]], name: str, **match: Any) -> float | None:
    for e in evs:
        if e["ev"] == name and all(e.get(k) == v for k, v in match.items()):
            return float(e["t"])
    return None


def _last(evs: list[dict[str, Any]], name: str, **match: Any) -> float | None:
    ts = [e["t"] for e in evs if e["ev"] == name and all(e.get(k) == v for k, v in match.items())]
    return float(ts[-1]) if ts else None


def _inside(pid_thread: list[dict[str, Any]], name: str, start: float, end: float) -> float:
    """Seconds spent in ``name`` spans (events without a rid: our adapter) within [start, end]."""
    total, opened = 0.0, None
    for e in pid_thread:
        if not start <= e["t"] <= end:
            continue
        if e["ev"] == f"{name}.start":
            opened = e["t"]
        elif e["ev"] == f"{name}.end" and opened is not None:
            total += e["t"] - opened
            opened = None
    return total


def split_hit(evs: list[dict[str, Any]], adapter: list[dict[str, Any]], sent: float,
              ttft: float) -> dict[str, float]:
    """One storage hit's time line as ms per component (see the module docstring)."""
    t = {
        "queued": _first(evs, "queued.start"),
        "submit": _first(evs, "submit.start"),
        "q0": _first(evs, "hit_query.start"), "q1": _first(evs, "hit_query.end"),
        "s1": _first(evs, "hit_sync.end"),
        "alloc": _first(evs, "host_alloc.start"),
        "x0": _first(evs, "transfer.start"), "x1": _first(evs, "transfer.end"),
        "ack": _last(evs, "ack", completed_req=True),
        "done": _first(evs, "poll", done=True),
        "f0": _first(evs, "forward.start"), "f1": _first(evs, "forward.end"),
        "r1": _first(evs, "batch_result.end"),
    }
    missing = [k for k, v in t.items() if v is None]
    if missing:
        raise AssertionError(f"trace lacks {missing} for a storage hit: {evs[:5]}")
    v: dict[str, float] = {k: float(x) for k, x in t.items() if x is not None}
    ms = lambda a, b: round((v[b] - v[a]) * 1000, 2)  # noqa: E731
    return {
        "client_to_scheduler": round((v["queued"] - sent) * 1000, 2),
        "scheduler_to_prefetch_submit": ms("queued", "submit"),
        "prefetch_thread_wakeup": ms("submit", "q0"),
        "hit_query": ms("q0", "q1"),
        "hit_query_in_our_batch_exists": round(
            _inside(adapter, "batch_exists", v["q0"], v["q1"]) * 1000, 2),
        "hit_rank_sync": ms("q1", "s1"),
        "scheduler_allocates_host_bounce": ms("s1", "alloc"),
        "transfer_thread_wakeup": ms("alloc", "x0"),
        "transfer": ms("x0", "x1"),
        "transfer_in_our_batch_get_v1": round(
            _inside(adapter, "batch_get_v1", v["x0"], v["x1"]) * 1000, 2),
        "acks_reduced": ms("x1", "ack"),
        "scheduler_sees_done": ms("ack", "done") if v["done"] >= v["ack"] else 0.0,
        "insert_load_schedule": ms("done", "f0"),
        "l2_to_l1_load_until_forward_end": round(
            (_inside(adapter, "load_l2_l1", v["done"], v["f1"])
             + _inside(adapter, "start_loading", v["done"], v["f1"])) * 1000, 2),
        "l2_to_l1_of_which_h2d_copies": round(
            _inside(adapter, "h2d_copy", v["done"], v["f1"]) * 1000, 2),
        "l2_to_l1_of_which_prepare": round(
            _inside(adapter, "prepare_transfers", v["done"], v["f1"]) * 1000, 2),
        "forward_uncached_tail": ms("f0", "f1"),
        "result_and_back_to_client": round((sent + ttft - v["f1"]) * 1000, 2),
        "total_ttft": round(ttft * 1000, 2),
        "admission_polls_not_ready": float(
            sum(1 for e in evs if e["ev"] == "poll" and not e["done"])),
    }


def split_cold(evs: list[dict[str, Any]], sent: float, ttft: float) -> dict[str, float]:
    q, f0, f1 = (_first(evs, n) for n in ("queued.start", "forward.start", "forward.end"))
    if q is None or f0 is None or f1 is None:
        raise AssertionError(f"trace lacks the cold request's events: {evs[:5]}")
    return {"client_to_scheduler": round((q - sent) * 1000, 2),
            "queue_and_prefetch_decline": round((f0 - q) * 1000, 2),
            "forward_whole_prompt": round((f1 - f0) * 1000, 2),
            "result_and_back_to_client": round((sent + ttft - f1) * 1000, 2),
            "total_ttft": round(ttft * 1000, 2)}


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]} if rows else {}


def run() -> dict[str, Any]:
    from hicache_operator.builders.statefulset import REPORT_DIR

    per_length = int(os.environ.get("BENCH_L3_PER_LENGTH", "3"))
    root = Path(tempfile.mkdtemp(prefix="hicache-bench-l3-", dir="/var/tmp"))
    models, image = served_files(root, "llama3")
    # The first half of each length is written before the restart and served from storage
    # after it; the second half is never seen before it and is the cold baseline there,
    # interleaved with the hits so both see the same machine (2 shared cores, other jobs).
    both = make_prompts(models / "tiny-llama", 2 * per_length)
    prompts = {n: texts[:per_length] for n, texts in both.items()}
    fresh = {n: texts[per_length:] for n, texts in both.items()}
    (root / "node").mkdir()
    cold: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    hits: dict[int, list[tuple[str, float, float, dict[str, Any]]]] = defaultdict(list)
    with Node(root / "node") as node:
        cr = load_cr("cpu/tiny-llama-standalone.yaml", **{"spec.engine.pageSize": PAGE})
        cr["spec"]["engine"]["env"].append(
            {"name": TAIL_ENV, "value": os.environ.get("BENCH_L3_TAIL_ATTENTION", "1")})
        planned = plan_pod(cr, admin_config(node))
        tpl = planned.statefulset["spec"]["template"]["spec"]
        engine_spec = next(c for c in tpl["containers"] if c["name"] == "engine")
        engine_spec.setdefault("env", []).append(
            {"name": TRACE_ENV, "value": f"{REPORT_DIR}/l3trace"})
        port = int(cr["spec"]["engine"]["port"])
        pod = start_pod(planned, node, image, root / "pods", {"tiny-models": models})
        try:
            pod.wait_ready(600)
            c = Client(port)
            generate(port, "warm up " * 40, "warmup-0")
            for length, texts in prompts.items():
                for i, text in enumerate(texts):
                    generate(port, text, f"write-{length}-{i}")
            # write_back: a prompt reaches L2 (then L3) when pushed out of the 4096-token
            # device pool; other text of the longest length pushes the last ones out.
            generate(port, " ".join(f"push{j} out text" for j in range(260)), "push-out")
            c.wait_backups_in_l3()
            engine = pod.container("engine")
            before = engine.restarts
            engine.kill(grace_s=30)
            pod.wait(lambda: engine.restarts > before, 120, "engine restarted")
            pod.wait_ready(600)
            generate(port, "another warm up " * 40, "warmup-1")
            # A fresh process runs its first prompts of each length slowly (allocator, kernel
            # set-up): one unmeasured prompt of every length first, so cold is not inflated.
            for length in prompts:
                generate(port, fresh[length][0].replace("word", "warm"), f"warmup-{length}")
            for length, texts in prompts.items():
                for i, text in enumerate(texts):
                    rid = f"cold-{length}-{i}"
                    lat, meta, sent = generate(port, fresh[length][i], rid)
                    assert meta["cached_tokens"] == 0, meta  # never seen: recomputed whole
                    cold[length].append((rid, lat, sent))
                    rid = f"hit-{length}-{i}"
                    lat, meta, sent = generate(port, text, rid)
                    hits[length].append((rid, lat, sent, meta))
            trace = read_trace(pod.volume_host_path("hicache-run") / "l3trace")
            adapter = sorted((e for f in (pod.volume_host_path("hicache-run") / "l3trace")
                              .glob("l3trace-*.jsonl") for e in map(json.loads,
                                                                     f.read_text().splitlines())
                              if e["ev"].startswith(RIDLESS)), key=lambda e: e["t"])
        finally:
            pod.close()
    keep = os.environ.get("BENCH_L3_KEEP")  # raw time lines, to read again (see load_kept)
    if keep:
        Path(keep).write_text(json.dumps({"cold": cold, "hits": hits, "trace": trace,
                                          "adapter": adapter}))
    shutil.rmtree(root, ignore_errors=True)
    return summarize(cold, hits, trace, adapter)


def load_kept(path: str) -> dict[str, Any]:
    """``summarize`` of a run kept with ``BENCH_L3_KEEP`` (``python bench/l3_hit.py FILE``)."""
    raw = json.loads(Path(path).read_text())
    as_int = lambda d: {int(k): [tuple(x) for x in v] for k, v in d.items()}  # noqa: E731
    return summarize(as_int(raw["cold"]), as_int(raw["hits"]), raw["trace"], raw["adapter"])


def summarize(cold: dict[int, list[tuple[str, float, float]]],
              hits: dict[int, list[tuple[str, float, float, dict[str, Any]]]],
              trace: dict[str, list[dict[str, Any]]],
              adapter: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {"ratio_by_tokens": {}, "ttft_cold_s": {}, "ttft_storage_hit_s": {},
                              "storage_tokens": {}, "prompt_tokens": {}, "breakdown_ms": {},
                              "cold_breakdown_ms": {}}
    all_from_storage = True
    for length in sorted(hits):  # LENGTHS, or those of a kept run
        c_lat = statistics.median(lat for _, lat, _ in cold[length])
        h_lat = statistics.median(lat for _, lat, _, _ in hits[length])
        storage = [(m.get("cached_tokens_details") or {}).get("storage", 0)
                   for *_, m in hits[length]]
        full = [m["prompt_tokens"] // PAGE * PAGE for *_, m in hits[length]]
        all_from_storage &= storage == full
        result["ratio_by_tokens"][length] = round(h_lat / c_lat, 3)
        result["ttft_cold_s"][length] = round(c_lat, 4)
        result["ttft_storage_hit_s"][length] = round(h_lat, 4)
        result["storage_tokens"][length] = storage
        result["prompt_tokens"][length] = [m["prompt_tokens"] for *_, m in hits[length]]
        # A hit whose prefetch did not run whole (the policy's deadline, a miss) has no full
        # time line: it shows in storage_tokens, not in the breakdown.
        result["breakdown_ms"][length] = medians(
            [split_hit(trace[rid], adapter, sent, lat) for rid, lat, sent, m in hits[length]
             if (m.get("cached_tokens_details") or {}).get("storage")])
        result["cold_breakdown_ms"][length] = medians(
            [split_cold(trace[rid], sent, lat) for rid, lat, sent in cold[length]])
    result["all_prompts_whole_from_storage"] = all_from_storage
    return result


def main() -> None:
    if len(sys.argv) == 2:
        result = load_kept(sys.argv[1])
    elif os.geteuid() != 0:
        sys.exit("bench/l3_hit.py runs a pod like the pod tier: it needs root")
    else:
        result = run()
    for length in result["ratio_by_tokens"]:
        print(f"{length} tokens: cold {result['ttft_cold_s'][length]:.3f} s, storage hit "
              f"{result['ttft_storage_hit_s'][length]:.3f} s "
              f"(x{result['ratio_by_tokens'][length]}), storage tokens "
              f"{result['storage_tokens'][length]}")
        for k, v in result["breakdown_ms"][length].items():
            print(f"    {k:36s} {v:9.2f}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
