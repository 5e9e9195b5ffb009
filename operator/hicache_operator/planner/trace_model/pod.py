"""One pod's four tiers serving a request, with SGLang 0.5.23's HiCache policies.

A request's prompt is a chain of prefix blocks. It hits the longest prefix present, tier by
tier: the device radix tree first, then the host pool continues the match (SGLang loads those
pages back to the GPU), then the L3 store (each block from UMBP DRAM if there, else SSD).
What SGLang and the store do, and how the replay follows it:

* **Pages.** SGLang matches whole pages and always computes at least one token, so a hit of
  ``k`` blocks is ``floor(min(tokens of the k blocks, input - 1) / pageSize) * pageSize``
  tokens. Trace blocks (512 tokens in Mooncake) and pages need not agree: every tier's share is
  the difference of that rounded prefix at its boundaries, so the shares always add up.
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
  watermarks: once it holds 90% of its capacity it evicts down to 70%. A request's blocks are
  refreshed deepest first, so within a chain the root is the most recent: a chain loses its
  leaves before its root, as SGLang's leaf-first eviction does. A host copy of a page still on
  the device is refreshed with it (SGLang never evicts those from host).

Not modelled: output tokens (the trace cannot say which later blocks hold an earlier answer),
requests in flight pinning pages, the time a backup or a prefetch takes (a page is in L3 as soon
as it is written; the prefetch never times out).
"""

from __future__ import annotations

from .tiers import LruTier, Policy, SetAssociativeTier, TierTokens


class PodCache:
    __slots__ = ("device", "host", "l3_dram", "l3_ssd", "page", "policy", "threshold",
                 "uses", "write_through")

    def __init__(self, capacity: TierTokens, policy: Policy) -> None:
        self.device = LruTier(capacity.device)
        self.host = LruTier(capacity.host)
        marks = policy.dram_watermarks
        self.l3_dram = (LruTier(capacity.l3_dram) if marks is None else
                        LruTier(int(capacity.l3_dram * marks[1]), int(capacity.l3_dram * marks[0])))
        self.l3_ssd: LruTier | SetAssociativeTier = (
            LruTier(capacity.l3_ssd) if policy.ssd_ways is None else SetAssociativeTier(
                capacity.l3_ssd, policy.page_size, policy.page_parts, policy.ssd_ways,
                policy.ssd_salt))
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
        self._update(blocks, sizes, d, h, i, from_ssd)
        return prefix[d], prefix[h] - prefix[d], l3 - ssd_tokens, ssd_tokens

    def _update(self, blocks: tuple[int, ...], sizes: list[int], d: int, h: int, j: int,
                from_ssd: list[bool]) -> None:
        host, dram, ssd = self.host, self.l3_dram, self.l3_ssd
        for k in range(d):  # device hits: their host copies stay with them
            host.touch(blocks[k])
        for k in range(d, h):
            host.touch(blocks[k])
        for k in range(h, j):
            key = blocks[k]
            if from_ssd[k - h]:
                ssd.touch(key)
                if self.policy.promote_on_hit:
                    dram.add(key, sizes[k], None)
            else:
                dram.touch(key)
                ssd.touch(key)  # our SSD tier's LRU sees DRAM's hits too (touch_later)
            host.add(key, sizes[k], None)
        if self.write_through:
            uses, needed = self.uses, self.write_through
            for k, key in enumerate(blocks):
                count = uses[key] = uses.get(key, 0) + 1
                if count >= needed and key not in host.entries:
                    self._backup(key, sizes[k])
        evicted: list[tuple[int, int]] = []
        device = self.device
        for k in range(len(blocks) - 1, -1, -1):  # deepest first: the root ends most recent
            device.add(blocks[k], sizes[k], evicted)
        if self.write_through:
            for key, _ in evicted:
                self.uses.pop(key, None)
        else:
            for key, size in evicted:
                if key not in host.entries:
                    self._backup(key, size)

    def _backup(self, key: int, size: int) -> None:
        """A page written to the host pool, then backed up to L3 (DRAM and, behind it, SSD)."""
        self.host.add(key, size, None)
        if key in self.host.entries:
            # A tier that holds the page keeps it as it is (mori keys are write-once).
            for tier in (self.l3_dram, self.l3_ssd):
                if key not in tier.entries:
                    tier.add(key, size, None)
