"""The trace model's policies on small hand-made traces: prefix matching, pages, the prefetch
threshold, the write policies, promotion, leaf-first eviction, routing, estimates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hicache_operator.planner.trace_model import (
    Policy,
    RouterConfig,
    TierTokens,
    Trace,
    estimate,
    model_for_slice,
    replay,
    theoretical_hit,
    verdicts,
)
from hicache_operator.planner.trace_model.estimate import tier_rates
from hicache_operator.planner.trace_model.pod import PodCache
from hicache_operator.planner.trace_model.routing import Router
from hicache_operator.planner.trace_model.served import SSD_SAMPLES
from hicache_operator.planner.trace_model.tiers import (
    MoriDramTier,
    SetAssociativeTier,
)
from hicache_operator.planner.trace_model.trace import Request

pytestmark = pytest.mark.unit
B = 4  # tokens per block in these traces
# Plain LRU tiers: these traces test SGLang's policies; mori's DRAM watermarks and our SSD
# tier's sets have tests of their own below.
def lru_policy(**kw: Any) -> Policy:
    return Policy(dram_watermarks=None, ssd_ways=None, **kw)


FREE = lru_policy(page_size=1, prefetch_threshold=0)


def _trace(chains: Sequence[Sequence[int]], *, gap_ms: int = 1000) -> Trace:
    return Trace("t", B, tuple(Request(i * gap_ms, B * len(c), 1, tuple(c))
                               for i, c in enumerate(chains)))


def _serve(cache: PodCache, chain: Sequence[int], length: int | None = None) -> tuple[int, ...]:
    length = B * len(chain) if length is None else length
    sizes = [B] * len(chain)
    sizes[-1] = length - B * (len(chain) - 1)
    return cache.serve(tuple(chain), sizes, length)


def test_a_request_hits_the_longest_cached_prefix_only() -> None:
    cache = PodCache(TierTokens(100, 0, 0, 0), FREE)
    _serve(cache, [1, 2, 3])
    assert _serve(cache, [1, 2, 9, 3]) == (8, 0, 0, 0)  # block 3 after a miss is no hit
    assert _serve(cache, [5, 2]) == (0, 0, 0, 0)


def test_hits_are_whole_pages_and_keep_the_last_token() -> None:
    cache = PodCache(TierTokens(100, 0, 0, 0), lru_policy(page_size=3, prefetch_threshold=0))
    _serve(cache, [1, 2, 3])
    assert _serve(cache, [1, 2, 7])[0] == 6  # 8 tokens matched, 2 pages of 3
    assert _serve(cache, [1, 2, 3])[0] == 9  # 12 tokens, at most 11 reusable: 3 pages
    wide = PodCache(TierTokens(100, 0, 0, 0), lru_policy(page_size=8, prefetch_threshold=0))
    _serve(wide, [1, 2, 3])
    assert _serve(wide, [1, 2, 7])[0] == 8  # a page spans two blocks: both must match
    assert _serve(wide, [1, 7])[0] == 0


def test_the_tail_past_the_last_whole_page_takes_no_room() -> None:
    """SGLang caches whole pages only: a prompt's tail past its last whole page is never in a
    tier, so it neither hits later nor pushes anything out (the served check: a 16-token page
    per trace block, each request ending in a shorter block)."""
    cache = PodCache(TierTokens(8, 100, 100, 100), lru_policy(page_size=4, prefetch_threshold=0,
                                                             write_policy="write_through"))
    _serve(cache, [1, 2, 3], length=10)  # blocks of 4, 4 and 2 tokens: two whole pages
    assert dict(cache.device.entries) == {1: 4, 2: 4} and cache.device.used == 8
    for tier in (cache.host, cache.l3_dram, cache.l3_ssd):
        assert set(tier.entries) == {1, 2}
    assert cache.device.evicted_tokens == 0  # the 2-token tail did not push block 1 out
    wide = PodCache(TierTokens(100, 0, 0, 0), lru_policy(page_size=8, prefetch_threshold=0))
    _serve(wide, [1, 2, 3], length=12)  # one whole page of 8: block 1 whole, block 2 half
    assert dict(wide.device.entries) == {1: 4, 2: 4}


def test_the_stores_own_set_map_places_the_ssd_pages() -> None:
    """``Policy.ssd_set_hash`` (the served check's map from the store's keys) decides the sets:
    every part in set 0 leaves one 4-way set holding two pages of two parts."""
    policy = Policy(page_size=B, prefetch_threshold=0, write_policy="write_through",
                    ssd_ways=4, dram_watermarks=None, ssd_set_hash=lambda block, part: 0)
    cache = PodCache(TierTokens(1, 100, 0, 16), policy)
    for key in range(1, 6):
        _serve(cache, [key], length=B)
    assert isinstance(cache.l3_ssd, SetAssociativeTier) and len(cache.l3_ssd.sets) == 2
    assert list(cache.l3_ssd.entries) == [4, 5] and not cache.l3_ssd.sets[1]
    trace = _trace([[1], [2]])
    assert len(model_for_slice(trace, TierTokens(1, 100, 0, 16), policy).results) == 1
    assert len(model_for_slice(trace, TierTokens(1, 100, 0, 16),
                               replace(policy, ssd_set_hash=None)).results) == SSD_SAMPLES


def test_write_back_fills_host_and_l3_only_when_the_device_evicts() -> None:
    cache = PodCache(TierTokens(8, 100, 100, 100), FREE)
    _serve(cache, [1, 2])
    assert not cache.host.entries and not cache.l3_dram.entries
    _serve(cache, [3, 4])  # pushes 1, 2 out of the device
    assert set(cache.host.entries) == {1, 2}
    assert set(cache.l3_dram.entries) == set(cache.l3_ssd.entries) == {1, 2}
    assert _serve(cache, [1, 2, 5]) == (0, 8, 0, 0)


def test_write_through_fills_host_and_l3_at_once() -> None:
    cache = PodCache(TierTokens(8, 100, 100, 100), lru_policy(page_size=1, prefetch_threshold=0,
                                                          write_policy="write_through"))
    _serve(cache, [1, 2])
    assert set(cache.host.entries) == set(cache.l3_ssd.entries) == {1, 2}


def test_write_through_selective_writes_a_page_on_its_second_use_on_the_device() -> None:
    cache = PodCache(TierTokens(8, 100, 100, 0), lru_policy(
        page_size=1, prefetch_threshold=0, write_policy="write_through_selective"))
    _serve(cache, [1, 2])
    assert not cache.host.entries
    _serve(cache, [1, 3])
    assert set(cache.host.entries) == set(cache.l3_dram.entries) == {1}
    _serve(cache, [4, 5])  # 2 and 3 leave the device after one use each: gone
    _serve(cache, [6, 7])
    assert _serve(cache, [1, 2, 9]) == (0, 4, 0, 0)


def test_an_l3_hit_is_promoted_to_host_and_device_and_ssd_hits_into_dram() -> None:
    cache = PodCache(TierTokens(8, 16, 16, 100), FREE)
    for chain in ([1, 2], [3, 4], [5, 6], [7, 8]):
        _serve(cache, chain)
    assert 1 not in cache.l3_dram.entries and 1 in cache.l3_ssd.entries
    assert _serve(cache, [1, 2]) == (0, 0, 0, 7)  # a whole-prompt hit keeps its last token
    assert {1, 2} <= set(cache.l3_dram.entries) and {1, 2} <= set(cache.host.entries)
    assert _serve(cache, [1, 2]) == (7, 0, 0, 0)


def test_promote_on_hit_off_leaves_dram_alone() -> None:
    cache = PodCache(TierTokens(8, 8, 8, 100), lru_policy(page_size=1, prefetch_threshold=0,
                                                      promote_on_hit=False))
    for chain in ([1, 2], [3, 4], [5, 6], [7, 8], [1, 2]):
        _serve(cache, chain)
    assert 1 not in cache.l3_dram.entries


def test_the_prefetch_threshold_recomputes_small_l3_hits() -> None:
    def l3_hit(threshold: int) -> int:
        cache = PodCache(TierTokens(4, 4, 100, 0), lru_policy(page_size=1,
                                                           prefetch_threshold=threshold))
        for chain in ([1, 2], [3], [4], [5]):
            _serve(cache, chain)
        return _serve(cache, [1, 2, 6])[2]

    assert l3_hit(8) == 8
    assert l3_hit(9) == 0


def test_l3_is_read_only_past_a_match_ending_at_a_page_with_a_host_copy() -> None:
    """SGLang's prefetch gate (``is_backuped(last_host_node)``): under write_back a prefix
    still only on the device has no host copy, and a request matching it never reads L3."""
    def hits(policy: str) -> tuple[int, ...]:
        cache = PodCache(TierTokens(8, 8, 100, 0), lru_policy(page_size=1, prefetch_threshold=0,
                                                              write_policy=policy))
        for chain in ([1, 2], [3, 4], [5, 6], [7, 8], [9], [9]):  # 9 hot, 1, 2 only in L3
            _serve(cache, chain)
        assert 1 in cache.l3_dram.entries and 1 not in cache.host.entries
        assert 9 in cache.device.entries
        return _serve(cache, [9, 1, 2, 5])

    assert hits("write_back") == (4, 0, 0, 0)  # 9 is on the device only: no L3 lookup
    # 9 has its host copy: 1, 2, 5 from L3 (the last token recomputed)
    assert hits("write_through") == (4, 0, 11, 0)


def test_mori_dram_evicts_by_watermarks_at_the_end_of_each_put_call() -> None:
    """mori 1.2.4: a put call takes keys while there is room (refusing one past the capacity),
    and at the end of the call, at 90% or more, it drops its LRU keys to 70%."""
    tier = MoriDramTier(10, (0.7, 0.9), 1)
    for key in range(8):
        tier.add(key, 1, None)
    tier.end_call()
    assert tier.used == 8 and tier.evicted_tokens == 0
    tier.touch(0)
    for key in range(8, 11):  # one call: 9 and 10 keys held, the 11th refused
        tier.add(key, 1, None)
    assert tier.used == 10 and 10 not in tier.entries and tier.evicted_tokens == 0
    tier.end_call()
    assert [block for block, _ in tier.keys] == [4, 5, 6, 7, 0, 8, 9]
    assert tier.evicted_tokens == 3


def test_mori_dram_evicts_keys_so_a_page_can_keep_one_part() -> None:
    """mori evicts keys, not pages: a round can take a page's K and keep its V. The page is no
    DRAM hit then, and the store does not write it into DRAM again while a part is there."""
    tier = MoriDramTier(20, (0.55, 0.9), 2)  # pages of 2 tokens, one key a token
    for key in range(9):
        tier.add(key, 2, None)
    tier.end_call()  # 18 >= 18: down to 11 keys
    assert tier.used == 11 and sorted(tier.entries) == [4, 5, 6, 7, 8]
    assert tier.partial == {3: 1}  # page 3 lost its K; its V is the least recent key
    tier.add(3, 2, None)  # the store skips a page DRAM holds a part of
    tier.touch(3)  # and it is no hit
    assert tier.partial == {3: 1} and tier.used == 11 and next(iter(tier.keys)) == (3, 1)
    for key in range(9, 13):
        tier.add(key, 2, None)
    tier.end_call()  # 19: page 3's V goes first, then 4 to 6 and 7's K
    assert tier.partial == {7: 1} and sorted(tier.entries) == [8, 9, 10, 11, 12]
    assert tier.used == 11 and tier.evicted_tokens == 15


def test_dram_calls_end_with_sglangs_storage_batches() -> None:
    """A request's backups are put in calls of 128 pages, and DRAM evicts only when a call
    ends: a call that crosses 90% keeps all its pages (evicting at the page that crossed
    would have left 160 pages, not 140)."""
    policy = Policy(page_size=1, prefetch_threshold=0, write_policy="write_through",
                    ssd_ways=None)
    cache = PodCache(TierTokens(1, 1000, 200, 0), policy)
    first = list(range(1, 171))  # 170 pages: calls of 128 and 42, below 90% (180)
    cache.serve(tuple(first), [1] * 170, 171)
    assert cache.l3_dram.used == 170
    second = list(range(1001, 1031))  # one call to 200, then down to 70% (140)
    cache.serve(tuple(second), [1] * 30, 31)
    assert cache.l3_dram.used == 140 and set(second) <= set(cache.l3_dram.entries)
    assert min(cache.l3_dram.entries) == 61  # the 60 least recent pages of the first request


def test_our_ssd_tier_loses_a_page_with_its_first_part_and_stores_it_whole_when_rewritten(
        ) -> None:
    tier = SetAssociativeTier(4, 1, 2, 1)  # 4 one-token pages, K and V: 8 one-way sets
    a = 0
    b = next(k for k in range(1, 1000) if tier._set(k, 0) is tier._set(a, 0)
             and tier._set(k, 1) is not tier._set(a, 1))
    tier.add(a, 1, None)
    tier.add(b, 1, None)  # takes a's K slot: a is gone, its V part stays
    assert a not in tier.entries and b in tier.entries and tier.partial == {a: 1}
    assert tier.evicted_tokens == 1
    # Written again, a's V part is removed and a stored whole (TieredClient._whole_again): its
    # K takes b's K slot back, so b is the partial page now.
    tier.add(a, 1, None)
    assert a in tier.entries and b not in tier.entries and tier.partial == {b: 1}
    assert sum(len(s) for s in tier.sets) == 3  # a's K and V, b's V: no stale part of a left
    assert tier.used == 1 and tier.evicted_tokens == 2


def test_eviction_takes_a_chains_leaves_before_its_root() -> None:
    cache = PodCache(TierTokens(12, 0, 0, 0), FREE)
    _serve(cache, [1, 2, 3])
    _serve(cache, [9])  # one block over: the leaf 3 goes, not the root 1
    assert list(cache.device.entries) == [2, 1, 9]
    assert _serve(cache, [1, 2, 3])[0] == 8


def test_theoretical_hit_counts_every_block_seen_before() -> None:
    trace = _trace([[1, 2], [1, 2, 3], [4]])
    # the second request reuses [1, 2] (8 of its 12 tokens); nothing else repeats
    assert theoretical_hit(trace) == pytest.approx(8 / 24)


def _sessions(sessions: int, turns: int, blocks_per_turn: int) -> Trace:
    """Multi-turn sessions interleaved round by round: each turn extends its session's chain."""
    chains: list[list[int]] = []
    history = {s: [s * 10_000] for s in range(sessions)}
    for turn in range(turns):
        for s in range(sessions):
            history[s] = history[s] + [s * 10_000 + turn * 100 + k + 1
                                       for k in range(blocks_per_turn)]
            chains.append(list(history[s]))
    return _trace(chains)


def test_round_robin_spreads_and_prefix_hash_sticks_to_the_first_block() -> None:
    trace = _sessions(6, 3, 1)
    rr = replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=3,
                router=RouterConfig(policy="round_robin"))
    assert rr.requests_per_pod == (6, 6, 6)
    ph = replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=3,
                router=RouterConfig(policy="prefix_hash"))
    # each session stays on one pod, so it hits all of its history
    assert ph.hit_tokens["device"] == sum(B * (1 + t) for t in range(1, 3)) * 6


def test_cache_aware_keeps_sessions_and_beats_round_robin_under_pressure() -> None:
    # 7 sessions (not a multiple of the pods, or round-robin would be sticky by accident) of
    # 13 blocks at the end; a pod holds two sessions' histories: the 4 pods hold all 7 once,
    # round-robin needs each on every pod
    trace = _sessions(7, 6, 2)
    cap = TierTokens(2 * 13 * B, 0, 0, 0)
    runs = {p: replay(trace, cap, FREE, pods=4, router=RouterConfig(policy=p))
            for p in ("cache_aware", "round_robin")}
    assert runs["round_robin"].evicted_tokens["device"] > 0
    assert runs["cache_aware"].hit_ratio >= 1.5 * runs["round_robin"].hit_ratio


def test_cache_aware_below_the_threshold_goes_to_the_pod_with_the_fewest_requests() -> None:
    # smg 1.13.0 sends a miss to the least loaded pod by (load, requests routed so far), not
    # to the smallest tree: pod 1 holds 1 block and pod 0 holds 4, but after one request each
    # the third miss is a draw between them, and the fourth goes to the pod the draw left
    trace = _trace([[1, 2, 3, 4], [5], [6], [7]])
    r = replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=2,
               router=RouterConfig(policy="cache_aware", cache_threshold=0.3))
    assert r.requests_per_pod == (2, 2)
    # the second request shares 1 of 4 blocks (0.25 <= 0.3): a miss, so to the idle pod 1
    shared = replay(_trace([[1, 2, 3, 4], [1, 5, 6, 7]]), TierTokens(1000, 0, 0, 0), FREE,
                    pods=2, router=RouterConfig(policy="cache_aware", cache_threshold=0.3))
    assert shared.requests_per_pod == (1, 1)
    assert shared.hit_tokens["device"] == 0


def test_cache_aware_draws_among_equally_good_pods_by_its_salt() -> None:
    # the second request shares 1 of 4 blocks, a miss, so block 1 is in both pods' trees; the
    # third matches both equally: which pod gets it, and so which one the fourth (its next
    # turn) follows, is a draw, repeatable for one salt
    trace = _trace([[1, 2, 3, 4], [1, 5, 6, 7], [1, 8], [1, 8, 9]])
    chosen = set()
    for salt in range(16):
        rc = RouterConfig(policy="cache_aware", cache_threshold=0.3, salt=salt)
        runs = [replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=2, router=rc)
                for _ in range(2)]
        assert runs[0].requests_per_pod == runs[1].requests_per_pod
        assert runs[0].hit_tokens == runs[1].hit_tokens
        chosen.add(runs[0].requests_per_pod)
    assert chosen == {(3, 1), (1, 3)}


def test_cache_aware_spills_a_matched_pod_only_past_the_mean_by_the_margin() -> None:
    """smg 1.13.0's spill gate: the matched pod is left for the least loaded one when its
    in-flight count is over rel x the mean and over the mean by min(abs, max(2 sqrt(mean), 4))."""

    def second_turn(in_flight: list[int], abs_threshold: int = 64) -> bool:
        router = Router(RouterConfig(policy="cache_aware", balance_abs_threshold=abs_threshold,
                                     balance_rel_threshold=1.5), 2)
        first = router.route((1, 2), [B, B], 2 * B, 0.0)
        router.in_flight = in_flight if first == 0 else in_flight[::-1]
        return router.route((1, 2, 3), [B, B, B], 3 * B, 0.0) == first

    assert second_turn([0, 0])  # the follow-up stays with its prefix
    assert second_turn([8, 0])  # mean 4: 8 is 1.5x over it but only 4 (the margin) above
    assert not second_turn([10, 0])  # mean 5: 10 is 5 above, over 2 sqrt(5) = 4.47
    assert not second_turn([8, 0], abs_threshold=2)  # the threshold caps the margin
    assert second_turn([100, 90])  # far above 4 over the mean, but not 1.5x of it


def test_replay_follows_given_routes_and_refuses_bad_ones() -> None:
    trace = _sessions(3, 2, 1)
    routes = [i % 2 for i in range(len(trace.requests))]
    given = replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=2, routes=routes)
    rr = replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=2,
                router=RouterConfig(policy="round_robin"))
    assert given.hit_tokens == rr.hit_tokens and given.router == "given routes"
    for bad in (routes[:-1], [2] * len(routes)):
        with pytest.raises(ValueError, match="routes must name one of 2 pods"):
            replay(trace, TierTokens(1000, 0, 0, 0), FREE, pods=2, routes=bad)


def test_tier_rates_follow_the_bytes_a_hit_reads() -> None:
    rates = tier_rates({"host": 50.0, "l3_dram": 10.0, "l3_ssd": 1.0}, 1_000_000, 8_000_000)
    assert rates["host"] == pytest.approx(50_000)
    # L3 then host: 1 / (1/1250 + 1/50000)
    assert rates["l3_dram"] == pytest.approx(1 / (1 / 1250 + 1 / 50_000))
    assert rates["l3_ssd"] < rates["l3_dram"] < rates["host"]


def test_verdicts_name_a_tier_slower_than_recompute_and_one_the_set_fits_above() -> None:
    trace = _sessions(4, 4, 2)
    r = replay(trace, TierTokens(10_000, 100, 100, 100), FREE)
    est = estimate(r, prefill_tokens_per_s=1000.0, bandwidth={
        "host": 50.0, "l3_dram": 10.0, "l3_ssd": 1e-6}, token_bytes=1000, l3_read_bytes=1000)
    out = verdicts(r, est, footprint=9 * 4 * B)
    assert any(v.startswith("host: buys nothing: the trace's working set") for v in out)
    assert any(v.startswith("l3_ssd: reads slower than recompute") for v in out)
    assert est.ttft_s < est.ttft_cold_s  # device hits, free


def test_a_plans_tiers_come_from_the_planners_sizing() -> None:
    from hicache_operator.api import OperatorConfig
    from hicache_operator.plan import plan
    from hicache_operator.planner.trace_model import pod_model, router_config
    from shc_testlib import load_example

    cr = load_example("deepseek-r1-mi355x.yaml")
    cr["spec"]["replicas"] = 2
    p = plan(cr, OperatorConfig())
    model = pod_model(p.spec, p.sizing, p.gpu_model)
    assert p.router is not None and p.router.sizing.pod_tokens is not None
    tokens = p.router.sizing.pod_tokens
    # the router's tokens per pod and the device pool: 288 GiB x 0.85 - 642 GiB / 8, / 70,272 B
    assert (model.capacity.host, model.capacity.l3_ssd) == (tokens.host, tokens.l3_ssd) == (
        3_055_959, 46_939_533)
    assert tokens.l3_dram == 7_823_255
    # mori allocates each 4,497,408 B part in whole 64 KiB pages: 69 of them
    assert model.capacity.l3_dram == 512 * 1024**3 // (69 * 65536) * 64 == 7_780_736
    assert model.capacity.device == int(288 * 1024**3 * 0.85 - 642 * 1024**3 // 8) // 70_272
    assert model.token_bytes == 70_272 and model.l3_read_bytes_per_token == 8 * 70_272
    assert model.policy == Policy(page_size=64, write_policy="write_back",
                                  prefetch_threshold=256, promote_on_hit=True, page_parts=1)
    rc = router_config(p.spec, p.router, 2)
    assert rc.policy == "cache_aware" and rc.cache_threshold == 0.3
    assert rc.tree_tokens == p.router.sizing.tree_chars // 4  # per pod, as smg evicts
    assert router_config(p.spec, None, 2).policy == "round_robin"
