"""The tiers' capacities, the engine's policies, and one tier as an LRU of prefix blocks.

Capacities are tokens per pod (:mod:`.capacity` derives them from a plan with the planner's own
sizing). A tier is an LRU over block keys weighted by the block's tokens: mori's DRAM tier and
the SSD tier (mori's node or the slot store of issue 24) evict least recently used pages within
their capacity, and SGLang's radix tree evicts least recently used leaves (:mod:`.pod` keeps
the LRU order leaf-first so that a chain's deepest blocks go before its root).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
#: SGLang 0.5.23 reads and backs up storage pages in calls of at most this many pages
#: (``mem_cache.hicache_storage.STORAGE_BATCH_SIZE``): one store call, one mori put call each.
SGLANG_STORAGE_BATCH_PAGES = 128


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
    #: mori 1.2.4's DRAM tier: after a put call, once it holds high x its capacity it evicts its
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
    #: The store's own map, where the replay knows each page's key: (block, part) -> the 64-bit
    #: set hash of that part's key (``hicache_umbp.disk.index.set_hash``), taken modulo the
    #: sets. The served check computes it from SGLang's page hashes and the pod's key prefixes;
    #: None: the salted map above.
    ssd_set_hash: Callable[[int, int], int] | None = field(default=None, compare=False,
                                                          repr=False)


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

    def end_call(self) -> None:
        """A store call ended (a plain LRU has evicted as it added)."""

    def touch(self, key: int) -> None:
        if key in self.entries:
            self.entries.move_to_end(key)


class MoriDramTier:
    """mori 1.2.4's DRAM tier as it keeps a page: one key per page part (K and V under mha),
    LRU over keys, by watermarks. Probed on the real tier, and replayed against the real tier's
    every result on a served pod's recorded calls (docs/capacity-planning.md):

    * a put call takes keys while the tier has room (a key past its capacity is refused), and
      only when the call ends (:meth:`end_call`), if it holds ``high`` x its capacity or more,
      evicts least recently used keys down to ``low`` x: where each call ends decides what an
      eviction round reaches, so the pod model ends calls where SGLang's do (:mod:`.pod`);
    * a read moves a key to the most recent end, a put of a key it holds does not;
    * eviction is per key, so a round can take a page's first part and keep its second: the
      page is then no DRAM hit, and the store neither promotes nor writes it while DRAM holds a
      part of it, until that part ages out too.

    ``entries`` holds the whole pages (key -> tokens), as :class:`LruTier`'s does."""

    __slots__ = ("capacity", "entries", "evicted_tokens", "high", "keys", "low", "partial",
                 "parts", "used")

    def __init__(self, capacity: int, watermarks: tuple[float, float], parts: int) -> None:
        self.capacity = capacity
        self.low, self.high = int(capacity * watermarks[0]), int(capacity * watermarks[1])
        self.parts = max(parts, 1)
        self.keys: OrderedDict[tuple[int, int], int] = OrderedDict()  # (block, part) -> tokens
        self.entries: dict[int, int] = {}
        self.partial: dict[int, int] = {}  # block -> parts held, for pages not whole
        self.used = 0
        self.evicted_tokens = 0

    def add(self, key: int, tokens: int, evicted: list[tuple[int, int]] | None) -> None:
        """A page put (``evicted`` is unused: eviction waits for :meth:`end_call`)."""
        if key in self.entries or key in self.partial:
            return
        share, rest = divmod(tokens, self.parts)
        held = 0
        for part in range(self.parts):
            size = share + (part < rest)
            if self.used + size > self.capacity:
                break
            self.keys[key, part] = size
            self.used += size
            held += 1
        if held == self.parts:
            self.entries[key] = tokens
        elif held:
            self.partial[key] = held

    def end_call(self) -> None:
        if self.used < self.high:
            return
        keys = self.keys
        while self.used > self.low:
            (block, _), size = keys.popitem(last=False)
            self.used -= size
            self.evicted_tokens += size
            if self.entries.pop(block, None) is not None:
                left = self.parts - 1
            else:
                left = self.partial.pop(block) - 1
            if left:
                self.partial[block] = left

    def touch(self, key: int) -> None:
        if key in self.entries:
            for part in range(self.parts):
                self.keys.move_to_end((key, part))


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

    __slots__ = ("capacity", "entries", "evicted_tokens", "partial", "parts", "salt",
                 "set_hash", "sets", "used", "ways")

    def __init__(self, capacity: int, page_size: int, parts: int, ways: int,
                 salt: int = 0, set_hash: Callable[[int, int], int] | None = None) -> None:
        self.capacity = capacity
        self.salt = salt * 0x2545F4914F6CDD1D
        self.set_hash = set_hash
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
        h = (mix64((key * 131 + part) ^ self.salt) if self.set_hash is None
             else self.set_hash(key, part))
        return self.sets[h % len(self.sets)]

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
