"""The store's own Prometheus metrics, on SGLang's ``/metrics`` page.

SGLang 0.5.23 exports no counter for L3 writes a backend could not keep (a refused batch logs
"Write page to storage: N pages failed" and counts only what succeeded), and nothing of what a
backend does after it acknowledged a page. The store's counters (:class:`~hicache_umbp.store.
StoreStats`, the tiers' :class:`~hicache_umbp.tiers.TierStats`) are exported here through
``prometheus_client`` in the scheduler process: with ``--enable-metrics`` SGLang runs it in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), so families created in a scheduler appear on
the HTTP server's ``/metrics`` beside SGLang's own, and the operator's scraper reads them
(``hicache_operator.cachestats``). Without prometheus_client, or without ``--enable-metrics``
(SGLang then never asks the backend for its stats), nothing is exported.

=============================================  ======  =========================================
family                                         type    what it counts (label ``local_rank``)
=============================================  ======  =========================================
``hicache_umbp_pages_not_stored_total``        counter pages a batch_set reported not stored
``hicache_umbp_ssd_refused_keys_total``        counter keys the SSD tier still refused after
                                                       retrying in a synchronous write (their
                                                       pages are among the not stored ones)
``hicache_umbp_ssd_write_retries_total``       counter key writes repeated after the SSD
                                                       refused them (a transient refusal,
                                                       e.g. mori's read lease, ridden out)
``hicache_umbp_writeback_stalls_total``        counter times acknowledged keys were still
                                                       refused after a whole fair window (they
                                                       wait in the write-back ring, readable)
``hicache_umbp_writeback_failed_keys_total``   counter acknowledged keys dropped unwritten
                                                       (only at close, after retrying)
``hicache_umbp_writeback_pending_keys``        gauge   keys in the write-back ring now
``hicache_umbp_l3_read_pages_total``           counter pages served by each L3 tier (label
                                                       ``tier``: ``dram``, ``ssd``)
``hicache_umbp_promoted_keys_total``           counter SSD-side hit keys copied into DRAM
                                                       (``promoteOnHit``)
``hicache_umbp_promotions_skipped_keys_total`` counter SSD-side hit keys not copied into
                                                       DRAM: a put was running (a promotion
                                                       never waits for one)
``hicache_umbp_ssd_read_bytes_total``          counter bytes read back from the SSD tier (ours)
``hicache_umbp_ssd_read_seconds_total``        counter wall time of the SSD read batches
                                                       (bytes / seconds: the tier's bandwidth)
``hicache_umbp_ssd_written_bytes_total``       counter bytes written to the SSD tier
``hicache_umbp_ssd_write_seconds_total``       counter wall time of the SSD write batches
``hicache_umbp_ssd_evictions_total``           counter pages the SSD tier evicted for new ones
``hicache_umbp_ssd_write_errors_total``        counter page parts not stored: the disk failed
``hicache_umbp_ssd_read_errors_total``         counter page parts missed: the disk failed
``hicache_umbp_ssd_pages``                     gauge   page parts held on the pod's drives (the
                                                       same for every rank: they share them)
``hicache_umbp_ssd_capacity_pages``            gauge   slots on the pod's drives
=============================================  ======  =========================================
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "hicache_umbp_"
#: family -> (documentation, how its value follows from one stats dict of the adapter)
COUNTERS: dict[str, tuple[str, Callable[[Mapping[str, Any]], int]]] = {
    "pages_not_stored": (
        "Pages a batch_set reported not stored (SGLang counts them as failed backups).",
        lambda s: int(s.get("set_failures", 0))),
    "ssd_refused_keys": (
        "Keys the SSD tier still refused after retrying in a synchronous write; their pages "
        "were reported not stored.",
        lambda s: int(s.get("tiers", {}).get("ssd_refused", 0))),
    "ssd_write_retries": (
        "Key writes repeated after the SSD tier refused them (transient refusals ridden out).",
        lambda s: int(s.get("tiers", {}).get("ssd_retries", 0))
        + int(s.get("tiers", {}).get("writeback_retries", 0))),
    "writeback_stalls": (
        "Times acknowledged write-back keys were still refused by the SSD tier after a whole "
        "fair retry window (they stay in the write-back ring, readable, and are retried).",
        lambda s: int(s.get("tiers", {}).get("writeback_stalls", 0))),
    "promoted_keys": (
        "SSD-side hit keys copied into DRAM (promoteOnHit).",
        lambda s: int(s.get("tiers", {}).get("promotions", 0))),
    "promotions_skipped_keys": (
        "SSD-side hit keys not copied into DRAM because a put was running (a promotion never "
        "waits for one).",
        lambda s: int(s.get("tiers", {}).get("promotions_skipped", 0))),
    "writeback_failed_keys": (
        "Acknowledged keys the write-back dropped unwritten (only at close, after retrying); "
        "DRAM may still hold them until it evicts them.",
        lambda s: int(s.get("tiers", {}).get("writeback_failed", 0))),
}

def _disk(field: str, scale: float = 1.0) -> Callable[[Mapping[str, Any]], float]:
    return lambda s: float(s.get("disk", {}).get(field, 0)) * scale


#: Our SSD tier (hicache_umbp.disk), from the adapter's ``disk`` stats.
DISK_COUNTERS: dict[str, tuple[str, Callable[[Mapping[str, Any]], float]]] = {
    "ssd_read_bytes": ("Bytes read back from the SSD tier.", _disk("read_bytes")),
    "ssd_read_seconds": ("Wall time of the SSD tier's read batches (bytes / seconds is its "
                         "read bandwidth).", _disk("read_ns", 1e-9)),
    "ssd_written_bytes": ("Bytes written to the SSD tier.", _disk("written_bytes")),
    "ssd_write_seconds": ("Wall time of the SSD tier's write batches.", _disk("write_ns", 1e-9)),
    "ssd_evictions": ("Pages the SSD tier evicted (least recently used of their set) to store "
                      "new ones.", _disk("evictions")),
    "ssd_write_errors": ("Page parts the SSD tier did not store because the disk failed the "
                         "write (reported not stored, never acknowledged).", _disk("write_errors")),
    "ssd_read_errors": ("Page parts the SSD tier served as misses because the disk failed the "
                        "read.", _disk("read_errors")),
}
DISK_GAUGES: dict[str, tuple[str, str]] = {
    "ssd_pages": ("Page parts held on the pod's SSD drives (shared by its ranks).", "pages"),
    "ssd_capacity_pages": ("Slots on the pod's SSD drives.", "capacity"),
}
TIER_PAGES = "l3_read_pages"
PENDING = "writeback_pending_keys"
FAMILIES = (*(f"{PREFIX}{name}_total" for name in (*COUNTERS, *DISK_COUNTERS, TIER_PAGES)),
            f"{PREFIX}{PENDING}", *(f"{PREFIX}{name}" for name in DISK_GAUGES))

_families: dict[str, Any] = {}
_families_lock = threading.Lock()


def _family(name: str, doc: str, gauge: bool, labels: tuple[str, ...] = ("local_rank",)) -> Any:
    """One process-wide family per name (prometheus_client refuses a second registration)."""
    with _families_lock:
        if name not in _families:
            import prometheus_client

            if gauge:
                _families[name] = prometheus_client.Gauge(
                    f"{PREFIX}{name}", doc, list(labels), multiprocess_mode="livesum")
            else:
                _families[name] = prometheus_client.Counter(f"{PREFIX}{name}", doc, list(labels))
        return _families[name]


class StoreMetrics:
    """Exports one rank's store counters; :meth:`update` adds what grew since the last call."""

    def __init__(self, local_rank: int) -> None:
        self._rank = str(local_rank)
        self._seen: dict[str, int] = {}
        self._seen_f: dict[str, float] = {}
        self._disabled = False

    def update(self, stats: Mapping[str, Any]) -> None:
        if self._disabled:
            return
        try:
            for name, (doc, value_of) in COUNTERS.items():
                value = value_of(stats)
                grew = value - self._seen.get(name, 0)
                if grew > 0:
                    _family(name, doc, gauge=False).labels(self._rank).inc(grew)
                    self._seen[name] = value
                elif name not in self._seen:
                    _family(name, doc, gauge=False).labels(self._rank).inc(0)  # exported at 0
                    self._seen[name] = value
            pending = int(stats.get("tiers", {}).get("writeback_pending", 0))
            _family(PENDING, "Keys in the write-back ring, not yet on SSD.",
                    gauge=True).labels(self._rank).set(pending)
            for tier, pages in (stats.get("tier_pages") or {}).items():
                self._add(TIER_PAGES, "Pages served by each L3 tier (tier: dram, ssd).",
                          float(pages), (self._rank, tier), ("local_rank", "tier"))
            if stats.get("disk"):
                for name, (doc, disk_value) in DISK_COUNTERS.items():
                    self._add(name, doc, disk_value(stats), (self._rank,))
                for name, (doc, field) in DISK_GAUGES.items():
                    _family(name, doc, gauge=True).labels(self._rank).set(
                        int(stats["disk"].get(field, 0)))
        except Exception as e:  # metrics must never break the data path
            self._disabled = True
            log.warning("UMBP store metrics disabled: %r", e)

    def _add(self, name: str, doc: str, value: float, label_values: tuple[str, ...],
             labels: tuple[str, ...] = ("local_rank",)) -> None:
        """Increase a counter by what ``value`` grew since the last call (0 exports it)."""
        seen_key = name + "/" + "/".join(label_values)
        grew = value - self._seen_f.get(seen_key, 0.0)
        if grew > 0 or seen_key not in self._seen_f:
            _family(name, doc, gauge=False, labels=labels).labels(*label_values).inc(
                max(grew, 0.0))
            self._seen_f[seen_key] = value
