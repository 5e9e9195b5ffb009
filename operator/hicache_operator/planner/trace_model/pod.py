"""One pod's four tiers serving a request, with SGLang 0.5.23's HiCache policies.

A request's prompt is a chain of prefix blocks. It hits the longest prefix present, tier by
tier: the device radix tree first, then the host pool continues the match (SGLang loads those
pages back to the GPU), then the L3 store (each block from UMBP DRAM if there, else SSD).
What SGLang and the store do, and how the replay follows it:

* **Pages.** SGLang matches whole pages and always computes at least one token, so a hit of
  ``k`` blocks is ``floor(min(tokens of the k blocks, input - 1) / pageSize) * pageSize``
  tokens. Trace blocks (512 tokens in Mooncake) and pages need not agree: every tier's share is
  the difference of that rounded prefix at its boundaries, so the shares always add up. SGLang
  caches whole pages only, so a prompt's tail past its last whole page takes no room in any
  tier (a block shorter than a page is never cached).
* **Prefetch threshold.** SGLang prefetches from storage only when the storage hit is at least
  ``prefetch_threshold`` tokens (default 256); below it the L3 part is recomputed.
* **Prefetch gate.** SGLang asks L3 only when the device + host match ends at the root or at a
  page with a host copy (``is_backuped(last_host_node)``, ``scheduler._prefetch_kvcache``).
  Under ``write_back`` a page gets a host copy only when the device evicts it, so a request
  whose match ends in a prefix still on the device (a hot system prompt) never reads L3;
  under write-through every page on the device has its host copy.
* **Promotion.** Whatever the request used ends on the device (computed or loaded); an L3 hit
  is prefetched into the host pool first, so it lands in host and device; an SSD hit is also
  copied into DRAM when ``promoteOnHit`` (the store's rule).
* **Write policy.** ``write_back``: a page reaches the host pool when the device evicts it, and
  L3 right after its host write (SGLang backs up to storage when a host write completes).
  ``write_through``: a page is written to host and L3 on its first use;
  ``write_through_selective``: on its second use while on the device (SGLang's
  ``write_through_threshold`` 1 and 2; the count lives on the radix node, so it is lost when
  the device evicts the page, and a page evicted before its threshold is gone). L3 is DRAM in
  front of SSD, and the store puts every page into both (the write-back ring drains DRAM's pages
  to SSD), so SSD holds what DRAM holds.
* **Eviction.** Every tier is an LRU of blocks within its capacity; UMBP DRAM (mori's) by
  watermarks: at the end of a put call that leaves it at 90% of its capacity or more it evicts
  down to 70%. SGLang reads and backs up storage pages in calls of 128 pages, and the store
  puts each read call's SSD hits into DRAM in one call, so DRAM's calls end there. A
  request's blocks are refreshed deepest first, so within a chain the root is the most
  recent: a chain loses its leaves before its root, as SGLang's leaf-first eviction does. A
  host copy of a page still on the device is refreshed with it (SGLang never evicts those
  from host).

Not modelled: output tokens (the trace cannot say which later blocks hold an earlier answer),
requests in flight pinning pages, the time a backup or a prefetch takes (a page is in L3 as soon
as it is written; the prefetch never times out; a request's backups end before the next
request's prefetch, so no promotion is skipped for a put still running and no backup call
interleaves with a prefetch), and mori's read lease (a key read in the last 0.3-0.5 s is not
evicted: it matters only when a key read that recently is among the least recently used).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .tiers import (
    SGLANG_STORAGE_BATCH_PAGES,
    LruTier,
    MoriDramTier,
    Policy,
    SetAssociativeTier,
    TierTokens,
)


class PodCache:
    __slots__ = ("device", "host", "l3_dram", "l3_ssd", "page", "policy", "threshold",
                 "uses", "write_through")

    def __init__(self, capacity: TierTokens, policy: Policy) -> None:
        self.device = LruTier(capacity.device)
        self.host = LruTier(capacity.host)
        marks = policy.dram_watermarks
        self.l3_dram: LruTier | MoriDramTier = (
            LruTier(capacity.l3_dram) if marks is None else
            MoriDramTier(capacity.l3_dram, marks, policy.page_parts))
        self.l3_ssd: LruTier | SetAssociativeTier = (
            LruTier(capacity.l3_ssd) if policy.ssd_ways is None else SetAssociativeTier(
                capacity.l3_ssd, policy.page_size, policy.page_parts, policy.ssd_ways,
                policy.ssd_salt, policy.ssd_set_hash))
        self.policy = policy
        self.page = policy.page_size
        self.threshold = policy.prefetch_threshold
        # write_through(_selective): uses a page needs on the device before its host write
        self.write_through = {"write_back": 0, "write_through": 1,
                              "write_through_selective": 2}[policy.write_policy]
        self.uses: dict[int, int] = {}

    def serve(self, blocks: tuple[int, ...], sizes: list[int],
              input_length: int) -> tuple[int, int, int, int]:
        """Hit tokens (device, host, L3 DRAM, L3 SSD) of one request; updates the tiers."""
        n = len(blocks)
        dev, host = self.device.entries, self.host.entries
        dram, ssd = self.l3_dram.entries, self.l3_ssd.entries
        i = 0
        while i < n and blocks[i] in dev:
            i += 1
        d = i
        while i < n and blocks[i] in host:
            i += 1
        h = i
        from_ssd: list[bool] = []
        # SGLang looks in L3 only past a match that ends at the root or at a page with a host
        # copy (scheduler._prefetch_kvcache: ``is_backuped(last_host_node)``): under
        # write_back a prefix still only on the device stops the lookup.
        while i < n and (h == 0 or blocks[h - 1] in host):
            key = blocks[i]
            if key in dram:
                from_ssd.append(False)
            elif key in ssd:
                from_ssd.append(True)
            else:
                break
            i += 1
        page, cap = self.page, input_length - 1
        cum = 0
        prefix = [0]  # the page-rounded hit of the first k blocks
        for size in sizes[:i]:
            cum += size
            prefix.append((min(cum, cap) // page) * page)
        l3 = prefix[i] - prefix[h]
        if l3 < self.threshold or l3 <= 0:
            i, l3, from_ssd = h, 0, []
        ssd_tokens = sum(prefix[h + k + 1] - prefix[h + k]
                         for k, on_ssd in enumerate(from_ssd) if on_ssd)
        m, weights = self._cached(sizes, input_length)
        j = min(i, m)
        self._update(blocks[:m], weights, min(d, m), min(h, m), j, from_ssd[:max(j - h, 0)])
        return prefix[d], prefix[h] - prefix[d], l3 - ssd_tokens, ssd_tokens

    def _cached(self, sizes: list[int], input_length: int) -> tuple[int, list[int]]:
        """The blocks a request leaves in the tiers and their tokens: SGLang keeps whole pages
        only (its radix tree, host pool and storage hold ``floor(input / pageSize)`` pages), so
        the tail past the last whole page is never cached and the block holding that boundary
        weighs only its cached tokens."""
        cached = input_length // self.page * self.page
        weights: list[int] = []
        start = 0
        for size in sizes:
            kept = min(size, cached - start)
            if kept <= 0:
                break
            weights.append(kept)
            start += size
        return len(weights), weights

    def _update(self, blocks: tuple[int, ...], sizes: list[int], d: int, h: int, j: int,
                from_ssd: list[bool]) -> None:
        host, dram, ssd = self.host, self.l3_dram, self.l3_ssd
        for k in range(h):  # device and host hits: their host copies stay with them
            host.touch(blocks[k])
        # The prefetch reads L3 in calls of SGLANG_STORAGE_BATCH_PAGES pages; the store reads
        # each call's pages from DRAM, the rest from SSD, then copies those into DRAM in one put.
        for batch in self._calls(range(h, j), sizes):
            for k in batch:
                if not from_ssd[k - h]:
                    dram.touch(blocks[k])
                    ssd.touch(blocks[k])  # our SSD tier's LRU sees DRAM's hits too (touch_later)
            for k in batch:
                if from_ssd[k - h]:
                    ssd.touch(blocks[k])
                    if self.policy.promote_on_hit:
                        dram.add(blocks[k], sizes[k], None)
                host.add(blocks[k], sizes[k], None)
            dram.end_call()
        if self.write_through:
            self._backups(self._written_through(blocks, sizes))
        evicted: list[tuple[int, int]] = []
        device = self.device
        for k in range(len(blocks) - 1, -1, -1):  # deepest first: the root ends most recent
            device.add(blocks[k], sizes[k], evicted)
        if self.write_through:
            for key, _ in evicted:
                self.uses.pop(key, None)
        else:
            self._backups((key, size) for key, size in evicted if key not in host.entries)

    def _calls(self, blocks: range, sizes: list[int]) -> list[list[int]]:
        """``blocks`` cut into SGLang's storage calls: at most SGLANG_STORAGE_BATCH_PAGES
        pages each."""
        limit = SGLANG_STORAGE_BATCH_PAGES * self.page
        calls: list[list[int]] = []
        tokens = limit
        for k in blocks:
            if tokens + sizes[k] > limit:
                calls.append([])
                tokens = 0
            calls[-1].append(k)
            tokens += sizes[k]
        return calls

    def _written_through(self, blocks: tuple[int, ...],
                         sizes: list[int]) -> Iterator[tuple[int, int]]:
        """The pages write-through writes to host now (on their ``write_through`` th use on the
        device, when host lacks them), each checked as the one before it is written."""
        uses, needed, host = self.uses, self.write_through, self.host.entries
        for key, size in zip(blocks, sizes, strict=True):
            count = uses[key] = uses.get(key, 0) + 1
            if count >= needed and key not in host:
                yield key, size

    def _backups(self, pages: Iterable[tuple[int, int]]) -> None:
        """One request's pages written to host and backed up to L3 in SGLang's storage calls
        (at most SGLANG_STORAGE_BATCH_PAGES pages each; DRAM evicts when a call ends)."""
        limit, in_call = SGLANG_STORAGE_BATCH_PAGES * self.page, 0
        for key, size in pages:
            if in_call + size > limit:
                self.l3_dram.end_call()
                in_call = 0
            self._backup(key, size)
            in_call += size
        self.l3_dram.end_call()

    def _backup(self, key: int, size: int) -> None:
        """A page written to the host pool, then backed up to L3 (DRAM and, behind it, SSD)."""
        self.host.add(key, size, None)
        if key in self.host.entries:
            # A tier that holds the page keeps it as it is (mori keys are write-once).
            for tier in (self.l3_dram, self.l3_ssd):
                if key not in tier.entries:
                    tier.add(key, size, None)
