"""The counters of :class:`~hicache_umbp.store.tiers.TieredClient` (exported as metrics by
:mod:`hicache_umbp.store.metrics`, summed into ``StoreStats.tiers``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TierStats"]


@dataclass
class TierStats:
    dram_hits: int = 0  # keys read from DRAM
    ring_hits: int = 0  # keys read from the write-back ring (not yet on SSD)
    ssd_hits: int = 0  # keys read from SSD
    misses: int = 0  # keys of pages no side held whole
    promotions: int = 0  # SSD-side hits copied into DRAM
    promotions_skipped: int = 0  # SSD-side hit keys not copied: a put was running (never waits)
    ssd_direct_writes: int = 0  # keys written to SSD inside the put
    ssd_retries: int = 0  # key writes repeated inside the put after the SSD refused them
    ssd_refused: int = 0  # keys the SSD refused inside the put: their pages were not stored
    writeback_queued: int = 0
    writeback_waits: int = 0  # puts that waited for ring room
    writeback_wait_timeouts: int = 0  # ... and gave up, writing through instead
    writeback_done: int = 0  # keys the background thread wrote to SSD
    writeback_retries: int = 0  # key writes the background thread repeated after a refusal
    writeback_stalls: int = 0  # times queued keys were still refused after a fair window
    writeback_failed: int = 0  # acknowledged keys dropped unwritten (at close, after retrying)
    writeback_pending: int = 0  # keys in the ring, not yet on SSD (now)
    writeback_stalled: int = 0  # 1 while queued keys wait for an SSD that keeps refusing
    ssd_calls: int = 0
    partial_pages_skipped: int = 0  # page writes a tier skipped: it held part of the page
    partial_pages_rewritten: int = 0  # pages the SSD held part of, removed and written whole
    ssd_too_large: int = 0  # keys larger than the SSD accepts (never queued)
