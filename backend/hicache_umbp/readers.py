"""Parallel reads: one batch of page gets split over a few threads.

Why: amd-mori 1.2.4's ``batch_get_into_ptr`` releases the GIL and copies every value of the
call on the calling thread (embedded DRAM) or has the server copy one call at a time
(standalone DRAM), so one call moves at most one core's worth of memcpy, while a prefetch is on
a request's critical path (SGLang waits for it before the prefill). Measured on the 2-CPU
development machine, 256 values of 512 KiB (one SGLang batch of 128 MHA pages of 1 MiB),
medians of 10-15 runs: raw embedded DRAM gets moved 20.0-29.0 GB/s in one call and 22.7-37.1
GB/s as two concurrent calls on the halves (four runs, every one faster); a standalone DRAM
server 9.9 vs 14.3 GB/s. ``batch_put_from_ptr`` does not scale that way (24.2 GB/s for one
call, 23.0 for two: mori serialises puts), so only gets are split. SSD clients stage each
batch in a fixed set of slots and run one batch at a time
(:class:`~hicache_umbp.client_guards.SerializedClient`): they are never split.

Inside the store on that 2-CPU machine, with other jobs running, two readers were 0-6 % slower
than one (the handoff costs ~70 us per batch, and the second reader competes with SGLang's own
threads for the two CPUs), so a store splits only where the process may use at least two CPUs
per reader (:func:`default_read_threads`): never on a 2-CPU machine, up to
:data:`MAX_READ_THREADS` readers on an engine pod's CPU set. A batch is split into contiguous
chunks of at least ``min_bytes_per_thread`` bytes; the calling thread reads the first chunk.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

#: Upper bound of reader threads per store (the calling thread included); a pod's ranks share
#: its CPUs, and two to four concurrent copies already saturate a socket's share per rank.
MAX_READ_THREADS = 4
#: A chunk below this many bytes saves less copy time than its thread handoff costs (~70 us
#: per batch measured with a client that returns at once, bench/sglang_backend.py).
MIN_BYTES_PER_READER = 16 << 20


def default_read_threads(cpus: int | None = None) -> int:
    """Reader threads for a DRAM store: half the CPUs this process may run on (the other half
    is left to SGLang's scheduler, prefetch and backup threads), at most
    :data:`MAX_READ_THREADS`, at least 1."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return max(1, min(MAX_READ_THREADS, cpus // 2))


def split_chunks(sizes: Sequence[int], threads: int, min_bytes: int) -> list[range]:
    """Contiguous page ranges of about equal bytes (``sizes``: bytes per page), at most
    ``threads`` of them and none below ``min_bytes`` unless there is only one."""
    n = len(sizes)
    total = sum(sizes)
    want = max(1, min(threads, n, total // max(1, min_bytes)))
    if want == 1:
        return [range(n)]
    chunks: list[range] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc * want >= total * (len(chunks) + 1) and len(chunks) < want - 1:
            chunks.append(range(start, i + 1))
            start = i + 1
    chunks.append(range(start, n))
    return [c for c in chunks if len(c)]


class ParallelReads:
    """Runs chunk reads concurrently: the first on the caller's thread, the others on a small
    pool started on first use. Calls never raise (a chunk that raises reports all False)."""

    def __init__(self, threads: int, *, min_bytes_per_thread: int = MIN_BYTES_PER_READER) -> None:
        if threads < 1:
            raise ValueError(f"threads={threads!r} must be >= 1")
        self.threads = threads
        self.min_bytes_per_thread = min_bytes_per_thread
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def run(self, calls: Sequence[Callable[[], list[bool]]], sizes: Sequence[int]) -> list[bool]:
        """Run ``calls`` (one per chunk, ``sizes[i]`` keys each) and concatenate their results."""
        if len(calls) == 1:
            return calls[0]()
        pool = self._executor()
        futures: list[Future[list[bool]] | None] = []
        for call in calls[1:]:
            try:
                futures.append(pool.submit(call) if pool is not None else None)
            except RuntimeError:  # shut down meanwhile: read this chunk on our thread
                futures.append(None)
        results = [calls[0]()]
        for i, fut in enumerate(futures, start=1):
            try:
                results.append(fut.result() if fut is not None else calls[i]())
            except Exception:
                results.append([False] * sizes[i])
        return [ok for chunk in results for ok in chunk]

    def _executor(self) -> ThreadPoolExecutor | None:
        with self._lock:
            if self._closed:
                return None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads - 1,
                                                thread_name_prefix="umbp-read")
            return self._pool

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
