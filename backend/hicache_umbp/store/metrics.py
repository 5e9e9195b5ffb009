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
    "writeback_failed_keys": (
        "Acknowledged keys the write-back dropped unwritten (only at close, after retrying); "
        "DRAM may still hold them until it evicts them.",
        lambda s: int(s.get("tiers", {}).get("writeback_failed", 0))),
}
PENDING = "writeback_pending_keys"
FAMILIES = (*(f"{PREFIX}{name}_total" for name in COUNTERS), f"{PREFIX}{PENDING}")

_families: dict[str, Any] = {}
_families_lock = threading.Lock()


def _family(name: str, doc: str, gauge: bool) -> Any:
    """One process-wide family per name (prometheus_client refuses a second registration)."""
    with _families_lock:
        if name not in _families:
            import prometheus_client

            if gauge:
                _families[name] = prometheus_client.Gauge(
                    f"{PREFIX}{name}", doc, ["local_rank"], multiprocess_mode="livesum")
            else:
                _families[name] = prometheus_client.Counter(
                    f"{PREFIX}{name}", doc, ["local_rank"])
        return _families[name]


class StoreMetrics:
    """Exports one rank's store counters; :meth:`update` adds what grew since the last call."""

    def __init__(self, local_rank: int) -> None:
        self._rank = str(local_rank)
        self._seen: dict[str, int] = {}
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
        except Exception as e:  # metrics must never break the data path
            self._disabled = True
            log.warning("UMBP store metrics disabled: %r", e)
