"""Replaying a scaled slice of a trace on served pods: prompts, capacities, the prediction.

Served pods need token ids, not hash ids. :func:`prompt_ids` makes them deterministically: each
hash id seeds its own block of token ids (vocabulary-bounded, special ids left out), so equal
hash ids give equal blocks and therefore equal prefixes, and different ones diverge at their
first token with overwhelming probability. The slice is scaled consistently: a 512-token trace
block becomes ``block_tokens`` tokens (e.g. 32 for the CPU test model with pageSize 32), the
last, partial block shrinks in proportion, and capacities are chosen as fractions of the slice's
own working set (:func:`pressure_capacities`) so that every tier evicts.

:func:`model_for_slice` is the boundary with the served check (``served_vs_model_<tier>``): it
returns what the model predicts per tier for the capacities the served pod has. The served side
(the pod tier) sends :func:`prompt_ids` of each request in order with ``max_new_tokens`` 1 and
compares its ``meta_info`` / ``/metrics`` hits per tier with the prediction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .replay import ReplayResult, footprint_tokens, replay
from .routing import RouterConfig
from .tiers import Policy, TierTokens
from .trace import Request, Trace

#: Shares of a slice's working set per tier: every tier smaller than the set, each larger than
#: the one above it (host >= device as SGLang wants), so each one evicts; on the conversation
#: trace's first 800 requests (write-through) each tier then serves a fifth or more of the hits
#: (UMBP DRAM above the host pool: mori keeps 70-90% of it, and what it holds below the host
#: pool's size is in the host pool too).
PRESSURE_FRACTIONS = TierTokens(device=6, host=25, l3_dram=40, l3_ssd=90)  # percent


def block_token_ids(hash_id: int, count: int, *, vocab: int, reserved: int = 2,
                    seed: int = 0) -> list[int]:
    """``count`` token ids for one block, in ``[reserved, vocab)``, a function of the hash id
    (and ``seed``) alone: ids ``< reserved`` are the model's special tokens (BOS, EOS)."""
    if vocab - reserved < 2:
        raise ValueError(f"vocabulary {vocab} leaves fewer than 2 ids above {reserved}")
    rng = random.Random(f"{seed}:{hash_id}")
    return [rng.randrange(reserved, vocab) for _ in range(count)]


def scaled_length(input_length: int, source_block: int, block_tokens: int) -> int:
    """The prompt length at ``block_tokens`` per ``source_block``: whole blocks exactly, the
    last partial block in proportion (at least one token)."""
    full, rest = divmod(input_length, source_block)
    tail = -(-rest * block_tokens // source_block) if rest else 0
    return full * block_tokens + tail


def scale_trace(trace: Trace, block_tokens: int, *, start: int = 0,
                count: int | None = None) -> Trace:
    """The slice ``[start, start + count)`` at ``block_tokens`` per trace block."""
    chosen = trace.requests[start:None if count is None else start + count]
    scaled = tuple(
        Request(r.timestamp_ms, scaled_length(r.input_length, trace.block_tokens, block_tokens),
                r.output_length, r.blocks)
        for r in chosen)
    return Trace(f"{trace.name}[{start}:{start + len(chosen)}]@{block_tokens}", block_tokens,
                 scaled)


def prompt_ids(request: Request, block_tokens: int, *, vocab: int, reserved: int = 2,
               seed: int = 0, cache: dict[int, list[int]] | None = None) -> list[int]:
    """The token ids of a scaled request (:func:`scale_trace`): its blocks' ids, the last one
    cut to the request's length."""
    cache = {} if cache is None else cache
    out: list[int] = []
    for key in request.blocks:
        block = cache.get(key)
        if block is None:
            block = cache[key] = block_token_ids(key, block_tokens, vocab=vocab,
                                                 reserved=reserved, seed=seed)
        out.extend(block)
    return out[:request.input_length]


def prompt_text(request: Request, block_tokens: int, words: list[str], *, seed: int = 0,
                cache: dict[int, list[int]] | None = None) -> str:
    """The prompt of a scaled request as text, for a router that routes on text (smg's
    cache_aware tree holds characters): the ids of :func:`prompt_ids` over ``len(words)``,
    each one a word. ``words`` must each encode to exactly one token, alone and after any other
    (e.g. a byte-level BPE's in-vocabulary words with their leading space), so the text is the
    same number of tokens and equal hashes still give equal pages."""
    ids = prompt_ids(request, block_tokens, vocab=len(words), reserved=0, seed=seed, cache=cache)
    return "".join(words[i] for i in ids)


def pressure_capacities(trace: Trace, page_size: int,
                        percent: TierTokens = PRESSURE_FRACTIONS) -> TierTokens:
    """Tier capacities (tokens, whole pages, at least one page) as percentages of the slice's
    working set."""
    footprint = footprint_tokens(trace)

    def cap(share: int) -> int:
        return max(footprint * share // 100 // page_size, 1) * page_size

    return TierTokens(device=cap(percent.device), host=cap(percent.host),
                      l3_dram=cap(percent.l3_dram), l3_ssd=cap(percent.l3_ssd))


#: Replays averaged per prediction: our SSD tier maps keys to sets by a hash the trace cannot
#: give, and smg picks among equally good pods in a way no replay can (``routing``), so the
#: model predicts the mean over this many maps and draws (and says their spread).
SSD_SAMPLES = 32


@dataclass(frozen=True)
class SlicePrediction:
    """What the model predicts for a served replay of ``trace`` on pods of ``capacity``: the
    mean hit tokens per tier over ``len(results)`` key -> set maps of the SSD tier and draws
    of the router among equally good pods."""

    trace: Trace
    capacity: TierTokens
    results: tuple[ReplayResult, ...]

    @property
    def result(self) -> ReplayResult:
        return self.results[0]

    @property
    def hit_tokens(self) -> dict[str, int]:
        return {t: round(sum(r.hit_tokens[t] for r in self.results) / len(self.results))
                for t in self.result.hit_tokens}

    @property
    def hit_spread(self) -> dict[str, tuple[int, int]]:
        """(least, most) hit tokens per tier over the maps."""
        return {t: (min(r.hit_tokens[t] for r in self.results),
                    max(r.hit_tokens[t] for r in self.results)) for t in self.result.hit_tokens}

    @property
    def hit_ratio(self) -> float:
        return sum(self.hit_tokens.values()) / self.trace.prompt_tokens

    @property
    def hit_ratio_spread(self) -> tuple[float, float]:
        """(least, most) hit ratio over the maps and draws."""
        ratios = [r.hit_ratio for r in self.results]
        return min(ratios), max(ratios)

    @property
    def evicted_tokens(self) -> dict[str, int]:
        return self.result.evicted_tokens

    def served_vs_model(self, served_hit_tokens: dict[str, int]) -> dict[str, float]:
        """``served_vs_model_<tier>``: served / predicted hit tokens for each predicted tier."""
        return {f"served_vs_model_{t}": served_hit_tokens.get(t, 0) / n
                for t, n in self.hit_tokens.items() if n}


def model_for_slice(trace: Trace, capacity: TierTokens, policy: Policy, *, pods: int = 1,
                    router: RouterConfig | None = None,
                    samples: int = SSD_SAMPLES) -> SlicePrediction:
    """The model's per-tier hit tokens for a (scaled) slice on pods of ``capacity``: the mean
    of ``samples`` replays with different SSD key -> set maps and router draws (one when
    neither a set-associative SSD tier without the store's own map (``Policy.ssd_set_hash``)
    nor a cache-aware router over several pods leaves anything to chance)."""
    sets = (policy.ssd_ways is not None and capacity.l3_ssd > 0
            and policy.ssd_set_hash is None)
    draws = pods > 1 and router is not None and router.policy == "cache_aware"
    n = samples if sets or draws else 1
    return SlicePrediction(trace, capacity, tuple(
        replay(trace, capacity, replace(policy, ssd_salt=salt), pods=pods,
               router=replace(router, salt=salt) if router is not None else None)
        for salt in range(n)))
