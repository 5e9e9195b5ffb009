"""Parallel reads (hicache_umbp.readers) and the store's split of a get batch over threads.

In-process: the store runs over the in-memory UMBP double (``support.memory_client``, which
passes the mori contract suite) wrapped to record which thread made each client call; the same
split runs on the real mori in test_store_mori.py. Nothing is timed: calls, threads and bytes
are counted.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pytest
from hicache_umbp.keys import MHA_PARTS, MLA_PARTS, KeyScheme
from hicache_umbp.readers import (
    MAX_READ_THREADS,
    ParallelReads,
    default_read_threads,
    split_chunks,
)
from hicache_umbp.store import UMBPStore
from support.memory_client import MemoryUMBPClient

MIB = 1 << 20


class ThreadRecordingClient(MemoryUMBPClient):
    """The double, recording (thread id, keys) of every get call."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.get_calls: list[tuple[int, int]] = []
        self._record = threading.Lock()
        self.barrier: threading.Barrier | None = None

    def batch_get_into_ptr(self, keys: Any, ptrs: Any, sizes: Any) -> list[bool]:
        with self._record:
            self.get_calls.append((threading.get_ident(), len(keys)))
        if self.barrier is not None:  # every chunk must be in flight at once to pass
            self.barrier.wait(timeout=10)
        return super().batch_get_into_ptr(keys, ptrs, sizes)


def test_split_chunks_is_contiguous_balanced_and_bounded() -> None:
    assert split_chunks([MIB] * 128, 2, 4 * MIB) == [range(0, 64), range(64, 128)]
    assert split_chunks([MIB] * 128, 4, 4 * MIB) == [range(32 * i, 32 * (i + 1))
                                                     for i in range(4)]
    assert split_chunks([MIB] * 6, 4, 4 * MIB) == [range(6)]  # 6 MiB: one chunk of >= 4 MiB
    assert split_chunks([MIB] * 8, 4, 4 * MIB) == [range(0, 4), range(4, 8)]
    assert split_chunks([MIB] * 3, 1, 1) == [range(3)]
    assert split_chunks([], 4, 1) == [range(0)]
    sizes = [8 * MIB] + [MIB] * 8  # unequal pages: chunks balance bytes, not pages
    chunks = split_chunks(sizes, 2, MIB)
    assert [c for c in chunks] == [range(0, 1), range(1, 9)]


def test_default_read_threads_take_half_the_cpus_we_may_use() -> None:
    import os

    assert [default_read_threads(c) for c in (1, 2, 3, 4, 6, 8, 64)] == [1, 1, 1, 2, 3, 4, 4]
    assert default_read_threads() == default_read_threads(len(os.sched_getaffinity(0)))
    assert MAX_READ_THREADS == 4


def test_parallel_reads_run_every_chunk_at_once_and_keep_order() -> None:
    reads = ParallelReads(3)
    barrier = threading.Barrier(3)
    seen: list[int] = []

    def chunk(i: int) -> list[bool]:
        barrier.wait(timeout=10)  # sequential execution would break the barrier
        seen.append(threading.get_ident())
        return [i % 2 == 0] * (i + 1)

    got = reads.run([lambda i=i: chunk(i) for i in range(3)], [1, 2, 3])
    assert got == [True, False, False, True, True, True]
    assert len(set(seen)) == 3 and threading.get_ident() in seen  # the caller reads chunk 0
    reads.close()
    assert reads.run([lambda: [True], lambda: [True, True]], [1, 2]) == [True] * 3  # inline


def test_a_raising_chunk_reports_false_and_never_raises() -> None:
    reads = ParallelReads(2)

    def boom() -> list[bool]:
        raise RuntimeError("chunk failed")

    assert reads.run([lambda: [True, True], boom], [2, 3]) == [True, True, False, False, False]
    reads.close()


class Pages:
    """``n`` pages of ``parts`` x ``part`` bytes in one ctypes buffer."""

    def __init__(self, n: int, parts: int, part: int, fill: int) -> None:
        self.n, self.parts, self.part = n, parts, part
        self.buf = (ctypes.c_uint8 * (n * parts * part))()
        ctypes.memset(self.buf, fill, n * parts * part)
        self.base = ctypes.addressof(self.buf)

    def ptrs(self) -> list[list[tuple[int, int]]]:
        return [[(self.base + (i * self.parts + p) * self.part, self.part)
                 for p in range(self.parts)] for i in range(self.n)]

    def page(self, i: int) -> bytes:
        size = self.parts * self.part
        return bytes(self.buf[i * size:(i + 1) * size])


@pytest.mark.parametrize("parts", [MHA_PARTS, MLA_PARTS], ids=["mha", "mla"])
def test_a_get_batch_is_split_over_the_read_threads(parts: tuple[str, ...]) -> None:
    client = ThreadRecordingClient(256 * MIB)
    store = UMBPStore(client, KeyScheme("ns", "m", 1, 0, parts), read_threads=2)
    n, part = 128, 256 * 1024  # 32-64 MiB per batch: two chunks of >= 16 MiB
    src, dst = Pages(n, len(parts), part, 7), Pages(n, len(parts), part, 0)
    hashes = [f"{i:064x}" for i in range(n)]
    stored = [i for i in range(n) if i != 100]  # a hole in the second chunk
    assert store.batch_set([hashes[i] for i in stored], [src.ptrs()[i] for i in stored]) == [
        True] * len(stored)
    client.barrier = threading.Barrier(2)
    got = store.batch_get(hashes, dst.ptrs())
    assert got == [i != 100 for i in range(n)]
    assert [k for _, k in client.get_calls] == [n // 2 * len(parts)] * 2
    assert len({t for t, _ in client.get_calls}) == 2
    assert all(dst.page(i) == src.page(i) for i in stored) and dst.page(100) != src.page(100)
    s = store.stats()
    assert (s.pages_get, s.get_misses, s.errors) == (n - 1, 1, {})
    store.close()


def test_small_batches_sets_and_single_thread_stores_make_one_call() -> None:
    client = ThreadRecordingClient(256 * MIB)
    store = UMBPStore(client, KeyScheme("ns", "m", 1, 0, MHA_PARTS), read_threads=4)
    small = Pages(8, 2, 1 << 20, 3)  # 16 MiB: below two readers' shares
    hashes = [f"{i:064x}" for i in range(8)]
    assert store.batch_set(hashes, small.ptrs()) == [True] * 8
    assert client.calls["batch_put_from_ptr"] == 1  # puts are never split
    assert store.batch_get(hashes, small.ptrs()) == [True] * 8
    assert len(client.get_calls) == 1
    single = UMBPStore(client, KeyScheme("ns", "m", 1, 0, MHA_PARTS))
    big = Pages(64, 2, 256 * 1024, 5)
    more = [f"{i + 100:064x}" for i in range(64)]
    assert single.batch_set(more, big.ptrs()) == [True] * 64
    assert single.batch_get(more, big.ptrs()) == [True] * 64
    assert len(client.get_calls) == 2 and single.read_threads == 1
    with pytest.raises(ValueError, match="DRAM clients"):
        UMBPStore(client, KeyScheme("ns", "m", 1, 0, MHA_PARTS), read_threads=2,
                  max_batch_pages=8)


def test_siblings_share_the_thread_count_and_close_their_readers() -> None:
    client = ThreadRecordingClient(64 * MIB)
    head = UMBPStore(client, KeyScheme("ns", "m", 4, 2, MHA_PARTS), read_threads=3)
    sibling = head.sibling(KeyScheme("ns", "m", 4, 3, MHA_PARTS))
    assert sibling.read_threads == 3
    sibling.close()
    head.close()
    assert head.batch_get([f"{1:064x}"], [[(1, 1), (1, 1)]]) == [False]  # closed: no call
    assert client.get_calls == []
