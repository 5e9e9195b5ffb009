"""TieredClient (DRAM in front of SSD) over two in-process UMBP doubles.

Real: the tiering policy, its write-back thread, memfd staging buffer and bounded queue, the
store on top, and the bytes. Faked: the two mori clients, replaced by ``MemoryUMBPClient``
doubles (DRAM: plain; SSD: ``max_batch=16`` like mori's staging slots), which pass the same
contract suite as real mori. ``test_tiers_mori.py`` repeats the larger-than-DRAM scenario on
real mori clients.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence

import pytest
from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.store import UMBPStore
from hicache_umbp.store.tiers import TieredClient
from support.memory_client import MemoryUMBPClient

SIZE = 4096


class GatedSsd(MemoryUMBPClient):
    """An SSD double whose puts from the write-back thread wait for ``gate``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, max_batch=16)
        self.gate = threading.Event()
        self.writer_waiting = threading.Event()

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        if threading.current_thread().name == "hicache-tier-writeback":
            self.writer_waiting.set()
            self.gate.wait()
        return super().batch_put_from_ptr(keys, ptrs, sizes)


class Buf:
    def __init__(self, n: int, size: int = SIZE) -> None:
        self.n, self.size = n, size
        self.mem = ctypes.create_string_buffer(os.urandom(n * size), n * size)
        self.base = ctypes.addressof(self.mem)

    def ptrs(self, idx: Sequence[int] | None = None) -> list[int]:
        return [self.base + i * self.size for i in (range(self.n) if idx is None else idx)]

    def sizes(self, k: int) -> list[int]:
        return [self.size] * k

    def item(self, i: int) -> bytes:
        return self.mem.raw[i * self.size : (i + 1) * self.size]


def keys(n: int, tag: str = "k") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def ssd_bytes(ssd: MemoryUMBPClient, key: str, size: int = SIZE) -> bytes | None:
    out = ctypes.create_string_buffer(size)
    ok = ssd.batch_get_into_ptr([key], [ctypes.addressof(out)], [size])
    return out.raw if ok == [True] else None


def test_write_back_reaches_ssd_after_flush() -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd, write_policy="write_back")
    src = Buf(40)
    ks = keys(40)
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(40)) == [True] * 40
    assert tiers.flush() is True
    assert all(ssd_bytes(ssd, k) == src.item(i) for i, k in enumerate(ks))
    st = tiers.tier_stats()
    assert (st.writeback_queued, st.writeback_done, st.writeback_failed) == (40, 40, 0)
    assert ssd.calls["batch_put_from_ptr"] >= 3  # never more than 16 keys per SSD call
    tiers.close()


def test_write_back_never_reads_the_callers_buffer_after_the_put() -> None:
    """The caller reuses its buffer right after the put: SSD must still get the put bytes."""
    dram, ssd = MemoryUMBPClient(1 << 20), GatedSsd(1 << 24)
    tiers = TieredClient(dram, ssd, write_policy="write_back")
    src = Buf(4)
    original = [src.item(i) for i in range(4)]
    assert tiers.batch_put_from_ptr(keys(4), src.ptrs(), src.sizes(4)) == [True] * 4
    ctypes.memset(src.base, 0xAB, 4 * SIZE)  # SGLang reuses the host slots
    ssd.gate.set()
    tiers.flush()
    assert [ssd_bytes(ssd, k) for k in keys(4)] == original
    tiers.close()


def test_queued_pages_evicted_from_dram_are_served_from_the_ring() -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), GatedSsd(1 << 24)
    tiers = TieredClient(dram, ssd)
    src = Buf(3)
    assert tiers.batch_put_from_ptr(keys(3), src.ptrs(), src.sizes(3)) == [True] * 3
    assert ssd.writer_waiting.wait(10)
    dram._data.clear()  # mori's DRAM evicted them; the SSD write is still in flight
    assert tiers.batch_exists_consecutive(keys(3)) == 3
    dst = Buf(3)
    assert tiers.batch_get_into_ptr(keys(3), dst.ptrs(), dst.sizes(3)) == [True] * 3
    assert [dst.item(i) for i in range(3)] == [src.item(i) for i in range(3)]
    assert tiers.tier_stats().ring_hits == 3
    ssd.gate.set()
    tiers.close()
    assert [ssd_bytes(ssd, k) for k in keys(3)] == [src.item(i) for i in range(3)]


def test_full_ring_waits_then_falls_back_to_a_synchronous_ssd_write() -> None:
    dram, ssd = MemoryUMBPClient(1 << 22), GatedSsd(1 << 24)
    tiers = TieredClient(dram, ssd, queue_keys=3, queue_wait_s=0.01)
    src = Buf(10)
    ks = keys(10)
    assert tiers.batch_put_from_ptr(ks[:2], src.ptrs([0, 1]), src.sizes(2)) == [True] * 2
    assert ssd.writer_waiting.wait(10)  # the writer holds keys 0-1 and cannot finish
    # Keys 2-3 do not fit beside them: the put waits, times out and writes through (the
    # synchronous SSD write is not from the writer thread, so the gate does not hold it).
    assert tiers.batch_put_from_ptr(ks[2:4], src.ptrs([2, 3]), src.sizes(2)) == [True] * 2
    assert tiers.batch_put_from_ptr(ks[4:5], src.ptrs([4]), src.sizes(1)) == [True]  # fits
    # A batch larger than the ring never waits.
    assert tiers.batch_put_from_ptr(ks[5:], src.ptrs(range(5, 10)), src.sizes(5)) == [True] * 5
    st = tiers.tier_stats()
    assert (st.writeback_queued, st.writeback_waits, st.writeback_wait_timeouts) == (3, 1, 1)
    assert st.ssd_direct_writes == 7
    assert [ssd_bytes(ssd, k) for k in [ks[2], ks[3], *ks[5:]]] == [
        src.item(i) for i in [2, 3, 5, 6, 7, 8, 9]
    ]
    ssd.gate.set()
    tiers.close()
    assert [ssd_bytes(ssd, k) for k in ks] == [src.item(i) for i in range(10)]


def test_ring_bytes_bound_the_queue() -> None:
    dram, ssd = MemoryUMBPClient(1 << 22), GatedSsd(1 << 24)
    tiers = TieredClient(dram, ssd, queue_bytes=8 * SIZE, queue_wait_s=0.01)
    src = Buf(12)
    for i in range(12):
        assert tiers.batch_put_from_ptr([f"k{i}"], src.ptrs([i]), src.sizes(1)) == [True]
    st = tiers.tier_stats()
    assert st.writeback_queued == 8  # 8 x 4 KiB fill the ring; the writer is gated
    assert st.ssd_direct_writes == 4
    ssd.gate.set()
    tiers.close()
    assert tiers.tier_stats().writeback_done == 8
    assert [ssd_bytes(ssd, f"k{i}") for i in range(12)] == [src.item(i) for i in range(12)]


def test_a_put_waiting_for_room_proceeds_when_the_writer_catches_up() -> None:
    dram, ssd = MemoryUMBPClient(1 << 22), GatedSsd(1 << 24)
    tiers = TieredClient(dram, ssd, queue_keys=2, queue_wait_s=60.0)
    src = Buf(4)
    tiers.batch_put_from_ptr(keys(2), src.ptrs([0, 1]), src.sizes(2))
    assert ssd.writer_waiting.wait(10)
    threading.Timer(0.05, ssd.gate.set).start()  # the writer resumes while the put waits
    tiers.batch_put_from_ptr(keys(4)[2:], src.ptrs([2, 3]), src.sizes(2))
    tiers.close()
    st = tiers.tier_stats()
    assert (st.writeback_queued, st.writeback_waits, st.writeback_wait_timeouts) == (4, 1, 0)
    assert (st.ssd_direct_writes, st.writeback_done) == (0, 4)


@pytest.mark.parametrize("sizes", [[3000, 5000, 4096, 8000, 1, 12000], [4096] * 7])
def test_the_ring_wraps_and_keeps_bytes_apart(sizes: list[int]) -> None:
    """Many rounds of odd sizes through a small ring: every SSD copy is byte-exact."""
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 26, max_batch=16)
    tiers = TieredClient(dram, ssd, queue_bytes=20000, queue_wait_s=30.0)
    blobs = []
    for r in range(30):
        size = sizes[r % len(sizes)]
        blob = ctypes.create_string_buffer(os.urandom(size), size)
        blobs.append(blob)
        key = f"r{r}"
        assert tiers.batch_put_from_ptr([key], [ctypes.addressof(blob)], [size]) == [True]
    tiers.close()
    for r, blob in enumerate(blobs):
        assert ssd_bytes(ssd, f"r{r}", len(blob.raw)) == blob.raw


def test_write_through_writes_both_tiers_before_returning() -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd, write_policy="write_through")
    src = Buf(20)
    assert tiers.batch_put_from_ptr(keys(20), src.ptrs(), src.sizes(20)) == [True] * 20
    assert all(ssd_bytes(ssd, k) == src.item(i) for i, k in enumerate(keys(20)))
    assert dram.batch_exists(keys(20)) == [True] * 20
    assert ssd.calls["batch_put_from_ptr"] == 2  # 16 + 4
    tiers.close()


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_pages_dram_refuses_still_reach_ssd(policy: str) -> None:
    dram, ssd = MemoryUMBPClient(4 * SIZE), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd, write_policy=policy)
    src = Buf(40)
    assert tiers.batch_put_from_ptr(keys(40), src.ptrs(), src.sizes(40)) == [True] * 40
    tiers.flush()
    dst = Buf(40)
    assert tiers.batch_get_into_ptr(keys(40), dst.ptrs(), dst.sizes(40)) == [True] * 40
    assert all(dst.item(i) == src.item(i) for i in range(40))
    assert tiers.tier_stats().ssd_hits >= 36
    tiers.close()


@pytest.mark.parametrize("promote", [True, False])
def test_ssd_hits_are_promoted_to_dram(promote: bool) -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    src = Buf(3)
    assert ssd.batch_put_from_ptr(keys(3), src.ptrs(), src.sizes(3)) == [True] * 3
    tiers = TieredClient(dram, ssd, promote_on_hit=promote)
    dst = Buf(3)
    assert tiers.batch_get_into_ptr(keys(3), dst.ptrs(), dst.sizes(3)) == [True] * 3
    assert [dst.item(i) for i in range(3)] == [src.item(i) for i in range(3)]
    assert dram.batch_exists(keys(3)) == [promote] * 3
    st = tiers.tier_stats()
    assert (st.ssd_hits, st.promotions) == (3, 3 if promote else 0)
    tiers.close()


def test_a_promotion_never_waits_for_a_put_and_counts_what_it_skipped() -> None:
    """Promotion is best effort: while a put holds the tiers (another thread's backup), an SSD
    hit is served and not copied into DRAM, and the keys it skipped are counted (exported as
    hicache_umbp_promotions_skipped_keys_total)."""
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    src = Buf(3)
    assert ssd.batch_put_from_ptr(keys(3), src.ptrs(), src.sizes(3)) == [True] * 3
    tiers = TieredClient(dram, ssd, promote_on_hit=True)
    dst = Buf(3)
    with tiers._put_lock:  # a put running in another thread
        assert tiers.batch_get_into_ptr(keys(3), dst.ptrs(), dst.sizes(3)) == [True] * 3
    assert [dst.item(i) for i in range(3)] == [src.item(i) for i in range(3)]
    assert dram.batch_exists(keys(3)) == [False] * 3
    st = tiers.tier_stats()
    assert (st.ssd_hits, st.promotions, st.promotions_skipped) == (3, 0, 3)
    # the next read, with no put running, promotes them
    assert tiers.batch_get_into_ptr(keys(3), dst.ptrs(), dst.sizes(3)) == [True] * 3
    assert dram.batch_exists(keys(3)) == [True] * 3
    assert (tiers.tier_stats().promotions, tiers.tier_stats().promotions_skipped) == (3, 3)
    tiers.close()


def test_exists_consults_both_tiers() -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    src = Buf(6)
    ks = keys(6)
    dram.batch_put_from_ptr([ks[0], ks[2]], src.ptrs([0, 2]), src.sizes(2))
    ssd.batch_put_from_ptr([ks[1], ks[3], ks[5]], src.ptrs([1, 3, 5]), src.sizes(3))
    tiers = TieredClient(dram, ssd)
    assert tiers.batch_exists(ks) == [True, True, True, True, False, True]
    assert tiers.batch_exists_consecutive(ks) == 4
    assert tiers.batch_exists_consecutive([]) == 0
    tiers.close()


def test_a_failing_tier_does_not_stop_the_other_or_the_writer() -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd)
    src = Buf(4)
    dram.inject("batch_put_from_ptr", "raise")
    assert tiers.batch_put_from_ptr(keys(2), src.ptrs([0, 1]), src.sizes(2)) == [True, True]
    tiers.flush()
    ssd.inject("batch_put_from_ptr", "raise")
    assert tiers.batch_put_from_ptr(keys(4)[2:], src.ptrs([2, 3]), src.sizes(2)) == [True] * 2
    assert tiers.flush() is True  # the writer retried the two keys the failing call refused
    st = tiers.tier_stats()
    assert (st.writeback_failed, st.writeback_retries, st.writeback_done) == (0, 2, 2)
    assert [ssd_bytes(ssd, k) for k in keys(4)] == [src.item(i) for i in range(4)]
    assert tiers.batch_put_from_ptr(["late"], src.ptrs([0]), src.sizes(1)) == [True]
    tiers.flush()
    assert ssd_bytes(ssd, "late") == src.item(0)
    tiers.close()


def test_close_drains_the_queue_and_stops_the_thread() -> None:
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd)
    src = Buf(30)
    tiers.batch_put_from_ptr(keys(30), src.ptrs(), src.sizes(30))
    tiers.close()
    tiers.close()
    assert not any(t.name == "hicache-tier-writeback" and t.is_alive()
                   for t in threading.enumerate() if t is tiers._writer)
    assert all(ssd_bytes(ssd, k) == src.item(i) for i, k in enumerate(keys(30)))
    # After close, puts still land in both tiers synchronously.
    assert tiers.batch_put_from_ptr(["after"], src.ptrs([0]), src.sizes(1)) == [True]
    assert ssd_bytes(ssd, "after") == src.item(0)


class GatedDram(MemoryUMBPClient):
    """A DRAM double whose puts from a thread named ``late-put`` wait for ``gate``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.gate = threading.Event()
        self.put_waiting = threading.Event()

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        if threading.current_thread().name == "late-put":
            self.put_waiting.set()
            self.gate.wait()
        return super().batch_put_from_ptr(keys, ptrs, sizes)


def test_close_waits_for_a_put_that_holds_ring_slots() -> None:
    """A put that reserved write-back slots before close() must still reach SSD: close waits
    for it instead of draining an empty queue and unmapping the ring under it. Real: the
    tiering, ring and threads; faked: both clients (doubles, DRAM put held by an event)."""
    dram, ssd = GatedDram(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd)
    src = Buf(4)
    results: list[list[bool]] = []
    put = threading.Thread(
        target=lambda: results.append(
            tiers.batch_put_from_ptr(keys(4, "late"), src.ptrs(), src.sizes(4))
        ),
        name="late-put",
    )
    put.start()
    assert dram.put_waiting.wait(60)  # the put holds its ring slots, inside the DRAM call
    closer = threading.Thread(target=tiers.close)
    closer.start()
    # A correct close() blocks until the put is done (the join just times out); a close()
    # that does not wait finishes here and the put's pages never reach SSD.
    closer.join(0.5)
    dram.gate.set()
    put.join(60)
    closer.join(60)
    assert not put.is_alive() and not closer.is_alive()
    assert results == [[True] * 4]
    assert [ssd_bytes(ssd, k) for k in keys(4, "late")] == [src.item(i) for i in range(4)]


def test_bad_policy_is_refused_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"write_policy='lazy'.*write_back, write_through"):
        TieredClient(MemoryUMBPClient(1), MemoryUMBPClient(1), write_policy="lazy")


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_store_over_tiers_serves_a_working_set_larger_than_dram(policy: str) -> None:
    """2 parts x 4 KiB pages, 64 pages = 512 KiB through a 128 KiB DRAM tier, byte-exact."""
    dram = MemoryUMBPClient(32 * SIZE)
    ssd = MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd, write_policy=policy, queue_bytes=64 * SIZE)
    store = UMBPStore(tiers, KeyScheme("ns", "m", 1, 0, MHA_PARTS))
    n = 64
    src = Buf(2 * n)
    hs = [f"{i:064x}" for i in range(n)]
    parts = [[(src.base + (2 * i + p) * SIZE, SIZE) for p in range(2)] for i in range(n)]
    for start in range(0, n, 2):
        assert store.batch_set(hs[start : start + 2], parts[start : start + 2]) == [True] * 2
    store.flush()
    assert store.batch_exists(hs) == n
    dst = Buf(2 * n)
    ctypes.memset(dst.base, 0, 2 * n * SIZE)
    dparts = [[(dst.base + (2 * i + p) * SIZE, SIZE) for p in range(2)] for i in range(n)]
    assert store.batch_get(hs, dparts) == [True] * n
    assert dst.mem.raw == src.mem.raw
    st = tiers.tier_stats()
    assert st.ssd_hits > 0 and st.writeback_failed == 0 and st.misses == 0
    store.close()


# ----------------------------------------------------------------------------- issue 11, item 6g


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
@pytest.mark.parametrize("seed", [0, 1])
def test_concurrent_writes_of_one_page_never_come_back_torn(policy: str, seed: int) -> None:
    """3 writers put the same 24 pages (K and V filled with the writer's id) through a DRAM
    tier of 8 pages in front of SSD while 2 readers get them: every hit page has K and V from
    the same write. Real: the tiering, ring, threads and store; faked: both clients (doubles).
    Before pages were atomic per key on the tiered path, ~60-90 hits per run were torn and the
    ring queued one key twice (the SSD refused the repeat: writeback_failed)."""
    from .concurrent_pages import hammer

    dram, ssd = MemoryUMBPClient(16 * SIZE), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd, write_policy=policy, queue_bytes=64 * SIZE,
                         parts_per_page=2)
    store = UMBPStore(tiers, KeyScheme("ns", "m", 1, 0, MHA_PARTS))
    report = hammer(store, pages=24, part=SIZE, min_hits=1500, seed=seed)
    st = tiers.tier_stats()
    store.close()
    assert not report.errors, report.errors
    assert report.hits >= 1500 and st.ssd_hits > 0  # the SSD tier was really read
    assert report.torn == 0, (report.torn, report.examples)
    assert st.writeback_failed == 0


# ----------------------------------------------------------------------------- issue 11, item 3


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_a_page_no_tier_accepts_is_never_reported_stored(policy: str) -> None:
    """Both tiers refuse (as when both standalone sidecars are down): the put must say False.
    Before, write-back queued the copy and answered True although DRAM had refused it and the
    SSD then refused it too. Real: the tiering and ring; faked: both clients (doubles)."""
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    # No retry window: the one injected refusal stands (test_tier_refusals.py retries).
    tiers = TieredClient(dram, ssd, write_policy=policy, parts_per_page=2, retry_window_s=0)
    src = Buf(4)
    dram.inject("batch_put_from_ptr", "false")
    ssd.inject("batch_put_from_ptr", "false")
    assert tiers.batch_put_from_ptr(keys(4), src.ptrs(), src.sizes(4)) == [False] * 4
    tiers.flush()
    assert tiers.batch_exists(keys(4)) == [False] * 4
    # DRAM refuses, SSD takes it synchronously: stored (and said so).
    dram.inject("batch_put_from_ptr", "false")
    assert tiers.batch_put_from_ptr(keys(4), src.ptrs(), src.sizes(4)) == [True] * 4
    assert ssd.batch_exists(keys(4)) == [True] * 4
    tiers.close()


def test_a_page_is_stored_only_into_tiers_holding_no_part_of_it() -> None:
    """Real tiering over doubles: DRAM holds V of a page but not K (a partial eviction); a new
    write of the page must not add its K beside the old V. The page is read whole from SSD."""
    dram, ssd = MemoryUMBPClient(1 << 20), MemoryUMBPClient(1 << 24, max_batch=16)
    tiers = TieredClient(dram, ssd, write_policy="write_through", parts_per_page=2)
    a, b = Buf(2), Buf(2)
    ks = ["p/k", "p/v"]
    assert tiers.batch_put_from_ptr(ks, a.ptrs(), a.sizes(2)) == [True, True]
    del dram._data["p/k"]  # mori evicted K only
    assert tiers.batch_put_from_ptr(ks, b.ptrs(), b.sizes(2)) == [True, True]
    assert dram.batch_exists(ks) == [False, True]  # DRAM was not given B's K
    dst = Buf(2)
    assert tiers.batch_get_into_ptr(ks, dst.ptrs(), dst.sizes(2)) == [True, True]
    assert [dst.item(0), dst.item(1)] == [a.item(0), a.item(1)]
    assert tiers.tier_stats().partial_pages_skipped == 1
    tiers.close()
