"""The trace model against the Mooncake paper (FAST'25) on its own published traces.

The paper (Table 2, §5.3.1, Figure 9): the conversation trace has 12,031 requests, an average
input of 12,035 tokens and a 40% prefix cache ratio; "a local cache with a 3M token capacity
does not achieve 50% of the theoretical maximum hit rate", and "a cache capacity of 50M tokens
nearly reaches the theoretical maximum hit rate". The synthetic trace: 3,993 requests, 15,325
tokens on average, 66%. The model gives 37.4% (conversation) and 65.1% (synthetic) for the
unbounded cache; these tests pin what it gives, with the paper's figures as the bounds.
"""

from __future__ import annotations

import functools

import pytest
from hicache_operator.planner.trace_model import (
    Trace,
    load_trace,
    single_lru,
    theoretical_hit,
)

pytestmark = pytest.mark.unit
FEW_POINTS = 0.03


@functools.cache
def _trace(name: str) -> Trace:
    return load_trace(name)


@pytest.mark.parametrize(("name", "requests", "avg_input"), [
    ("mooncake-conversation", 12_031, 12_035),
    ("mooncake-synthetic", 3_993, 15_325),
])
def test_the_published_traces_are_the_papers(name: str, requests: int, avg_input: int) -> None:
    trace = _trace(name)
    assert len(trace.requests) == requests
    assert round(trace.prompt_tokens / requests) == avg_input
    assert trace.block_tokens == 512


@pytest.mark.parametrize("name", ["mooncake-conversation", "mooncake-synthetic"])
def test_hash_ids_are_prefix_hashes(name: str) -> None:
    """Each id sits at one chain position under one parent: a block can be keyed by its id."""
    position: dict[int, int] = {}
    parent: dict[int, int] = {}
    for req in _trace(name).requests:
        for i, key in enumerate(req.blocks):
            assert position.setdefault(key, i) == i
            assert parent.setdefault(key, req.blocks[i - 1] if i else -1) == (
                req.blocks[i - 1] if i else -1)


@pytest.mark.parametrize(("name", "paper"), [
    ("mooncake-conversation", 0.40), ("mooncake-synthetic", 0.66)])
def test_theoretical_hit_ratio_is_within_a_few_points_of_the_paper(name: str,
                                                                   paper: float) -> None:
    assert abs(theoretical_hit(_trace(name)) - paper) <= FEW_POINTS


def test_a_3m_token_lru_reaches_less_than_half_of_the_theoretical_hit_ratio() -> None:
    trace = _trace("mooncake-conversation")
    ceiling = theoretical_hit(trace)
    local = single_lru(trace, 3_000_000).hit_ratio
    assert 0 < local < 0.5 * ceiling


def test_a_50m_token_lru_reaches_nearly_all_of_it() -> None:
    trace = _trace("mooncake-conversation")
    ceiling = theoretical_hit(trace)
    pooled = single_lru(trace, 50_000_000).hit_ratio
    assert 0.95 * ceiling <= pooled <= ceiling


def test_the_lru_curve_rises_with_capacity_to_the_ceiling() -> None:
    trace = _trace("mooncake-conversation")
    ratios = [single_lru(trace, c).hit_ratio for c in (1_000_000, 10_000_000, 200_000_000)]
    assert ratios == sorted(ratios)
    assert ratios[-1] == pytest.approx(theoretical_hit(trace), abs=1e-3)
