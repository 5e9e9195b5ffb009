"""Our UMBP backend against SGLang's built-in ``mori`` backend and SGLang's ``file`` backend, in
the one engine environment (SGLang 0.5.23 + real amd-mori 1.2.4 in one Python), side by side.

The stack is the one SGLang's scheduler builds (``tests/backend/sglang_stack.py``: the plain-KV
strategy's ``HostPoolGroup`` + ``HybridCacheController``, host pool sized by ``--hicache-size``
1 GB, ``page_first`` with the kernel I/O backend), one per model kind: MHA (4 layers x 8 KV
heads x 128, bf16: two 512 KiB parts per 64-token page) and MLA (14 layers x 576, bf16: one
1,032,192 B part per page). One host pool per kind serves every backend: each round attaches a
backend to the same controller (``attach_storage_backend``, SGLang's runtime attach, as its
admin API does), three times backs up 128 fresh pages through the backup thread (one 128-page
batch), times ``batch_exists`` on the 128 keys, prefetches them back through the hit query and
the prefetch-io thread and checks every byte, then detaches. Rounds interleave the backends
(rotating which goes first), so all see the same machine noise; a round's figure is the median
of its three repetitions, a ratio the median of the per-round ratios.

Backends: ours (``--hicache-storage-backend dynamic`` with ``hicache_umbp.sglang.adapter``,
embedded mori DRAM of 1 GiB), the built-in (``mori``: ``umbp_store.UMBPStore``, extra-config
``dram_capacity_bytes`` 1 GiB, ``ssd_enabled`` false), ``file`` (``HiCacheFile`` under a temp
dir on the machine's disk).

Then the SSD case: a DRAM tier of 32 MiB, smaller than the 128 MiB working set, and an SSD
tier of 512 MiB (ours: ``umbp_ssd_*``, DRAM in front of the embedded SSD node; built-in:
``ssd_enabled``, ``ssd_storage_dir``, ``ssd_capacity_bytes``; file: its directory), the pages
backed up as 8 radix nodes of 16 pages. Reported per backend: the pages acknowledged, the
bytes of the files really on disk under its directory (and their allocated blocks) after a
flush, and the pages read back byte-exact when every node is prefetched.

Last, the v1 calls alone (``bench/backends_v1.py``): both backends built as the controller's
attach builds them on the same pool, ``batch_set_v1`` / ``batch_get_v1`` / ``batch_exists``
called directly, without the controller's threads (whose own work is as long as the backend's
and swings by milliseconds on a shared machine).

Run: ``make bench-backends``. Last line: one JSON object with ``vs_builtin_set``,
``vs_builtin_get``, ``vs_file_set``, ``vs_file_get`` (through the controller) and
``vs_builtin_set_v1``, ``vs_builtin_get_v1`` (the v1 calls alone), each the smaller of MHA and
MLA, ``ssd_bytes_ours``, ``ssd_bytes_builtin`` and the per-kind numbers.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before sglang is imported
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import backends_v1  # noqa: E402
from backend_setup import (  # noqa: E402
    PAGE,
    PAGES,
    SSD_DRAM,
    backend_config,
    device_pool,
    per_kind_summary,
)

from backend import sglang_env as E  # noqa: E402
from backend import sglang_stack as S  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
REPS = 3  # backups and prefetches per attach, fresh pages each
EXISTS_REPEATS = 20
NODES = 8  # the SSD case backs up 8 radix nodes of 16 pages
BACKENDS = ("ours", "builtin", "file")


def disk_bytes(root: Path) -> tuple[int, int]:
    """(sum of file sizes, allocated bytes) of every file under ``root``."""
    files = [p.stat() for p in root.rglob("*") if p.is_file()] if root.exists() else []
    return sum(s.st_size for s in files), sum(s.st_blocks * 512 for s in files)


def attached(stack: S.Stack, name: str, workdir: Path, ssd: bool) -> None:
    backend, extra = backend_config(name, workdir, ssd)
    ctrl = stack.ctrl
    ctrl.attach_storage_backend(storage_backend=backend, prefetch_threshold=PAGE,
                                model_name=E.MODEL_NAME, storage_backend_extra_config=extra,
                                host_pools=ctrl.mem_pool_host.entries)


def detach(stack: S.Stack, workdir: Path) -> None:
    stack.ctrl.detach_storage_backend()
    shutil.rmtree(workdir / "ssd", ignore_errors=True)


def fresh_pages(stack: S.Stack, seed: int) -> tuple[list[int], list[str], Any, list[bytes]]:
    rng = random.Random(seed)
    tokens = [rng.randrange(32000) for _ in range(PAGES * PAGE)]
    idx = stack.host.alloc(len(tokens))
    E.fill_pages(stack.host, idx, seed)
    return tokens, S.page_hashes(tokens, PAGE), idx, E.page_bytes(stack.host, idx)


def run_round(stack: S.Stack, name: str, workdir: Path, seed: int) -> dict[str, Any]:
    """Attach one backend; REPS times: back up PAGES fresh pages (one batch), time
    ``batch_exists`` on their keys, prefetch them back, check every byte; detach. Returns the
    median of the repetitions."""
    attached(stack, name, workdir, ssd=False)
    ctrl, host = stack.ctrl, stack.host
    reps: list[dict[str, float]] = []
    try:
        for rep in range(REPS):
            tokens, hashes, idx, want = fresh_pages(stack, seed * REPS + rep)
            nbytes = sum(len(p) for p in want)
            t, c = time.perf_counter(), time.process_time()
            backed = S.backup(ctrl, idx, tokens, hashes)
            set_s, set_cpu = time.perf_counter() - t, time.process_time() - c
            host.free(idx)
            E.wipe_pages(host, idx)
            exists_s = float("inf")
            for _ in range(EXISTS_REPEATS):
                t = time.perf_counter()
                present = ctrl.storage_backend.batch_exists(hashes)
                exists_s = min(exists_s, time.perf_counter() - t)
            t, c = time.perf_counter(), time.process_time()
            got = S.prefetch(ctrl, f"{name}-{seed}-{rep}", tokens)
            get_s, get_cpu = time.perf_counter() - t, time.process_time() - c
            assert got.host_indices is not None, f"{name}: prefetch found nothing"
            exact = sum(a == b for a, b in zip(E.page_bytes(host, got.host_indices), want,
                                               strict=True))
            host.free(got.host_indices)
            if (backed, present, got.tokens, exact) != (len(tokens), PAGES, len(tokens), PAGES):
                raise AssertionError(f"{name}: backed up {backed} tokens, {present} pages "
                                     f"exist, prefetched {got.tokens} tokens, {exact} pages "
                                     "byte-exact")
            reps.append({"set_gbps": nbytes / set_s / 1e9, "get_gbps": nbytes / get_s / 1e9,
                         "exists_us_per_key": exists_s / PAGES * 1e6,
                         "set_cpu_ms": set_cpu * 1e3, "get_cpu_ms": get_cpu * 1e3})
        return {k: median([r[k] for r in reps]) for k in reps[0]}
    finally:
        detach(stack, workdir)


def ssd_round(stack: S.Stack, name: str, workdir: Path, seed: int) -> dict[str, Any]:
    """DRAM smaller than the working set, an SSD tier behind it: back up NODES radix nodes of
    PAGES // NODES pages each (each node one backup, as the tree backs up requests), flush,
    measure the files on disk, then prefetch every node (continuing the chain from the node
    before it, as a prefetch after a matched prefix does) and count the pages read back
    byte-exact."""
    attached(stack, name, workdir, ssd=True)
    ctrl, host = stack.ctrl, stack.host
    per = PAGES // NODES
    try:
        tokens, hashes, idx, want = fresh_pages(stack, seed)
        nbytes = sum(len(p) for p in want)
        t = time.perf_counter()
        backed = 0
        for n in range(NODES):
            pages = slice(n * per * PAGE, (n + 1) * per * PAGE)
            backed += S.backup(ctrl, idx[pages], tokens[pages], hashes[n * per:(n + 1) * per])
        set_s = time.perf_counter() - t
        host.free(idx)
        E.wipe_pages(host, idx)
        flush = getattr(ctrl.storage_backend, "flush", None)
        if flush is not None:
            flush()  # ours: drain the write-back ring to SSD
        on_disk = disk_bytes(workdir / "ssd")
        exact, fetched = 0, 0
        t = time.perf_counter()
        for n in range(NODES):
            node = tokens[n * per * PAGE:(n + 1) * per * PAGE]
            last = hashes[n * per - 1] if n else None
            assert S.page_hashes(node, PAGE, last) == hashes[n * per:(n + 1) * per]
            got = S.prefetch(ctrl, f"{name}-ssd-{seed}-{n}", node, last_hash=last)
            if got.host_indices is not None:
                fetched += got.tokens
                have = E.page_bytes(host, got.host_indices)[: got.tokens // PAGE]
                exact += sum(a == b for a, b in zip(have, want[n * per:], strict=False))
                host.free(got.host_indices)
        get_s = time.perf_counter() - t
        return {"backed_pages": backed // PAGE, "exact_pages": exact, "disk_bytes": on_disk[0],
                "disk_alloc_bytes": on_disk[1], "set_gbps": nbytes / set_s / 1e9,
                "get_gbps": fetched * nbytes / (PAGES * PAGE) / get_s / 1e9}
    finally:
        detach(stack, workdir)


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_kind(kind: str, model: Path, workdir: Path) -> dict[str, Any]:
    # The pool comes from our allocator under our published config (mori's host allocator,
    # 4 KiB pages, prefaulted): every backend then reads and writes the same resident pages.
    _, pool_extra = backend_config("ours", workdir, ssd=False)
    stack = S.scheduler_stack(model, kind, pool_extra | {"host_prefault": True}, attach=False,
                              page=PAGE, device_pool=device_pool(kind))
    page_bytes = stack.host.get_size_per_token() * PAGE
    print(f"[{kind}] host pool {stack.host.size // PAGE} pages of {page_bytes} B "
          f"({stack.host.layout}, {type(stack.host.allocator).__name__}); {PAGES} pages "
          f"per round, {ROUNDS} rounds + 1 warm-up, interleaved", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKENDS}
    for r in range(ROUNDS + 1):
        order = BACKENDS[r % 3:] + BACKENDS[:r % 3]  # each backend first, second and last
        for name in order:
            res = run_round(stack, name, workdir, seed=1000 * r + BACKENDS.index(name))
            if r:  # round 0 warms the code paths and the pool's pages
                runs[name].append(res)
    ssd = {name: ssd_round(stack, name, workdir, seed=99_000 + i)
           for i, name in enumerate(BACKENDS)}

    v1 = backends_v1.compare(stack, workdir)
    stack.close()
    med = {b: {k: median([r[k] for r in runs[b]]) for k in runs[b][0]} for b in BACKENDS}

    def ratio(key: str, other: str) -> float:
        return median([o[key] / t[key] for o, t in zip(runs["ours"], runs[other], strict=True)])

    out = {
        "page_bytes": page_bytes, "median": med,
        "vs_builtin_set": ratio("set_gbps", "builtin"),
        "vs_builtin_get": ratio("get_gbps", "builtin"),
        "vs_file_set": ratio("set_gbps", "file"), "vs_file_get": ratio("get_gbps", "file"),
        "exists_speed_vs_builtin": 1 / ratio("exists_us_per_key", "builtin"),
        # CPU time of the whole process per batch (theirs / ours): the work each backend makes
        # the process do, which other jobs on the machine inflate far less than wall time.
        "cpu_vs_builtin_set": 1 / ratio("set_cpu_ms", "builtin"),
        "cpu_vs_builtin_get": 1 / ratio("get_cpu_ms", "builtin"),
        "ssd": ssd, "v1": v1,
    }
    for b in BACKENDS:
        m = med[b]
        print(f"[{kind}] {b:8s} backup {m['set_gbps']:6.2f} GB/s ({m['set_cpu_ms']:5.1f} CPU ms)"
              f"  prefetch {m['get_gbps']:6.2f} GB/s ({m['get_cpu_ms']:5.1f} CPU ms)  "
              f"batch_exists {m['exists_us_per_key']:6.2f} us/key", flush=True)
    print(f"[{kind}] ours vs built-in: backup {out['vs_builtin_set']:.2f}x, prefetch "
          f"{out['vs_builtin_get']:.2f}x, batch_exists {out['exists_speed_vs_builtin']:.2f}x; "
          f"ours vs file: backup {out['vs_file_set']:.1f}x, prefetch {out['vs_file_get']:.1f}x; "
          f"CPU per batch, built-in / ours: backup {out['cpu_vs_builtin_set']:.2f}x, prefetch "
          f"{out['cpu_vs_builtin_get']:.2f}x", flush=True)
    for b, m in v1["median"].items():
        print(f"[{kind}] v1 calls alone, {b:8s}: batch_set_v1 {m['set_gbps']:6.2f} GB/s "
              f"({m['set_cpu_ms']:5.2f} CPU ms)  batch_get_v1 {m['get_gbps']:6.2f} GB/s "
              f"({m['get_cpu_ms']:5.2f} CPU ms)  batch_exists {m['exists_us_per_key']:5.2f} us/key",
              flush=True)
    print(f"[{kind}] v1 calls alone, ours vs built-in: set {v1['vs_builtin_set_v1']:.3f}x, get "
          f"{v1['vs_builtin_get_v1']:.3f}x, exists {v1['exists_speed_vs_builtin']:.3f}x; "
          f"process CPU per call, built-in / ours: set {v1['cpu_vs_builtin_set_v1']:.3f}x, get "
          f"{v1['cpu_vs_builtin_get_v1']:.3f}x ({backends_v1.SET_REPS} / {backends_v1.GET_REPS} "
          "interleaved repetitions)", flush=True)
    for b in BACKENDS:
        s = ssd[b]
        print(f"[{kind}] DRAM {SSD_DRAM >> 20} MiB + SSD, {PAGES} pages ({PAGES * page_bytes >> 20}"
              f" MiB in {NODES} backups): {b:8s} acknowledged {s['backed_pages']:3d}, on disk "
              f"{s['disk_bytes']:>11,d} B ({s['disk_alloc_bytes']:,d} allocated), read back "
              f"byte-exact {s['exact_pages']:3d}; backup {s['set_gbps']:.2f} GB/s, prefetch "
              f"{s['get_gbps']:.2f} GB/s", flush=True)
    return out


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="hicache-backends-", dir=os.environ.get("TMPDIR")))
    try:
        model = E.tiny_model_dir(workdir)
        kinds = {kind: bench_kind(kind, model, workdir) for kind in ("mha", "mla")}
        result: dict[str, Any] = {
            key: round(min(k[key] for k in kinds.values()), 3)
            for key in ("vs_builtin_set", "vs_builtin_get", "vs_file_set", "vs_file_get")
        }
        result |= {key: round(min(k["v1"][key] for k in kinds.values()), 3)
                   for key in ("vs_builtin_set_v1", "vs_builtin_get_v1", "cpu_vs_builtin_set_v1",
                               "cpu_vs_builtin_get_v1")}
        result |= {key: round(min(k[key] for k in kinds.values()), 3)
                   for key in ("cpu_vs_builtin_set", "cpu_vs_builtin_get")}
        result |= {
            "ssd_bytes_ours": sum(k["ssd"]["ours"]["disk_bytes"] for k in kinds.values()),
            "ssd_bytes_builtin": sum(k["ssd"]["builtin"]["disk_bytes"] for k in kinds.values()),
            "ssd_bytes_file": sum(k["ssd"]["file"]["disk_bytes"] for k in kinds.values()),
            "ssd_exact_pages": {b: {kind: k["ssd"][b]["exact_pages"] for kind, k in kinds.items()}
                                for b in BACKENDS},
            "per_kind": per_kind_summary(kinds, "median", drop=("ssd", "v1")),
            "pages_per_round": PAGES, "rounds": ROUNDS, "page_tokens": PAGE,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
