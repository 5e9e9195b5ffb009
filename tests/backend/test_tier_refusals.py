"""Refused SSD writes never lose an acknowledged page (TieredClient over in-process doubles).

Real: the tiering policy, the write-back ring and its writer thread, the fair retry window and
its SSD read gate, the bytes. Faked: the two mori clients (``MemoryUMBPClient`` doubles, which
pass the same contract suite as real mori); :class:`LeasedSsd` refuses puts the way mori 1.2.4's
SSD node does after a read (its read lease), counted in put calls instead of milliseconds so
the tests count outcomes instead of timing them. ``test_refused_writes_mori.py`` runs the
read-then-write scenario on real mori.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import pytest
from hicache_umbp.store.tiers import TieredClient
from support.memory_client import MemoryUMBPClient

from .test_tiers import Buf, keys, ssd_bytes

WAIT_S = 60.0  # how long a test waits for the writer before it fails (never a measured bound)


class LeasedSsd(MemoryUMBPClient):
    """An SSD double that refuses puts while ``refusing`` is set, and for the next ``lease``
    put calls after every read (mori's read lease)."""

    def __init__(self, *, lease: int = 0) -> None:
        super().__init__(1 << 24, max_batch=16)
        self.lease = lease
        self.refusing = threading.Event()
        self.refused_calls = 0
        self._leased = 0

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        got = super().batch_get_into_ptr(keys, ptrs, sizes)
        with self._lock:
            self._leased = self.lease
        return got

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        with self._lock:
            refuse = self.refusing.is_set() or self._leased > 0
            self._leased = max(0, self._leased - 1)
            if refuse:
                self.refused_calls += 1
        if refuse:
            return [False] * len(keys)
        return super().batch_put_from_ptr(keys, ptrs, sizes)


def tiered(ssd: MemoryUMBPClient, policy: str = "write_back", **kw: object) -> TieredClient:
    kw = {"retry_window_s": 0.05, "retry_pause_s": 0.01, **kw}
    return TieredClient(MemoryUMBPClient(1 << 22), ssd, write_policy=policy,
                        parts_per_page=2, **kw)  # type: ignore[arg-type]


def wait_for(what: Callable[[], bool], label: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not what():
        assert time.monotonic() < deadline, f"timed out waiting for {label}"
        time.sleep(0.005)


def test_write_back_keeps_a_refused_page_readable_until_the_ssd_takes_it() -> None:
    ssd = LeasedSsd()
    ssd.refusing.set()
    tiers = tiered(ssd)
    src, ks = Buf(8), keys(8)
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(8)) == [True] * 8
    wait_for(lambda: tiers.tier_stats().writeback_stalled == 1, "the ring to stall")
    assert tiers.flush() is False  # not drained, and flush says so at once
    tiers.dram._data.clear()  # type: ignore[attr-defined]  # DRAM evicted every page
    dst = Buf(8)
    assert tiers.batch_exists(ks) == [True] * 8
    assert tiers.batch_get_into_ptr(ks, dst.ptrs(), dst.sizes(8)) == [True] * 8
    assert [dst.item(i) for i in range(8)] == [src.item(i) for i in range(8)]
    st = tiers.tier_stats()
    assert (st.writeback_stalls, st.writeback_pending, st.writeback_failed) == (1, 8, 0)
    ssd.refusing.clear()
    wait_for(lambda: tiers.tier_stats().writeback_pending == 0, "the SSD to take the keys")
    assert tiers.flush() is True
    assert [ssd_bytes(ssd, k) for k in ks] == [src.item(i) for i in range(8)]
    st = tiers.tier_stats()
    assert st.writeback_done == 8 and st.writeback_failed == 0 and st.writeback_stalled == 0
    assert st.writeback_retries >= 8
    tiers.close()


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_a_refusal_shorter_than_the_fair_window_costs_nothing(policy: str) -> None:
    ssd = LeasedSsd(lease=3)
    tiers = tiered(ssd, policy, retry_window_s=WAIT_S)
    src, ks = Buf(4), keys(4)
    ssd.batch_get_into_ptr([], [], [])  # a read: the next 3 puts are refused
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(4)) == [True] * 4
    assert tiers.flush() is True
    assert [ssd_bytes(ssd, k) for k in ks] == [src.item(i) for i in range(4)]
    st = tiers.tier_stats()
    retries = st.writeback_retries if policy == "write_back" else st.ssd_retries
    assert retries == 3 * 4 and ssd.refused_calls == 3
    assert st.ssd_refused == st.writeback_stalls == st.writeback_failed == 0
    tiers.close()


def test_write_through_reports_pages_the_ssd_keeps_refusing_as_not_stored() -> None:
    ssd = LeasedSsd()
    ssd.refusing.set()
    tiers = tiered(ssd, "write_through")
    src, ks = Buf(4), keys(4)
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(4)) == [False] * 4
    st = tiers.tier_stats()
    assert st.ssd_refused == 4 and st.ssd_retries > 0
    ssd.refusing.clear()  # the same pages, written again once the SSD takes them: stored
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(4)) == [True] * 4
    assert [ssd_bytes(ssd, k) for k in ks] == [src.item(i) for i in range(4)]
    tiers.close()


def test_a_page_dram_holds_is_not_stored_until_the_ssd_side_has_it() -> None:
    """DRAM holding the page (from an earlier put) does not make a refused re-put stored."""
    ssd = LeasedSsd()
    tiers = tiered(ssd, "write_through")
    src, ks = Buf(2), keys(2)
    tiers.dram.batch_put_from_ptr(ks, src.ptrs(), src.sizes(2))
    ssd.refusing.set()
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(2)) == [False] * 2
    ssd.refusing.clear()
    assert tiers.batch_put_from_ptr(ks, src.ptrs(), src.sizes(2)) == [True] * 2
    assert ssd.batch_exists(ks) == [True] * 2
    tiers.close()


def test_a_stalled_ring_does_not_make_puts_wait_for_room() -> None:
    """With the ring full of keys the SSD refuses, a put would wait ``queue_wait_s`` (an hour
    here: the test would time out) for room that cannot come; it writes synchronously instead,
    and the SSD's refusal makes those pages not stored."""
    ssd = LeasedSsd()
    ssd.refusing.set()
    tiers = tiered(ssd, queue_keys=4, queue_wait_s=3600.0)
    src, ks = Buf(8), keys(8)
    assert tiers.batch_put_from_ptr(ks[:4], src.ptrs(range(4)), src.sizes(4)) == [True] * 4
    wait_for(lambda: tiers.tier_stats().writeback_stalled == 1, "the ring to stall")
    assert tiers.batch_put_from_ptr(ks[4:], src.ptrs(range(4, 8)), src.sizes(4)) == [False] * 4
    st = tiers.tier_stats()
    assert (st.writeback_queued, st.ssd_refused, st.writeback_pending) == (4, 4, 4)
    ssd.refusing.clear()
    tiers.close()
    assert tiers.tier_stats().writeback_failed == 0
    assert [ssd_bytes(ssd, k) for k in ks[:4]] == [src.item(i) for i in range(4)]


def test_close_drops_what_the_ssd_still_refuses_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    ssd = LeasedSsd()
    ssd.refusing.set()
    tiers = tiered(ssd)
    src = Buf(4)
    assert tiers.batch_put_from_ptr(keys(4), src.ptrs(), src.sizes(4)) == [True] * 4
    with caplog.at_level(logging.WARNING, "hicache_umbp.store.tiers"):
        tiers.close()
    st = tiers.tier_stats()
    assert (st.writeback_failed, st.writeback_pending) == (4, 0)
    assert "writeback_failed" in caplog.text


def test_ssd_reads_wait_while_the_writer_holds_a_fair_window() -> None:
    """A reader hammering SSD-only pages renews the lease after every read; without the gate it
    would slip a read between any two write retries and the writer would never get through.
    With it, the writer's third attempt (the lease is two put calls) succeeds."""
    ssd = LeasedSsd(lease=2)
    src = Buf(6)
    ssd.batch_put_from_ptr(keys(2, "old"), src.ptrs([4, 5]), src.sizes(2))
    tiers = tiered(ssd, retry_window_s=WAIT_S, promote_on_hit=False)
    stop = threading.Event()

    def reader() -> None:
        dst = Buf(2)
        while not stop.is_set():
            tiers.batch_get_into_ptr(keys(2, "old"), dst.ptrs(), dst.sizes(2))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for r in range(5):
            ks = keys(4, f"r{r}-")
            assert tiers.batch_put_from_ptr(ks, src.ptrs(range(4)), src.sizes(4)) == [True] * 4
            assert tiers.flush() is True
    finally:
        stop.set()
        t.join()
    st = tiers.tier_stats()
    assert st.writeback_stalls == 0 and st.writeback_done == 20 and st.ssd_hits > 0
    tiers.close()
