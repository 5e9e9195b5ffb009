"""Host pool allocate + prefault: seconds per GiB by backing and thread count vs MAP_POPULATE.

For each backing (4 KiB pages; hugepages of --hugepage-mib, which the kernel demotes to 4 KiB
when none are reserved -- reported as such, never relabelled) it times, side by side in one
run: one ``mmap(MAP_POPULATE)`` (the kernel faulting every page in one thread), and
``HostAllocator.alloc(prefault=False)`` + ``HostBuffer.prefault(t)`` for t = 1, 2, 4, ... N
threads (N = usable CPUs). Median of --rounds. The last line is one JSON object:

  {"size_gib", "cpus", "path", "backings": {<name>: {"page_bytes", "demoted",
   "map_populate_s_per_gib", "threads": {"1": s_per_gib, ...}, "scaling_vs_perfect",
   "speedup_vs_map_populate"}}, "target_scaling_vs_perfect": 1.3}

``scaling_vs_perfect`` = t_N * N / t_1 (1.0 is perfect; the target is <= 1.3). Run alone on
a quiet machine: other processes on the same cores distort thread scaling.

Hugepages: run as root, it reserves the hugepages it needs for the run on top of whatever the
machine has (``tests/support/hugepages.py``: grows ``nr_hugepages``, gives exactly those pages
back at the end, also on failure) and reports ``"reserved"``; ``--no-reserve`` measures what the
machine has (demoted to 4 KiB where that is nothing).

Usage: python bench/host_pool.py [--size-gib 1] [--rounds 3] [--max-threads N] [--no-reserve]
(``make bench-host-pool`` runs it in the engine environment, where the mori allocator path is used;
the 3.11 venv or a bare python3 with PYTHONPATH=backend uses the mmap path.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT / "tests"))

from hicache_umbp.contract.units import GIB, MIB  # noqa: E402
from hicache_umbp.hostmem import allocator as A  # noqa: E402
from hicache_umbp.hostmem import kernel as K  # noqa: E402
from support.hugepages import HugepageReservation, HugepagesRefused  # noqa: E402

MAP_POPULATE = 0x8000


def map_populate_seconds(size: int, hugepage_bytes: int) -> tuple[float, bool]:
    """One mmap(MAP_POPULATE) of ``size``; returns (seconds, demoted)."""
    flags = 0x02 | 0x20 | MAP_POPULATE  # MAP_PRIVATE | MAP_ANONYMOUS
    demoted = False
    if hugepage_bytes:
        huge = 0x40000 | (hugepage_bytes.bit_length() - 1) << 26
        t0 = time.perf_counter()
        p = K._libc.mmap(None, size, K._PROT_RW, flags | huge, -1, 0)
        dt = time.perf_counter() - t0
        if p not in (None, K._MAP_FAILED):
            K._libc.munmap(p, size)
            return dt, False
        demoted = True
    t0 = time.perf_counter()
    p = K._libc.mmap(None, size, K._PROT_RW, flags, -1, 0)
    dt = time.perf_counter() - t0
    if p in (None, K._MAP_FAILED):
        raise MemoryError(f"mmap(MAP_POPULATE) of {size} B failed")
    K._libc.munmap(p, size)
    return dt, demoted


def parallel_seconds(alloc: A.HostAllocator, size: int, threads: int) -> tuple[float, A.Backing]:
    t0 = time.perf_counter()
    buf = alloc.alloc(size)
    used = buf.prefault(threads)
    dt = time.perf_counter() - t0
    assert used == threads, (used, threads)
    info = A.mapping_info(buf.ptr)
    # hugetlb pages are counted as Private_/Shared_Hugetlb, not in Rss
    rss = info.get("Rss", 0) + info.get("Private_Hugetlb", 0) + info.get("Shared_Hugetlb", 0)
    assert rss >= buf.mapped_size * 0.99, f"prefault left pages out: resident {rss}"
    backing = buf.backing
    buf.free()
    return dt, backing


def thread_counts(n: int) -> list[int]:
    counts, t = [], 1
    while t < n:
        counts.append(t)
        t *= 2
    return [*counts, n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--hugepage-mib", type=int, default=2, choices=(2, 1024))
    ap.add_argument("--no-reserve", action="store_true",
                    help="do not reserve hugepages for the run (measure what the host has)")
    args = ap.parse_args()
    pages = int(args.size_gib * GIB) // (args.hugepage_mib * MIB)
    if args.no_reserve:
        run(args, reserved=0)
        return
    try:
        with HugepageReservation(pages, page_kib=args.hugepage_mib * 1024):
            run(args, reserved=pages)
    except HugepagesRefused as e:
        print(f"hugepages not reserved ({e}); measuring what the host has")
        run(args, reserved=0)


def run(args: argparse.Namespace, reserved: int) -> None:
    # one demotion line per backing below instead of one warning per allocation
    logging.getLogger("hicache_umbp.hostmem.allocator").setLevel(logging.ERROR)
    size = int(args.size_gib * GIB)
    gib = size / GIB
    cpus = args.max_threads
    result: dict[str, object] = {"size_gib": gib, "cpus": cpus, "reserved": reserved}
    backings: dict[str, dict[str, object]] = {}
    for name, hp in (("4k", 0), (f"hugepage_{args.hugepage_mib}m", args.hugepage_mib * MIB)):
        alloc = A.HostAllocator(hugepage_bytes=hp, prefault=False)
        result["path"] = alloc.path
        pop = [map_populate_seconds(size, hp) for _ in range(args.rounds)]
        pop_s = statistics.median(d for d, _ in pop) / gib
        per_thread: dict[str, float] = {}
        backing = None
        for t in thread_counts(cpus):
            runs = [parallel_seconds(alloc, size, t) for _ in range(args.rounds)]
            backing = runs[-1][1]
            per_thread[str(t)] = round(statistics.median(d for d, _ in runs) / gib, 4)
            print(f"{name:>14} threads={t:<3} {per_thread[str(t)]:.4f} s/GiB "
                  f"(MAP_POPULATE {pop_s:.4f} s/GiB, page {backing.page_bytes} B, "
                  f"demoted={backing.demoted})", flush=True)
        assert backing is not None
        t1, tn = per_thread["1"], per_thread[str(cpus)]
        best = min(per_thread.values())
        backings[name] = {
            "page_bytes": backing.page_bytes,
            "demoted": backing.demoted or pop[-1][1],
            "map_populate_s_per_gib": round(pop_s, 4),
            "threads": per_thread,
            "scaling_vs_perfect": round(tn * cpus / t1, 3),
            "speedup_vs_map_populate": round(pop_s / best, 2),
        }
        if backing.demoted:
            print(f"{name}: hugepages unavailable here: measured on 4 KiB pages (demoted)")
    result["backings"] = backings
    result["target_scaling_vs_perfect"] = 1.3
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
