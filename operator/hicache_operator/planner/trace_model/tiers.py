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
#: Ways per set of our SSD tier (``hicache_umbp.disk.layout.WAYS``).
SSD_WAYS = 16
#: mori 1.2.4's DRAM tier (``UMBPConfig().dram``): low and high watermarks.
MORI_DRAM_WATERMARKS = (0.7, 0.9)
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
    #: mori 1.2.4's DRAM tier: after a put, once it holds high x its capacity it evicts its
    #: least recently used keys down to low x (``dram.high_watermark`` 0.9, ``low_watermark``
    #: 0.7); None: a plain LRU of the whole capacity.
    dram_watermarks: tuple[float, float] | None = MORI_DRAM_WATERMARKS
    #: Our SSD tier: ``ssd_ways``-way sets of slots, one slot per page part, ``page_parts``
    #: parts a page (:class:`SetAssociativeTier`); None: an LRU of whole pages.
    ssd_ways: int | None = SSD_WAYS
    page_parts: int = 2
    #: Which key -> set map the replay draws (the store hashes keys with SHA-256, which the
    #: trace cannot give): replays with several salts give the spread of that choice.
    ssd_salt: int = 0


class LruTier:
    """Block key -> tokens, least recently used first; ``capacity`` tokens at most. With
    ``low``, eviction works by watermarks as mori's DRAM tier does: once ``capacity`` is reached
    it evicts down to ``low``."""

    __slots__ = ("capacity", "entries", "evicted_tokens", "low", "used")

    def __init__(self, capacity: int, low: int | None = None) -> None:
        self.capacity = capacity
        self.low = low
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
        if self.low is None:
            floor = self.capacity
        elif self.used >= self.capacity:
            floor = self.low
        else:
            return
        while self.used > floor:
            old, size = entries.popitem(last=False)
            self.used -= size
            self.evicted_tokens += size
            if evicted is not None:
                evicted.append((old, size))

    def touch(self, key: int) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)


_MASK = (1 << 64) - 1


def mix64(key: int) -> int:
    """splitmix64: a fixed, well-spread hash of an int (Python's hash() of ints is the id)."""
    z = (key + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class SetAssociativeTier:
    """Our SSD tier (``hicache_umbp.disk``) as it keeps pages: every page part (K and V of each
    attention-TP rank under mha, one under mla) in a slot of a ``ways``-way set its key hashes
    to, LRU within the set. A page is readable only while all its parts are; a write of a
    page with parts left removes them and stores it whole (``TieredClient._whole_again``), so
    one evicted part loses the page until it is written again. Keys hash to sets
    independently of each other, so near its capacity the tier keeps fewer whole pages, and
    fewer long prefixes, than an LRU of the same slots (the served check measured it).
    ``entries`` holds the whole pages (key -> tokens), as :class:`LruTier`'s does."""

    __slots__ = ("capacity", "entries", "evicted_tokens", "partial", "parts", "salt", "sets",
                 "used", "ways")

    def __init__(self, capacity: int, page_size: int, parts: int, ways: int,
                 salt: int = 0) -> None:
        self.capacity = capacity
        self.salt = salt * 0x2545F4914F6CDD1D
        self.parts = max(parts, 1)
        slots = capacity // max(page_size, 1) * self.parts
        self.ways = ways if slots >= ways else max(slots, 1)
        nsets = slots // self.ways
        self.sets: list[OrderedDict[tuple[int, int], None]] = [OrderedDict()
                                                                 for _ in range(nsets)]
        self.entries: dict[int, int] = {}
        self.partial: dict[int, int] = {}  # key -> parts held, for pages not whole
        self.used = 0
        self.evicted_tokens = 0

    def _set(self, key: int, part: int) -> OrderedDict[tuple[int, int], None]:
        return self.sets[mix64((key * 131 + part) ^ self.salt) % len(self.sets)]

    def add(self, key: int, tokens: int, evicted: list[tuple[int, int]] | None) -> None:
        if not self.sets or key in self.entries:
            return
        if self.partial.pop(key, 0):
            for part in range(self.parts):
                self._set(key, part).pop((key, part), None)
        for part in range(self.parts):
            ways = self._set(key, part)
            if len(ways) >= self.ways:
                (old, _), _ = ways.popitem(last=False)
                self._lose_part(old, evicted)
            ways[(key, part)] = None
        self.entries[key] = tokens
        self.used += tokens

    def _lose_part(self, key: int, evicted: list[tuple[int, int]] | None) -> None:
        size = self.entries.pop(key, None)
        if size is not None:  # a whole page loses its first part: it is gone
            self.used -= size
            self.evicted_tokens += size
            if evicted is not None:
                evicted.append((key, size))
            left = self.parts - 1
        else:
            left = self.partial.pop(key) - 1
        if left > 0:
            self.partial[key] = left

    def touch(self, key: int) -> None:
        if key in self.entries:
            for part in range(self.parts):
                self._set(key, part).move_to_end((key, part))
