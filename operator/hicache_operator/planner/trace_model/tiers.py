"""The tiers' capacities, the engine's policies, and one tier as an LRU of prefix blocks.

Capacities are tokens per pod (:mod:`.capacity` derives them from a plan with the planner's own
sizing). A tier is an LRU over block keys weighted by the block's tokens: mori's DRAM tier and
the SSD tier (mori's node or the slot store of issue 24) evict least recently used pages within
their capacity, and SGLang's radix tree evicts least recently used leaves (:mod:`.pod` keeps
the LRU order leaf-first so that a chain's deepest blocks go before its root).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

TIERS = ("device", "host", "l3_dram", "l3_ssd")
TierName = Literal["device", "host", "l3_dram", "l3_ssd"]
TIER_LABELS = {"device": "device KV pool", "host": "host pool (L2)",
               "l3_dram": "UMBP DRAM (L3)", "l3_ssd": "UMBP SSD (L3)"}
#: SGLang 0.5.23's default ``prefetch_threshold`` (storage extra-config): a storage prefetch is
#: issued only when at least this many tokens hit in L3.
SGLANG_PREFETCH_THRESHOLD = 256


@dataclass(frozen=True)
class TierTokens:
    """Tokens one pod holds per tier; 0 means the tier is absent."""

    device: int
    host: int
    l3_dram: int
    l3_ssd: int

    def get(self, tier: str) -> int:
        value: int = getattr(self, tier)
        return value

    def scaled(self, tier: str, factor: float) -> TierTokens:
        return replace(self, **{tier: int(self.get(tier) * factor)})

    def without(self, *tiers: str) -> TierTokens:
        return replace(self, **dict.fromkeys(tiers, 0))


@dataclass(frozen=True)
class Policy:
    """The engine's and the store's policies the replay follows."""

    page_size: int = 64  # spec.engine.pageSize: hits are whole pages
    write_policy: Literal["write_back", "write_through", "write_through_selective"] = (
        "write_back")
    prefetch_threshold: int = SGLANG_PREFETCH_THRESHOLD
    promote_on_hit: bool = True  # spec.l3.tiering.promoteOnHit: SSD hits copied into DRAM


class LruTier:
    """Block key -> tokens, least recently used first; ``capacity`` tokens at most."""

    __slots__ = ("capacity", "entries", "evicted_tokens", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[int, int] = OrderedDict()
        self.used = 0
        self.evicted_tokens = 0

    def add(self, key: int, tokens: int, evicted: list[tuple[int, int]] | None) -> None:
        """Insert (or refresh) ``key``; blocks pushed out go to ``evicted`` when given."""
        entries = self.entries
        if key in entries:
            entries.move_to_end(key)
            return
        if tokens > self.capacity:
            return
        entries[key] = tokens
        self.used += tokens
        while self.used > self.capacity:
            old, size = entries.popitem(last=False)
            self.used -= size
            self.evicted_tokens += size
            if evicted is not None:
                evicted.append((old, size))

    def touch(self, key: int) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)
