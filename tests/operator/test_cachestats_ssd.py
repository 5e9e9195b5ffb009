"""status.cache splits L3 hits into the UMBP DRAM and SSD tiers and reports the SSD tier.

Real: SGLang's page is the real ``/metrics`` page of the standalone CPU pod after an engine
restart and one L3 hit (captured by the pod tier, with what SGLang told the request); our
store's series are written by the store's real exporter (``hicache_umbp.store.metrics``, in
prometheus_client's multiprocess mode as SGLang runs it) for chosen stats
(``tests/support/store_series.py``: 35 of the 105 L3 pages from DRAM, 70 from SSD). Nothing
else is faked.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import support.sglang_pages as P
import support.store_series as S
from hicache_operator.cachestats.observer import CacheObservation
from hicache_operator.cachestats.sglang_metrics import aggregate, increase, parse_pod
from hicache_operator.cachestats.status_block import cache_block

pytestmark = pytest.mark.unit

RESTARTED = P.page(P.STANDALONE_RESTARTED)
SERIES = S.FIXTURE.read_text()
PAGE = S.page_with_store_series(RESTARTED, SERIES)
TIERS = [{"tier": "Host", "capacityBytes": 1}]
STORAGE = 1680  # the one request's storage tokens, as SGLang told it
PROMPT = 1681


def _samples(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line and not line.startswith("#"))


def _observation(figures: Any) -> CacheObservation:
    return CacheObservation(figures=figures, read=1, failed=(), window_seconds=300)


def test_the_fixture_is_what_the_stores_exporter_writes() -> None:
    assert _samples(SERIES) == _samples(S.store_series(S.AFTER_RESTART_STATS))


def test_l3_hits_are_split_by_the_pages_each_tier_served() -> None:
    """1,680 storage tokens of 1,681 prompt tokens; the store served 35 pages from DRAM and 70
    from SSD in the same span: DRAM 1,680 x 35/105 = 560 tokens, SSD 1,120."""
    assert P.told(P.STANDALONE_RESTARTED)[0]["cached_tokens_details"]["storage"] == STORAGE
    f = aggregate([parse_pod(PAGE)])
    assert f.hit_ratio("storage") == pytest.approx(STORAGE / PROMPT)
    assert f.hit_ratio("l3Dram") == pytest.approx(560 / PROMPT)
    assert f.hit_ratio("l3Ssd") == pytest.approx(1120 / PROMPT)
    # the window from a scrape before anything was read: the same split
    zero = parse_pod(S.store_series(S.ZERO_STATS))
    w = aggregate([increase(parse_pod(PAGE), zero)])
    assert w.hit_ratio("l3Ssd") == pytest.approx(1120 / PROMPT)


def test_without_the_stores_series_the_split_is_unknown() -> None:
    """SGLang's page alone (our store's families absent, as with SGLang's built-in backend):
    storage is known, its split is not."""
    f = aggregate([parse_pod(RESTARTED)])
    assert f.hit_ratio("storage") == pytest.approx(STORAGE / PROMPT)
    assert f.hit_ratio("l3Dram") is None and f.hit_ratio("l3Ssd") is None
    block = cache_block(TIERS, _observation(f), None, 0.02)
    assert block is not None and "l3Ssd" not in block["hitRatio"] and "ssd" not in block


def test_ssd_bandwidth_and_fill() -> None:
    """70 pages x 2 parts x 24,576 B = 3,440,640 B read in 3.5 ms: 983,040,000 B/s; written
    5,160,960 B in 7 ms: 737,280,000 B/s; 210 of 43,680 slots hold page parts."""
    f = aggregate([parse_pod(PAGE)])
    assert f.ssd_bandwidth("read") == pytest.approx(983_040_000)
    assert f.ssd_bandwidth("write") == pytest.approx(737_280_000)
    assert (f.ssd_pages, f.ssd_capacity_pages) == (210, 43_680)
    block = cache_block(TIERS, _observation(f), None, 0.02)
    assert block is not None
    assert block["ssd"] == {"readBytesPerSecond": 983_040_000,
                            "writeBytesPerSecond": 737_280_000, "pages": 210,
                            "capacityPages": 43_680, "evictions": 0, "readErrors": 0,
                            "writeErrors": 0}
    assert block["hitRatio"]["l3Dram"] == round(560 / PROMPT, 3)
    assert block["hitRatio"]["l3Ssd"] == round(1120 / PROMPT, 3)


def test_ranks_share_the_drives_pages_but_add_their_bytes() -> None:
    """Two ranks of one pod: the pages and capacity gauges are the pod's (the same on each
    rank: the maximum, never the sum), bytes and seconds are each rank's own (summed)."""
    two = S.store_series({0: S.AFTER_RESTART_STATS[0], 1: S.AFTER_RESTART_STATS[0]})
    assert len(re.findall(r'^hicache_umbp_ssd_pages\{local_rank="[01]"\} 210\.0$', two,
                          re.MULTILINE)) == 2
    pod = parse_pod(two)
    assert (pod.ssd_pages, pod.ssd_capacity_pages) == (210, 43_680)
    assert pod.ssd_read_bytes == 2 * 3_440_640 and pod.l3_read_pages == {"dram": 70, "ssd": 140}
    f = aggregate([pod, pod])  # two pods: their drives add up
    assert (f.ssd_pages, f.ssd_capacity_pages) == (420, 87_360)
    assert f.ssd_bandwidth("read") == pytest.approx(983_040_000)  # bytes / seconds


def test_disk_write_errors_make_l3_writes_failing_and_rewrite_the_block() -> None:
    failing = {0: {**S.AFTER_RESTART_STATS[0], "disk": {
        **S.AFTER_RESTART_STATS[0]["disk"], "write_errors": 3}}}
    f = aggregate([increase(parse_pod(S.page_with_store_series(
        RESTARTED, S.store_series(failing))), parse_pod(S.store_series(S.ZERO_STATS)))])
    assert f.l3_writes == "Failing"
    ok = cache_block(TIERS, _observation(aggregate([parse_pod(PAGE)])), None, 0.02)
    assert ok is not None
    block = cache_block(TIERS, _observation(f), ok, 0.02)
    assert block is not None
    assert block["ssd"]["writeErrors"] == 3 and block["l3Writes"] == "Failing"


def test_the_ssd_block_is_kept_while_its_figures_move_little() -> None:
    """A bandwidth 1 % off and one more page keep the block verbatim (no status write); a
    bandwidth 10 % off replaces it."""
    first = cache_block(TIERS, _observation(aggregate([parse_pod(PAGE)])), None, 0.02)
    assert first is not None
    near = {**first, "ssd": {**first["ssd"], "readBytesPerSecond": 973_209_600, "pages": 211}}
    assert cache_block(TIERS, _observation(aggregate([parse_pod(PAGE)])), near, 0.02) == near
    far = {**first, "ssd": {**first["ssd"], "readBytesPerSecond": 884_736_000}}
    again = cache_block(TIERS, _observation(aggregate([parse_pod(PAGE)])), far, 0.02)
    assert again is not None and again["ssd"] == first["ssd"]
