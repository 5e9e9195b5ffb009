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
from dataclasses import dataclass

from .replay import ReplayResult, footprint_tokens, replay
from .routing import RouterConfig
from .tiers import Policy, TierTokens
from .trace import Request, Trace

#: Shares of a slice's working set per tier: every tier smaller than the set, each larger than
#: the one above it (host >= device as SGLang wants), so each one evicts.
PRESSURE_FRACTIONS = TierTokens(device=10, host=20, l3_dram=35, l3_ssd=60)  # percent


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


def pressure_capacities(trace: Trace, page_size: int,
                        percent: TierTokens = PRESSURE_FRACTIONS) -> TierTokens:
    """Tier capacities (tokens, whole pages, at least one page) as percentages of the slice's
    working set."""
    footprint = footprint_tokens(trace)

    def cap(share: int) -> int:
        return max(footprint * share // 100 // page_size, 1) * page_size

    return TierTokens(device=cap(percent.device), host=cap(percent.host),
                      l3_dram=cap(percent.l3_dram), l3_ssd=cap(percent.l3_ssd))


@dataclass(frozen=True)
class SlicePrediction:
    """What the model predicts for a served replay of ``trace`` on pods of ``capacity``."""

    trace: Trace
    capacity: TierTokens
    result: ReplayResult

    @property
    def hit_tokens(self) -> dict[str, int]:
        return self.result.hit_tokens

    @property
    def evicted_tokens(self) -> dict[str, int]:
        return self.result.evicted_tokens

    def served_vs_model(self, served_hit_tokens: dict[str, int]) -> dict[str, float]:
        """``served_vs_model_<tier>``: served / predicted hit tokens for each predicted tier."""
        return {f"served_vs_model_{t}": served_hit_tokens.get(t, 0) / n
                for t, n in self.hit_tokens.items() if n}


def model_for_slice(trace: Trace, capacity: TierTokens, policy: Policy, *, pods: int = 1,
                    router: RouterConfig | None = None) -> SlicePrediction:
    """The model's per-tier hit tokens for a (scaled) slice on pods of ``capacity``."""
    return SlicePrediction(trace, capacity,
                           replay(trace, capacity, policy, pods=pods, router=router))
