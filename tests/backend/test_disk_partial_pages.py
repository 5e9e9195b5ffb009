"""Our SSD tier behind the store's tiering: a page that lost one of its parts to the SSD's
eviction is written whole again by the next put of it. Before, the put skipped a page the SSD
held part of, answered *not stored*, and the page stayed unreadable until its other part aged
out (found by the trace model's served check near capacity).

Real: :class:`TieredClient` and our :class:`DiskStore` on this machine's filesystem with its own
eviction (one 16-way set: the least recently used part goes). Faked: the DRAM tier (the
in-memory double of ``support.memory_client``, which passes the client contract; real mori DRAM
in front of this tier is ``test_warm_cache_mori.py``), emptied by hand as mori evicts.
"""

from __future__ import annotations

from pathlib import Path

from hicache_umbp.store.tiers import TieredClient
from support.memory_client import MemoryUMBPClient

from .test_disk_store import VALUE, Pages, _open


def test_a_page_that_lost_a_part_on_ssd_is_written_whole_again(tmp_path: Path) -> None:
    pages = Pages(32, VALUE, seed=5)
    ssd = _open(tmp_path, capacity=16 * VALUE)  # one set of 16 ways
    dram = MemoryUMBPClient(1 << 24)
    tiers = TieredClient(dram, ssd, write_policy="write_through", parts_per_page=2)
    page = ["p/k", "p/v"]
    try:
        assert tiers.batch_put_from_ptr(page, [pages.src(0), pages.src(1)], [VALUE] * 2) == [
            True, True]
        # 15 other values: the 15th finds the set full and evicts the older part of the page.
        fill = [f"f{i}" for i in range(15)]
        assert pages.put(ssd, fill, first=2) == [True] * 15
        assert sum(ssd.batch_exists(page)) == 1
        dram._data.clear()  # mori evicted the page from DRAM too
        assert tiers.batch_exists(page) == [False, False]

        # SGLang writes the page again: it is stored whole, on SSD, byte-exact.
        assert tiers.batch_put_from_ptr(page, [pages.src(0), pages.src(1)], [VALUE] * 2) == [
            True, True]
        assert ssd.batch_exists(page) == [True, True]
        assert pages.get(ssd, page) == [True, True]
        assert pages.same(0) and pages.same(1)
        stats = tiers.tier_stats()
        assert (stats.partial_pages_rewritten, stats.partial_pages_skipped) == (1, 0)
        assert ssd.disk_stats().pages == 16
    finally:
        tiers.close()
        ssd.close()


def test_removed_keys_are_misses_and_free_their_slots(tmp_path: Path) -> None:
    pages = Pages(4, VALUE, seed=6)
    ssd = _open(tmp_path)
    try:
        assert pages.put(ssd, ["a", "b"]) == [True, True]
        assert ssd.batch_remove(["a", "x"]) == [True, False]
        assert ssd.batch_exists(["a", "b"]) == [False, True]
        assert pages.get(ssd, ["a", "b"]) == [False, True]
        assert ssd.disk_stats().pages == 1
    finally:
        ssd.close()
