"""What the backend reports to SGLang's storage metrics: per-batch pages and GB/s for its
``StorageMetrics`` histograms (drained at each ``get_stats``), and the stores' own cumulative
counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..store.store import PagePointers, UMBPStore


@dataclass
class _Samples:
    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


class StorageSamples:
    """Per-batch samples SGLang's ``StorageMetrics`` histograms want, collected only when SGLang
    enabled storage metrics (``enable_storage_metrics``) and drained by :meth:`drain`."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._samples = _Samples()

    def sample(self, is_get: bool, ok: list[bool], pages: Sequence[PagePointers],
               start: float) -> None:
        """One batch that began at ``start`` (``time.perf_counter``): the pages it moved and
        their bytes per second."""
        if not self.enabled:
            return
        elapsed = max(time.perf_counter() - start, 1e-9)
        nbytes = sum(size for hit, page in zip(ok, pages, strict=True) if hit for _, size in page)
        gbps = nbytes / elapsed / 1e9
        with self._lock:
            m = self._samples
            (m.prefetch_pgs if is_get else m.backup_pgs).append(sum(ok))
            (m.prefetch_bandwidth if is_get else m.backup_bandwidth).append(gbps)

    def drain(self) -> Any:
        """SGLang's ``StorageMetrics`` with the samples since the last call."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        with self._lock:
            m, self._samples = self._samples, _Samples()
        metrics.prefetch_pgs.extend(m.prefetch_pgs)
        metrics.backup_pgs.extend(m.backup_pgs)
        metrics.prefetch_bandwidth.extend(m.prefetch_bandwidth)
        metrics.backup_bandwidth.extend(m.backup_bandwidth)
        return metrics


def merged_store_stats(stores: Sequence[UMBPStore]) -> dict[str, Any]:
    """The stores' cumulative counters, summed (split-head siblings count their own pages; they
    share one client, so its ``tiers`` counters appear once); empty before the host pool is
    registered."""
    if not stores:
        return {}
    stats = [asdict(s.stats()) for s in stores]
    merged = stats[0]
    for other in stats[1:]:
        for k, v in other.items():
            if isinstance(v, int):
                merged[k] += v
    return merged
