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
``pwritev``/``preadv`` from a pool of threads (the best of 4, 8 and 16 threads).

Backends: ``ours`` (``umbp_ssd_engine=hicache``, SSD only), ``ours+dram`` (a 32 MiB DRAM tier in
front, smaller than the working set: the shape the examples use), ``mori`` (mori 1.2.4's
embedded SSD node as the project configures it, posix I/O as under RuntimeDefault seccomp),
``file`` (SGLang's ``HiCacheFile``). Then several drives: ours over 1, 2 and 4 directories (on
this machine one disk: the point is no regression, and the page counts per directory).

Beside the controller's path, the store SGLang calls alone: ``batch_set_v1`` / ``batch_get_v1``
on the attached backend, as the backup and prefetch-io threads call them (``*_v1`` ratios).

Run: ``make bench-ssd`` (``BENCH_ROUNDS``, default 3). Last line: one JSON object with
``read_vs_disk``, ``write_vs_disk``, ``read_vs_disk_v1``, ``write_vs_disk_v1``,
``read_vs_mori_ssd``, ``read_vs_file`` (each the smaller
of the two page shapes, median of the rounds), ``pages_exact`` / ``pages_expected`` and the
per-shape numbers.
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

from backend import sglang_env as E  # noqa: E402
from backend import sglang_stack as S  # noqa: E402

MIB = 1 << 20
PAGE = 64
PAGES = 128  # one SGLang storage batch
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BACKENDS = ("ours", "ours+dram", "mori", "file")
#: The reference runs at the tier's own queue depth (umbp_ssd_io_threads' default); the best
#: over a few depths is printed beside it.
IO_THREADS = 8
DISK_THREADS = (4, 8, 16)


def backend_config(name: str, ssd_dir: Path, capacity: int,
                   dirs: int = 1) -> tuple[str, dict[str, Any]]:
    if name == "file":
        return "file", {"file_storage_path": str(ssd_dir)}
    drives = [ssd_dir / f"nvme{i}" for i in range(dirs)] if dirs > 1 else [ssd_dir]
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


def disk_bandwidth(directory: Path, page_bytes: int, parts: int) -> dict[str, float]:
    """The volume's own O_DIRECT write and read bandwidth for the same bytes in the same
    transfers: PAGES x ``parts`` blocks of one page part (rounded up to 4 KiB), at IO_THREADS
    threads (``write_gbps``, ``read_gbps``) and the best over DISK_THREADS (``best_*``)."""
    size = -(-(page_bytes // parts) // 4096) * 4096
    blocks = PAGES * parts
    path = directory / "odirect.bin"
    buf = mmap.mmap(-1, size)
    buf.write(os.urandom(4096) * (size // 4096))
    best = {"write_gbps": 0.0, "read_gbps": 0.0, "best_write_gbps": 0.0, "best_read_gbps": 0.0}
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size * blocks)
        for threads in DISK_THREADS:
            for key, call in (("write_gbps", os.pwritev), ("read_gbps", os.preadv)):
                with ThreadPoolExecutor(threads) as pool:
                    t = time.perf_counter()
                    list(pool.map(lambda i, c=call: c(fd, [buf], i * size), range(blocks)))
                    dt = time.perf_counter() - t
                gbps = PAGES * page_bytes / dt / 1e9
                best["best_" + key] = max(best["best_" + key], gbps)
                if threads == IO_THREADS:
                    best[key] = gbps
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return best


def fresh_pages(stack: S.Stack, seed: int) -> tuple[list[int], list[str], Any, list[bytes]]:
    rng = random.Random(seed)
    tokens = [rng.randrange(32000) for _ in range(PAGES * PAGE)]
    idx = stack.host.alloc(len(tokens))
    E.fill_pages(stack.host, idx, seed)
    return tokens, S.page_hashes(tokens, PAGE), idx, E.page_bytes(stack.host, idx)


def run_backend(stack: S.Stack, name: str, ssd_dir: Path, seed: int, capacity: int,
                dirs: int = 1) -> dict[str, Any]:
    """One backend: attach, back up PAGES pages, flush, drop caches, prefetch, check bytes."""
    backend, extra = backend_config(name, ssd_dir, capacity, dirs)
    ctrl, host = stack.ctrl, stack.host
    ctrl.attach_storage_backend(storage_backend=backend, prefetch_threshold=PAGE,
                                model_name=E.MODEL_NAME, storage_backend_extra_config=extra,
                                host_pools=ctrl.mem_pool_host.entries)
    try:
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
        drop_page_cache(ssd_dir)
        t = time.perf_counter()
        got = S.prefetch(ctrl, f"{name}-{seed}", tokens)
        get_s = time.perf_counter() - t
        exact = 0
        if got.host_indices is not None:
            have = E.page_bytes(host, got.host_indices)[: got.tokens // PAGE]
            exact = sum(a == b for a, b in zip(have, want, strict=False))
            host.free(got.host_indices)
        v1 = _v1_calls(stack, name, ssd_dir, seed) if name in ("ours", "mori") else {}
        stats = _disk_stats(ctrl.storage_backend)
        per_dir = [sum(f.stat().st_blocks for f in (ssd_dir / f"nvme{i}").rglob("*")
                       if f.is_file()) for i in range(dirs)] if dirs > 1 else []
        return {"write_gbps": nbytes / set_s / 1e9, "read_gbps": nbytes / get_s / 1e9,
                "backed_pages": backed // PAGE, "read_pages": got.tokens // PAGE,
                "exact_pages": exact, "direct_ios": stats.get("direct_ios", 0),
                "buffered_ios": stats.get("buffered_ios", 0),
                "pages_per_dir": [d.index.counts()[0] for d in _drives(ctrl.storage_backend)]
                if per_dir else [], **v1}
    finally:
        ctrl.detach_storage_backend()
        shutil.rmtree(ssd_dir, ignore_errors=True)
        ssd_dir.mkdir()


def _v1_calls(stack: S.Stack, name: str, ssd_dir: Path, seed: int) -> dict[str, float]:
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
        drop_page_cache(ssd_dir)
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
            res = run_backend(stack, name, ssd_dir, 1000 * r + BACKENDS.index(name), capacity)
            if r:
                runs[name].append(res)
        if r:
            runs["disk"].append(disk)
    drives = {n: run_backend(stack, "ours", ssd_dir, 77_000 + n, capacity, dirs=n)
              for n in (1, 2, 4)}
    stack.close()

    def ratio(key: str, a: str, b: str) -> float:
        return statistics.median(x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True))

    med = {b: {k: statistics.median(r[k] for r in runs[b])
               for k in runs[b][0] if isinstance(runs[b][0][k], float)} for b in runs}
    out = {
        "page_bytes": page_bytes,
        "read_vs_disk": ratio("read_gbps", "ours", "disk"),
        "write_vs_disk": ratio("write_gbps", "ours", "disk"),
        "read_vs_disk_v1": statistics.median(
            x["read_gbps_v1"] / y["read_gbps"] for x, y in zip(runs["ours"], runs["disk"],
                                                                strict=True)),
        "write_vs_disk_v1": statistics.median(
            x["write_gbps_v1"] / y["write_gbps"] for x, y in zip(runs["ours"], runs["disk"],
                                                                 strict=True)),
        "read_vs_disk_with_dram": ratio("read_gbps", "ours+dram", "disk"),
        "read_vs_mori_ssd": ratio("read_gbps", "ours", "mori"),
        "write_vs_mori_ssd": ratio("write_gbps", "ours", "mori"),
        "read_vs_file": ratio("read_gbps", "ours", "file"),
        "write_vs_file": ratio("write_gbps", "ours", "file"),
        "pages_exact": sum(r["exact_pages"] for b in ("ours", "ours+dram") for r in runs[b]),
        "pages_expected": PAGES * 2 * ROUNDS,
        "exact_by_backend": {b: sum(r["exact_pages"] for r in runs[b]) for b in BACKENDS},
        "direct_ios": sum(r["direct_ios"] for r in runs["ours"]),
        "buffered_ios": sum(r["buffered_ios"] for r in runs["ours"]),
        "drives": {n: {"read_gbps": d["read_gbps"], "write_gbps": d["write_gbps"],
                       "exact_pages": d["exact_pages"], "pages_per_dir": d["pages_per_dir"]}
                   for n, d in drives.items()},
        "median_gbps": med,
    }
    for b, m in med.items():
        print(f"[{kind}] {b:9s} write {m['write_gbps']:6.2f} GB/s  read {m['read_gbps']:6.2f} GB/s"
              + (f"  byte-exact {out['exact_by_backend'][b]}/{PAGES * ROUNDS}"
                 if b in BACKENDS else f"  (O_DIRECT, {IO_THREADS} threads; best of "
                 f"{DISK_THREADS}: write {m['best_write_gbps']:.2f}, read "
                 f"{m['best_read_gbps']:.2f})")
              + (f"; v1 calls alone: write {m['write_gbps_v1']:.2f}, read "
                 f"{m['read_gbps_v1']:.2f} GB/s" if "write_gbps_v1" in m else ""), flush=True)
    for n, d in drives.items():
        print(f"[{kind}] ours on {n} dir(s): write {d['write_gbps']:.2f} GB/s, read "
              f"{d['read_gbps']:.2f} GB/s, byte-exact {d['exact_pages']}/{PAGES}, pages per dir "
              f"{d['pages_per_dir'] or [PAGES]}", flush=True)
    print(f"[{kind}] ours vs disk: read {out['read_vs_disk']:.2f}x, write "
          f"{out['write_vs_disk']:.2f}x (the v1 calls alone: read {out['read_vs_disk_v1']:.2f}x, "
          f"write {out['write_vs_disk_v1']:.2f}x; with a DRAM tier in front: read "
          f"{out['read_vs_disk_with_dram']:.2f}x); vs mori's SSD node: read "
          f"{out['read_vs_mori_ssd']:.1f}x, write {out['write_vs_mori_ssd']:.1f}x; vs file: read "
          f"{out['read_vs_file']:.2f}x, write {out['write_vs_file']:.2f}x; O_DIRECT transfers "
          f"{out['direct_ios']}, through the page cache {out['buffered_ios']}", flush=True)
    return out


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    base = os.environ.get("BENCH_SSD_DIR", "/var/tmp")
    workdir = Path(tempfile.mkdtemp(prefix="hicache-bench-ssd-", dir=base))
    try:
        model = E.tiny_model_dir(workdir)
        kinds = {kind: bench_kind(kind, model, workdir) for kind in ("mha", "r1")}
        keys = ("read_vs_disk", "write_vs_disk", "read_vs_disk_v1", "write_vs_disk_v1",
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
