"""A scaled slice of a trace for served pods: prompts made from hash ids, capacities that make
every tier evict, and the model's prediction at the boundary with the served check."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from hicache_operator.planner.trace_model import (
    TIERS,
    Policy,
    RouterConfig,
    Trace,
    load_trace,
    model_for_slice,
    pressure_capacities,
    prompt_ids,
    scale_trace,
)
from hicache_operator.planner.trace_model.served import block_token_ids, scaled_length
from hicache_operator.planner.trace_model.trace import Request

pytestmark = pytest.mark.unit
VOCAB = 512  # the CPU test models' vocabulary (tests/cpu_engine: ids 0, 1 are BOS, EOS)
PAGE = 32


@functools.cache
def _conversation() -> Trace:
    return load_trace("mooncake-conversation")


def test_block_tokens_are_a_function_of_the_hash_id_alone() -> None:
    assert block_token_ids(7, 32, vocab=VOCAB) == block_token_ids(7, 32, vocab=VOCAB)
    assert block_token_ids(7, 32, vocab=VOCAB) != block_token_ids(8, 32, vocab=VOCAB)
    assert block_token_ids(7, 32, vocab=VOCAB, seed=1) != block_token_ids(7, 32, vocab=VOCAB)
    # the same ids in every process and Python version (random's str seeding is SHA-512 based)
    assert block_token_ids(0, 8, vocab=VOCAB) == [301, 347, 295, 452, 301, 404, 51, 133]
    ids = block_token_ids(3, 5000, vocab=VOCAB)
    assert min(ids) >= 2 and max(ids) < VOCAB


def test_equal_hash_ids_give_equal_prefixes_and_no_more() -> None:
    a = Request(0, 3 * PAGE + 5, 1, (10, 11, 12, 13))
    b = Request(0, 3 * PAGE, 1, (10, 11, 14))
    pa, pb = prompt_ids(a, PAGE, vocab=VOCAB), prompt_ids(b, PAGE, vocab=VOCAB)
    assert len(pa) == 3 * PAGE + 5 and len(pb) == 3 * PAGE
    assert pa[:2 * PAGE] == pb[:2 * PAGE]
    assert pa[2 * PAGE:3 * PAGE] != pb[2 * PAGE:3 * PAGE]


@pytest.mark.parametrize(("length", "scaled"), [(512, 32), (1024, 64), (513, 33), (700, 44),
                                                (1, 1)])
def test_lengths_scale_block_by_block(length: int, scaled: int) -> None:
    assert scaled_length(length, 512, 32) == scaled


def test_a_scaled_slice_keeps_the_chains_and_their_reuse() -> None:
    trace = _conversation()
    sliced = scale_trace(trace, PAGE, start=100, count=50)
    assert len(sliced.requests) == 50 and sliced.block_tokens == PAGE
    for src, dst in zip(trace.requests[100:150], sliced.requests, strict=True):
        assert dst.blocks == src.blocks
        assert -(-dst.input_length // PAGE) == len(dst.blocks)


def test_pressure_capacities_make_every_tier_evict_and_hit() -> None:
    """The served check's slice (800 requests, one block a 16-token page): every tier evicts
    and serves a meaningful share of the hits."""
    sliced = scale_trace(_conversation(), 16, count=800)
    cap = pressure_capacities(sliced, 16)
    assert cap.device < cap.host < cap.l3_dram < cap.l3_ssd
    assert all(cap.get(t) % 16 == 0 for t in TIERS)
    # write_through: under write_back SGLang never reads L3 behind this trace's hot first
    # block (test_trace_model: the prefetch gate), so L3 could not hit.
    pred = model_for_slice(sliced, cap, Policy(page_size=16, write_policy="write_through"),
                           samples=4)
    hits = sum(pred.hit_tokens.values())
    for tier in TIERS:
        assert pred.evicted_tokens[tier] > 0, tier
        assert pred.hit_tokens[tier] > 0.15 * hits, (tier, pred.hit_tokens)


def test_served_vs_model_is_served_over_predicted_per_tier() -> None:
    sliced = scale_trace(_conversation(), PAGE, count=200)
    pred = model_for_slice(sliced, pressure_capacities(sliced, PAGE),
                           Policy(page_size=PAGE, prefetch_threshold=PAGE))
    served = {t: n // 2 for t, n in pred.hit_tokens.items()}
    ratios = pred.served_vs_model(served)
    assert set(ratios) == {f"served_vs_model_{t}" for t, n in pred.hit_tokens.items() if n}
    assert all(abs(r - 0.5) < 0.01 for r in ratios.values())


def test_the_ssd_prediction_is_the_mean_over_key_to_set_maps() -> None:
    """Our SSD tier's key -> set map is a SHA-256 the trace cannot give: each replay draws one,
    and the prediction is their mean, with the spread beside it."""
    sliced = scale_trace(_conversation(), 16, count=800)
    cap = pressure_capacities(sliced, 16)
    pred = model_for_slice(sliced, cap, Policy(page_size=16, write_policy="write_through"),
                           samples=4)
    ssd = [r.hit_tokens["l3_ssd"] for r in pred.results]
    assert len(set(ssd)) > 1  # the map matters near the tier's capacity
    low, high = pred.hit_spread["l3_ssd"]
    assert (low, high) == (min(ssd), max(ssd))
    assert pred.hit_tokens["l3_ssd"] == round(sum(ssd) / 4)
    assert pred.hit_spread["device"][0] == pred.hit_spread["device"][1]  # the GPU has no sets


def test_two_pods_behind_the_cache_aware_router_are_predicted_over_its_draws() -> None:
    """smg picks among equally good pods in a way no replay can: two cache-aware pods get one
    replay per draw (the mean, with the spread of the hit ratio); round-robin leaves nothing
    to chance and gets one."""
    sliced = scale_trace(_conversation(), 16, count=300)
    cap = replace(pressure_capacities(sliced, 16), l3_ssd=0)
    policy = Policy(page_size=16, write_policy="write_through")
    aware = model_for_slice(sliced, cap, policy, pods=2,
                            router=RouterConfig(policy="cache_aware"), samples=6)
    ratios = [r.hit_ratio for r in aware.results]
    assert len(ratios) == 6 and len(set(ratios)) > 1
    assert aware.hit_ratio_spread == (min(ratios), max(ratios))
    assert min(ratios) <= aware.hit_ratio <= max(ratios)
    robin = model_for_slice(sliced, cap, policy, pods=2,
                            router=RouterConfig(policy="round_robin"), samples=6)
    assert len(robin.results) == 1
