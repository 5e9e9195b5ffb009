"""The SSD tier against the volume's own O_DIRECT bandwidth, mori's SSD node and SGLang's
``file`` backend, side by side in one run, on one directory, through SGLang's controller.

The stack is the one SGLang's scheduler builds (``tests/backend/sglang_stack.py``: the plain-KV
strategy's ``HostPoolGroup`` + ``HybridCacheController``, a 2 GB host pool from our allocator,
``page_first``), for two page shapes: ``mha`` (4 layers x 8 KV heads x 128, bf16: two 512 KiB
parts per 64-token page) and ``r1`` (DeepSeek-R1's MLA page: 61 layers x 576, bf16, 64 tokens:
one 4,497,408 B part). Each round, for each backend in a rotating order: attach it with an
SSD-only tier on the volume directory, back up 128 fresh pages (one SGLang storage batch) through
the backup thread, flush, drop the page cache of every file under the directory
(``posix_fadvise(DONTNEED)``: reads come from the disk), prefetch them back through the hit query
and the io thread, check every byte, detach. Beside it, in the same round and directory, the
volume's own bandwidth: 128 pages of the same size written and read with ``O_DIRECT``
``pwritev``/``preadv`` from a pool of threads (8, the tier's own; the best of 4, 8 and 16
beside it).

Backends: ``ours`` (``umbp_ssd_engine=hicache``, SSD only, on a new drive: its first fill),
``ours-steady`` (the same, on a drive whose data file was written once end to end before: the
tier after its first fill, which is where it spends its life), ``ours+dram`` (a 32 MiB DRAM
tier in front, smaller than the working set: the shape the examples use), ``mori`` (mori
1.2.4's embedded SSD node as the project configures it, posix I/O as under RuntimeDefault
seccomp), ``file`` (SGLang's ``HiCacheFile``). Writes are compared with the volume's own
writes in the same state: a first fill with the first write into a freshly preallocated file
(the filesystem converts each unwritten extent then), the tier after its first fill with
blocks written before.

Then several drives: ours striped over 1, 2 and 4 block devices of their own, each capped at
``BENCH_DRIVE_MBPS`` (200) MB/s by the kernel's blkio throttle (``bench/throttled_drives.py``:
loop devices over tmpfs, ext4, root only), against one such drive's own O_DIRECT bandwidth
(``drives``: ``read_scaling`` = ours on N drives / N x one drive). Without root: directories on
the one disk (page counts per directory, no regression).

Beside the controller's path, the store SGLang calls alone: ``batch_set_v1`` / ``batch_get_v1``
on the attached ``ours-steady`` and ``mori`` backends, as the backup and prefetch-io threads
call them (``*_v1`` ratios).

Run: ``make bench-ssd`` (``BENCH_ROUNDS``, default 3). Last line: one JSON object with
``read_vs_disk``, ``write_vs_disk``, ``write_vs_disk_first_fill``, ``read_vs_disk_v1``,
``write_vs_disk_v1``, ``read_vs_mori_ssd``, ``read_vs_file`` (each the smaller of the two page
shapes, median of the rounds), ``pages_exact`` / ``pages_expected``, the per-shape numbers and
the drives.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before sglang is imported
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from backend_setup import device_pool, per_kind_summary  # noqa: E402
from hicache_umbp.contract.names import dynamic_extra_config  # noqa: E402
from hicache_umbp.disk.layout import DATA_FILE  # noqa: E402
from throttled_drives import throttled_drives, unavailable  # noqa: E402

from backend import sglang_env as E  # noqa: E402
from backend import sglang_stack as S  # noqa: E402

MIB = 1 << 20
PAGE = 64
PAGES = 128  # one SGLang storage batch
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BACKENDS = ("ours", "ours-steady", "ours+dram", "mori", "file")
V1_CALLS = ("ours-steady", "mori")
#: Each throttled drive's bandwidth, read and write (bench/throttled_drives.py).
DRIVE_BPS = int(os.environ.get("BENCH_DRIVE_MBPS", "200")) * 1_000_000
DRIVE_COUNTS = (1, 2, 4)
#: The reference runs at the tier's own queue depth (umbp_ssd_io_threads' default); the best
#: over a few depths is printed beside it.
IO_THREADS = 8
DISK_THREADS = (4, 8, 16)


def backend_config(name: str, ssd_dir: Path, capacity: int,
                   drives: list[Path] | None = None) -> tuple[str, dict[str, Any]]:
    if name == "file":
        return "file", {"file_storage_path": str(ssd_dir)}
    drives = drives or [ssd_dir]
    for d in drives:
        d.mkdir(parents=True, exist_ok=True)
    tiers: dict[str, Any] = dict(
        umbp_ssd_enabled=True, umbp_ssd_dir=",".join(map(str, drives)),
        umbp_ssd_bytes=capacity, umbp_dram_bytes=32 * MIB if name == "ours+dram" else 0,
        umbp_ssd_engine="mori" if name == "mori" else "hicache")
    if name == "mori":
        tiers["umbp_ssd_io_backend"] = "posix"
    if name == "ours+dram":
        tiers["umbp_tier_queue_bytes"] = 1 << 30
    return "dynamic", dynamic_extra_config(umbp_namespace="bench", host_hugepage_bytes=0,
                                           **tiers)


def drop_page_cache(root: Path) -> None:
    """Flush and drop every file under ``root`` from the page cache: reads come from the disk."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_bandwidth(directory: Path, page_bytes: int, parts: int,
                   depths: tuple[int, ...] = DISK_THREADS) -> dict[str, float]:
    """The volume's own O_DIRECT bandwidth for the same bytes in the same transfers: PAGES x
    ``parts`` blocks of one page part (rounded up to 4 KiB). ``fill_write_gbps``: the first
    write into a freshly preallocated file at IO_THREADS threads (a new drive's slots: the
    filesystem converts each unwritten extent on its first write); then ``write_gbps`` (the
    same blocks written again, as a tier's slots are after its first fill) and ``read_gbps``
    at IO_THREADS, and the best over ``depths`` threads (``best_*``). Synced before each read, as
    the tier's pages are before theirs (the disk is not still taking the writes)."""
    size = -(-(page_bytes // parts) // 4096) * 4096
    blocks = PAGES * parts
    path = directory / "odirect.bin"
    buf = mmap.mmap(-1, size)
    buf.write(os.urandom(4096) * (size // 4096))
    best = {"write_gbps": 0.0, "read_gbps": 0.0, "best_write_gbps": 0.0, "best_read_gbps": 0.0}
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)

    def gbps(call: Any, threads: int) -> float:
        with ThreadPoolExecutor(threads) as pool:
            t = time.perf_counter()
            list(pool.map(lambda i: call(fd, [buf], i * size), range(blocks)))
            dt = time.perf_counter() - t
        if call is os.pwritev:
            os.fsync(fd)
        return PAGES * page_bytes / dt / 1e9

    try:
        os.posix_fallocate(fd, 0, size * blocks)
        best["fill_write_gbps"] = gbps(os.pwritev, IO_THREADS)
        for threads in depths:
            for key, call in (("write_gbps", os.pwritev), ("read_gbps", os.preadv)):
                rate = gbps(call, threads)
                best["best_" + key] = max(best["best_" + key], rate)
                if threads == IO_THREADS:
                    best[key] = rate
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return best


def prewrite(directory: Path) -> int:
    """Write every tier data file under ``directory`` once, end to end, with O_DIRECT, and
    sync: the drive's slots are then what they are after the tier's first fill (written
    extents). The index is not touched: the tier still holds no page. Bytes written."""
    chunk = mmap.mmap(-1, 8 * MIB)
    total = 0
    for path in directory.rglob(DATA_FILE):
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        try:
            size = os.fstat(fd).st_size
            for off in range(0, size, len(chunk)):
                total += os.pwritev(fd, [memoryview(chunk)[: min(len(chunk), size - off)]],
                                    off)
            os.fsync(fd)
        finally:
            os.close(fd)
    return total


def fresh_pages(stack: S.Stack, seed: int) -> tuple[list[int], list[str], Any, list[bytes]]:
    rng = random.Random(seed)
    tokens = [rng.randrange(32000) for _ in range(PAGES * PAGE)]
    idx = stack.host.alloc(len(tokens))
    E.fill_pages(stack.host, idx, seed)
    return tokens, S.page_hashes(tokens, PAGE), idx, E.page_bytes(stack.host, idx)


def run_backend(stack: S.Stack, name: str, ssd_dir: Path, seed: int, capacity: int,
                drives: list[Path] | None = None, v1: bool = False) -> dict[str, Any]:
    """One backend: attach, back up PAGES pages, flush, drop caches, prefetch, check bytes.
    ``ours-steady`` first attaches once and writes its drives' data files end to end
    (:func:`prewrite`), then measures: the tier after its first fill."""
    backend, extra = backend_config(name, ssd_dir, capacity, drives)
    ctrl, host = stack.ctrl, stack.host
    dirs = drives or [ssd_dir]

    def attach() -> None:
        ctrl.attach_storage_backend(storage_backend=backend, prefetch_threshold=PAGE,
                                    model_name=E.MODEL_NAME, storage_backend_extra_config=extra,
                                    host_pools=ctrl.mem_pool_host.entries)

    attach()
    try:
        if name == "ours-steady":
            ctrl.detach_storage_backend()
            for d in dirs:
                if not prewrite(d):  # else "steady" would time a first fill after all
                    raise RuntimeError(f"no tier data file under {d} to write end to end")
            attach()
        tokens, hashes, idx, want = fresh_pages(stack, seed)
        nbytes = sum(len(p) for p in want)
        t = time.perf_counter()
        backed = S.backup(ctrl, idx, tokens, hashes)
        flush = getattr(ctrl.storage_backend, "flush", None)
        if flush is not None:
            flush()
        set_s = time.perf_counter() - t
        host.free(idx)
        E.wipe_pages(host, idx)
        for d in dirs:
            drop_page_cache(d)
        t = time.perf_counter()
        got = S.prefetch(ctrl, f"{name}-{seed}", tokens)
        get_s = time.perf_counter() - t
        exact = 0
        if got.host_indices is not None:
            have = E.page_bytes(host, got.host_indices)[: got.tokens // PAGE]
            exact = sum(a == b for a, b in zip(have, want, strict=False))
            host.free(got.host_indices)
        calls = _v1_calls(stack, name, dirs, seed) if v1 else {}
        stats = _disk_stats(ctrl.storage_backend)
        return {"write_gbps": nbytes / set_s / 1e9, "read_gbps": nbytes / get_s / 1e9,
                "backed_pages": backed // PAGE, "read_pages": got.tokens // PAGE,
                "exact_pages": exact, "direct_ios": stats.get("direct_ios", 0),
                "buffered_ios": stats.get("buffered_ios", 0),
                "pages_per_dir": [d.index.counts()[0] for d in _drives(ctrl.storage_backend)]
                if drives else [], **calls}
    finally:
        ctrl.detach_storage_backend()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()


def _v1_calls(stack: S.Stack, name: str, dirs: list[Path], seed: int) -> dict[str, float]:
    """The store SGLang calls, without the controller's threads: ``batch_set_v1`` of PAGES
    fresh pages, then (page cache dropped) ``batch_get_v1`` of them, as the backup and the
    prefetch-io threads call it; every page checked."""
    host, backend = stack.host, stack.ctrl.storage_backend
    rng = random.Random(seed + 1)
    keys = [f"{rng.getrandbits(256):064x}" for _ in range(PAGES)]
    idx = host.alloc(PAGES * PAGE)
    try:
        E.fill_pages(host, idx, seed + 1)
        want = E.page_bytes(host, idx)
        nbytes = sum(len(p) for p in want)
        t = time.perf_counter()
        ok = backend.batch_set_v1(keys, idx)
        set_s = time.perf_counter() - t
        assert all(ok), f"{name}: batch_set_v1 stored {sum(ok)} of {PAGES}"
        E.wipe_pages(host, idx)
        for d in dirs:
            drop_page_cache(d)
        t = time.perf_counter()
        ok = backend.batch_get_v1(keys, idx)
        get_s = time.perf_counter() - t
        assert all(ok) and E.page_bytes(host, idx) == want, f"{name}: v1 read-back differs"
        return {"write_gbps_v1": nbytes / set_s / 1e9, "read_gbps_v1": nbytes / get_s / 1e9}
    finally:
        host.free(idx)


def _stores(backend: Any) -> list[Any]:
    return list(getattr(backend, "stores", []) or [])


def _drives(backend: Any) -> list[Any]:
    for store in _stores(backend):
        client = store.client
        disk = getattr(client, "ssd", client)
        if hasattr(disk, "drives"):
            return list(disk.drives)
    return []


def _disk_stats(backend: Any) -> dict[str, int]:
    for store in _stores(backend):
        return dict(store.stats().disk)
    return {}


def bench_kind(kind: str, model: Path, workdir: Path) -> dict[str, Any]:
    _, pool_extra = backend_config("ours", workdir / "pool-config", 1 << 30)
    layout = "mla" if kind == "r1" else "mha"
    stack = S.scheduler_stack(model, layout, pool_extra | {"host_prefault": True}, attach=False,
                              page=PAGE, device_pool=device_pool(layout, mla_layers=61),
                              hicache_size_gb=2)
    page_bytes = stack.host.get_size_per_token() * PAGE
    # Room for 4 batches: a 16-way set cannot take more than 16 pages of one batch, and a
    # tier sized to one batch would sometimes get 17 in a set.
    capacity = 4 * PAGES * page_bytes + (64 << 20)
    ssd_dir = workdir / "volume"
    ssd_dir.mkdir(exist_ok=True)
    print(f"[{kind}] page {page_bytes} B ({stack.host.layout}), {PAGES} pages "
          f"({PAGES * page_bytes / 1e6:.0f} MB) per backup; {ROUNDS} rounds + 1 warm-up; "
          f"volume {ssd_dir}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in (*BACKENDS, "disk")}
    for r in range(ROUNDS + 1):
        order = BACKENDS[r % len(BACKENDS):] + BACKENDS[:r % len(BACKENDS)]
        for name in order:
            if name == "ours":  # the volume's own bandwidth right before ours, same directory
                disk = disk_bandwidth(ssd_dir, page_bytes, 1 if kind == "r1" else 2)
            res = run_backend(stack, name, ssd_dir, 1000 * r + BACKENDS.index(name), capacity,
                              v1=name in V1_CALLS)
            if r:
                runs[name].append(res)
        if r:
            runs["disk"].append(disk)
    drives = drive_scaling(stack, kind, page_bytes, capacity)
    stack.close()

    def ratio(key: str, a: str, b: str, ref: str | None = None) -> float:
        return float(statistics.median(x[key] / y[ref or key]
                                       for x, y in zip(runs[a], runs[b], strict=True)))

    med = {b: {k: statistics.median(r[k] for r in runs[b])
               for k in runs[b][0] if isinstance(runs[b][0][k], float)} for b in runs}
    out = {
        "page_bytes": page_bytes,
        "read_vs_disk": ratio("read_gbps", "ours", "disk"),
        "write_vs_disk": ratio("write_gbps", "ours-steady", "disk"),
        "write_vs_disk_first_fill": ratio("write_gbps", "ours", "disk", "fill_write_gbps"),
        "read_vs_disk_v1": ratio("read_gbps_v1", "ours-steady", "disk", "read_gbps"),
        "write_vs_disk_v1": ratio("write_gbps_v1", "ours-steady", "disk", "write_gbps"),
        "read_vs_disk_with_dram": ratio("read_gbps", "ours+dram", "disk"),
        "read_vs_mori_ssd": ratio("read_gbps", "ours", "mori"),
        "write_vs_mori_ssd": ratio("write_gbps", "ours", "mori"),
        "read_vs_file": ratio("read_gbps", "ours", "file"),
        "write_vs_file": ratio("write_gbps", "ours", "file"),
        "pages_exact": sum(r["exact_pages"] for b in ("ours", "ours-steady", "ours+dram")
                           for r in runs[b]),
        "pages_expected": PAGES * 3 * ROUNDS,
        "exact_by_backend": {b: sum(r["exact_pages"] for r in runs[b]) for b in BACKENDS},
        "direct_ios": sum(r["direct_ios"] for b in ("ours", "ours-steady") for r in runs[b]),
        "buffered_ios": sum(r["buffered_ios"] for b in ("ours", "ours-steady")
                            for r in runs[b]),
        "drives": drives,
        "median_gbps": med,
    }
    for b, m in med.items():
        print(f"[{kind}] {b:11s} write {m['write_gbps']:6.2f} GB/s  read {m['read_gbps']:6.2f}"
              " GB/s" + (f"  byte-exact {out['exact_by_backend'][b]}/{PAGES * ROUNDS}"
                         if b in BACKENDS else f"  (O_DIRECT, {IO_THREADS} threads; first "
                         f"fill of a new file: write {m['fill_write_gbps']:.2f}; best of "
                         f"{DISK_THREADS}: write {m['best_write_gbps']:.2f}, read "
                         f"{m['best_read_gbps']:.2f})")
              + (f"; v1 calls alone: write {m['write_gbps_v1']:.2f}, read "
                 f"{m['read_gbps_v1']:.2f} GB/s" if "write_gbps_v1" in m else ""), flush=True)
    print(f"[{kind}] ours vs disk: read {out['read_vs_disk']:.2f}x, write "
          f"{out['write_vs_disk']:.2f}x after the first fill, "
          f"{out['write_vs_disk_first_fill']:.2f}x filling a new drive (the v1 calls alone: "
          f"read {out['read_vs_disk_v1']:.2f}x, write {out['write_vs_disk_v1']:.2f}x; with a "
          f"DRAM tier in front: read {out['read_vs_disk_with_dram']:.2f}x); vs mori's SSD node: "
          f"read {out['read_vs_mori_ssd']:.1f}x, write {out['write_vs_mori_ssd']:.1f}x; vs file: "
          f"read {out['read_vs_file']:.2f}x, write {out['write_vs_file']:.2f}x; O_DIRECT "
          f"transfers {out['direct_ios']}, through the page cache {out['buffered_ios']}",
          flush=True)
    return out


def drive_scaling(stack: S.Stack, kind: str, page_bytes: int,
                  capacity: int) -> dict[str, Any]:
    """Ours striped over 1, 2 and 4 drives, each a block device of its own capped at DRIVE_BPS
    (bench/throttled_drives.py), against one such drive's own O_DIRECT bandwidth: ``scaling``
    is ours on N drives over N times one drive. Where throttled drives cannot be made (not
    root), directories on the one shared disk: page counts per directory and no regression."""
    parts = 1 if kind == "r1" else 2
    why = unavailable()
    if why:
        print(f"[{kind}] drives: no throttled drives ({why}); directories on one disk",
              flush=True)
        base = Path(tempfile.mkdtemp(prefix="drives-", dir=os.environ.get("BENCH_SSD_DIR",
                                                                         "/var/tmp")))
        try:
            shared = {str(n): _per_drives(stack, [base / f"nvme{i}" for i in range(n)] if n > 1
                                          else None, base, 77_000 + n, capacity)
                      for n in DRIVE_COUNTS}
        finally:
            shutil.rmtree(base, ignore_errors=True)
        for n in DRIVE_COUNTS:
            d = shared[str(n)]
            print(f"[{kind}]   ours on {n} directories: read {d['read_gbps']:.3f} GB/s, write "
                  f"{d['write_gbps']:.3f} GB/s, byte-exact {d['exact_pages']}/{PAGES}, page "
                  f"parts per directory {d['pages_per_dir']}", flush=True)
        return shared
    size = capacity + (512 * MIB)  # ext4's own metadata besides the tier's files
    with throttled_drives(max(DRIVE_COUNTS), DRIVE_BPS, size) as mounts:
        one = disk_bandwidth(mounts[0], page_bytes, parts, (IO_THREADS,))
        out: dict[str, Any] = {"drive_mbps": DRIVE_BPS // 1_000_000,
                               "one_drive_gbps": {k: round(one[k], 3)
                                                  for k in ("read_gbps", "write_gbps")}}
        for n in DRIVE_COUNTS:
            res = _per_drives(stack, [m / "tier" for m in mounts[:n]], mounts[0],
                              88_000 + n, capacity)
            res["read_scaling"] = round(res["read_gbps"] / (n * one["read_gbps"]), 3)
            res["write_scaling"] = round(res["write_gbps"] / (n * one["write_gbps"]), 3)
            out[str(n)] = res
    print(f"[{kind}] drives of {DRIVE_BPS / 1e6:.0f} MB/s each (one alone, O_DIRECT: read "
          f"{one['read_gbps']:.3f}, write {one['write_gbps']:.3f} GB/s):", flush=True)
    for n in DRIVE_COUNTS:
        d = out[str(n)]
        print(f"[{kind}]   ours on {n}: read {d['read_gbps']:.3f} GB/s "
              f"({d['read_scaling']:.2f} of {n} drives), write {d['write_gbps']:.3f} GB/s "
              f"({d['write_scaling']:.2f}), byte-exact {d['exact_pages']}/{PAGES}, page parts "
              f"per drive {d['pages_per_dir']}", flush=True)
    return out


def _per_drives(stack: S.Stack, drives: list[Path] | None, ssd_dir: Path, seed: int,
                capacity: int) -> dict[str, Any]:
    res = run_backend(stack, "ours", ssd_dir, seed, capacity, drives=drives)
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
            if k in ("read_gbps", "write_gbps", "exact_pages", "pages_per_dir")}


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    base = os.environ.get("BENCH_SSD_DIR", "/var/tmp")
    workdir = Path(tempfile.mkdtemp(prefix="hicache-bench-ssd-", dir=base))
    try:
        model = E.tiny_model_dir(workdir)
        kinds = {kind: bench_kind(kind, model, workdir) for kind in ("mha", "r1")}
        keys = ("read_vs_disk", "write_vs_disk", "write_vs_disk_first_fill",
                "read_vs_disk_v1", "write_vs_disk_v1",
                "read_vs_disk_with_dram", "read_vs_mori_ssd",
                "write_vs_mori_ssd", "read_vs_file", "write_vs_file")
        result: dict[str, Any] = {k: round(min(v[k] for v in kinds.values()), 3) for k in keys}
        result |= {
            "pages_exact": sum(v["pages_exact"] for v in kinds.values()),
            "pages_expected": sum(v["pages_expected"] for v in kinds.values()),
            "per_kind": per_kind_summary(kinds, "median_gbps"),
            "rounds": ROUNDS, "pages_per_batch": PAGES, "volume": base,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
