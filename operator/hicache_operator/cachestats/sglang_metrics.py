"""SGLang's cache metrics: parse ``/metrics`` text, reduce it per pod, aggregate pods and windows.

Pure functions over the Prometheus text exposition format that SGLang 0.5.23 serves on its HTTP
port with ``--enable-metrics`` (prometheus_client's multiprocess collector; metric definitions in
``sglang/srt/observability/metrics_collector.py``). Only these families are read; every other
line, and any extra label, is ignored:

=============================================  ========  ===================================
family                                         type      labels SGLang sets (0.5.23)
=============================================  ========  ===================================
``sglang:prompt_tokens_total``                 counter   model_name, engine_type, is_streaming
``sglang:cached_tokens_total``                 counter   model_name, engine_type, cache_source
                                                         (device | host | storage | total)
``sglang:storage_prefetch_hit_tokens_total``   counter   storage_backend, tp_rank, dp_rank,
                                                         pp_rank, pp_size, attn_cp_rank/size
``sglang:backuped_tokens_total``               counter   (same as above): host -> L3 writes
``sglang:hicache_backup_dropped_tokens_total`` counter   (same): backups that never reached L3
``sglang:hicache_backup_tokens_total``         counter   cache_type, tp_rank, pp_rank, dp_rank,
                                                         pool: device -> host (L2) backups
``sglang:hicache_host_used_tokens``            gauge     model_name, engine_type, tp_rank,
``sglang:hicache_host_total_tokens``           gauge     pp_rank, moe_ep_rank[, dp_rank]
``hicache_umbp_ssd_refused_keys_total``        counter   local_rank (our store, see
``hicache_umbp_writeback_stalls_total``        counter   ``hicache_umbp.store.metrics``): SSD
``hicache_umbp_writeback_failed_keys_total``   counter   writes it could not get through
``hicache_umbp_l3_read_pages_total``           counter   local_rank, tier (dram | ssd): pages
                                                         each L3 tier served
``hicache_umbp_ssd_{read,written}_bytes_total`` counter  local_rank: the SSD tier's bytes and
``hicache_umbp_ssd_{read,write}_seconds_total`` counter  the wall time of its batches
``hicache_umbp_ssd_evictions_total``           counter   local_rank
``hicache_umbp_ssd_{write,read}_errors_total`` counter   local_rank: parts the disk failed
``hicache_umbp_ssd_pages``                     gauge     local_rank: pod-wide, the same on
``hicache_umbp_ssd_capacity_pages``            gauge     every rank (max, never summed)
=============================================  ========  ===================================

Per pod (one SGLang server): the tokenizer-side counters (prompt and cached tokens) are summed
over their series. The scheduler- and storage-side families are reported once per rank, each
rank counting the same logical tokens (TP and PP ranks, attention context-parallel ranks; with
MLA only the storage writer rank backs up): they are reduced with the *maximum* over those rank
labels and *summed* over the rest (data-parallel ranks serve different requests, one series per
storage backend).

Ratios: ``hit ratio of a tier = cached tokens from that tier / prompt tokens`` over the same
span (a window between two scrapes, or since the server started). L3 (SGLang's ``storage``)
covers both UMBP tiers: SGLang does not tell DRAM hits from SSD hits, our store does. Per pod,
over the same span, ``L3 DRAM tokens = storage tokens x dram pages / (dram + ssd pages)`` of
``hicache_umbp_l3_read_pages_total`` (summed over ranks: a share, so it holds whether every rank
or one reads a page), the SSD's likewise; a pod whose storage hits came with no page count in
the span (SGLang's built-in backend, or a scrape between the two) adds to neither.

The SSD tier (ours): read bandwidth ``= read bytes / read seconds`` summed over ranks and pods
(the speed of its read batches while they run, not its utilisation; write bandwidth alike);
pages and capacity are pod-wide gauges (max over ranks, summed over pods).

Failing L3 writes: our store counts its own (``hicache_umbp_*``, one series per rank, summed):
keys the SSD tier refused after retrying (their pages were reported not stored), write-back
stalls (acknowledged keys the SSD kept refusing for a whole retry window) and acknowledged keys
dropped unwritten; any increase means L3 writes are failing. SGLang 0.5.23 exports no
failed-write counter (a failed batch logs "Write page
to storage: N pages failed" and counts only the completed tokens). Every device -> host backup
is followed by a host -> L3 backup of the same pages, so over a window
``l3 written / l2 written`` below :data:`FAILING_WRITE_RATIO` (with at least
:data:`MIN_BACKUP_TOKENS` written to L2), or any dropped backup, means L3 writes are failing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hicache_umbp.contract import exposition
from hicache_umbp.contract.names import (
    SGLANG_L2_BACKUP_METRIC,
    SGLANG_L3_BACKUP_METRIC,
    SGLANG_L3_DROPPED_METRIC,
    SGLANG_RANK_LABELS,
)

PROMPT = "sglang:prompt_tokens_total"
CACHED = "sglang:cached_tokens_total"
PREFETCH_HIT = "sglang:storage_prefetch_hit_tokens_total"
L3_BACKUP = SGLANG_L3_BACKUP_METRIC
L3_DROPPED = SGLANG_L3_DROPPED_METRIC
L2_BACKUP = SGLANG_L2_BACKUP_METRIC
HOST_USED = "sglang:hicache_host_used_tokens"
HOST_TOTAL = "sglang:hicache_host_total_tokens"
UMBP_REFUSED = "hicache_umbp_ssd_refused_keys_total"
UMBP_STALLS = "hicache_umbp_writeback_stalls_total"
UMBP_LOST = "hicache_umbp_writeback_failed_keys_total"
L3_READ_PAGES = "hicache_umbp_l3_read_pages_total"
#: Our SSD tier's counters (summed over ranks) by the PodCounters field they fill.
SSD_COUNTERS = {
    "ssd_read_bytes": "hicache_umbp_ssd_read_bytes_total",
    "ssd_read_seconds": "hicache_umbp_ssd_read_seconds_total",
    "ssd_written_bytes": "hicache_umbp_ssd_written_bytes_total",
    "ssd_write_seconds": "hicache_umbp_ssd_write_seconds_total",
    "ssd_evictions": "hicache_umbp_ssd_evictions_total",
    "ssd_write_errors": "hicache_umbp_ssd_write_errors_total",
    "ssd_read_errors": "hicache_umbp_ssd_read_errors_total",
}
SSD_PAGES = "hicache_umbp_ssd_pages"
SSD_CAPACITY = "hicache_umbp_ssd_capacity_pages"
FAMILIES = (PROMPT, CACHED, PREFETCH_HIT, L3_BACKUP, L3_DROPPED, L2_BACKUP, HOST_USED, HOST_TOTAL,
            UMBP_REFUSED, UMBP_STALLS, UMBP_LOST, L3_READ_PAGES, *SSD_COUNTERS.values(),
            SSD_PAGES, SSD_CAPACITY)
L3_TIERS = ("dram", "ssd")  # our store's tier label values
#: The status' names of the L3 split (``status.cache.hitRatio``) -> our store's tier label.
L3_SPLIT = {"l3Dram": "dram", "l3Ssd": "ssd"}
#: Labels that name a replica of the same logical count (reduced with max, not summed).
RANK_LABELS = SGLANG_RANK_LABELS
TIERS = ("device", "host", "storage")  # SGLang's cache_source values, fastest first
FAILING_WRITE_RATIO = 0.5
MIN_BACKUP_TOKENS = 256


#: One sample of a wanted family (``hicache_umbp.contract.exposition``: prometheus_client's
#: parser, shared with the engine's drain).
Sample = exposition.Sample
#: A line of a wanted family that is not valid exposition text.
MetricsFormatError = exposition.ExpositionError


def parse_samples(text: str, families: Sequence[str] = FAMILIES) -> list[Sample]:
    """The samples of ``families`` in exposition ``text`` (other families are not parsed)."""
    return exposition.samples(text, families)


def _rank_reduced(samples: Iterable[Sample]) -> float:
    """Max over rank replicas of one logical count, summed over the other label sets."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in RANK_LABELS))
        groups[key] = max(groups.get(key, 0.0), s.value)
    return sum(groups.values())


@dataclass(frozen=True)
class PodCounters:
    """One pod's cache figures: counters (tokens, monotonic) and the host-pool gauges."""

    prompt_tokens: float = 0.0
    cached_tokens: Mapping[str, float] = field(default_factory=dict)  # cache_source -> tokens
    prefetch_hit_tokens: float = 0.0
    l3_backup_tokens: float = 0.0
    l3_dropped_tokens: float = 0.0
    l2_backup_tokens: float | None = None  # None: the family is not exported
    host_used_tokens: float | None = None
    host_total_tokens: float | None = None
    l3_refused_keys: float = 0.0  # our store: SSD writes refused after retrying
    l3_writeback_stalls: float = 0.0  # ... write-back stalls
    l3_lost_keys: float = 0.0  # ... acknowledged keys dropped unwritten
    l3_read_pages: Mapping[str, float] = field(default_factory=dict)  # tier -> pages served
    ssd_read_bytes: float = 0.0
    ssd_read_seconds: float = 0.0
    ssd_written_bytes: float = 0.0
    ssd_write_seconds: float = 0.0
    ssd_evictions: float = 0.0
    ssd_write_errors: float = 0.0
    ssd_read_errors: float = 0.0
    ssd_pages: float | None = None  # gauge: page parts on the pod's drives
    ssd_capacity_pages: float | None = None  # gauge: slots on the pod's drives

    def counters(self) -> dict[str, float]:
        out = {"prompt": self.prompt_tokens, "prefetch": self.prefetch_hit_tokens,
               "l3": self.l3_backup_tokens, "dropped": self.l3_dropped_tokens,
               "l2": self.l2_backup_tokens or 0.0, "refused": self.l3_refused_keys,
               "stalls": self.l3_writeback_stalls, "lost": self.l3_lost_keys}
        out.update({f"cached:{k}": v for k, v in self.cached_tokens.items()})
        out.update({f"read:{k}": v for k, v in self.l3_read_pages.items()})
        out.update({k: getattr(self, k) for k in SSD_COUNTERS})
        return out


def pod_counters(samples: Iterable[Sample]) -> PodCounters:
    """Reduce one pod's samples (see the module docstring for the rules)."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    cached: dict[str, float] = {}
    for s in by_name.get(CACHED, []):
        source = s.labels.get("cache_source", "total")
        cached[source] = cached.get(source, 0.0) + s.value

    def gauge(name: str) -> float | None:
        return _rank_reduced(by_name[name]) if name in by_name else None

    def pod_wide(name: str) -> float | None:  # the same on every rank: max, never summed
        return max(s.value for s in by_name[name]) if name in by_name else None

    pages: dict[str, float] = {}
    for s in by_name.get(L3_READ_PAGES, []):
        tier = s.labels.get("tier", "")
        if tier in L3_TIERS:
            pages[tier] = pages.get(tier, 0.0) + s.value
    ssd = {f: sum(s.value for s in by_name.get(name, [])) for f, name in SSD_COUNTERS.items()}

    return PodCounters(
        prompt_tokens=sum(s.value for s in by_name.get(PROMPT, [])),
        cached_tokens=cached,
        prefetch_hit_tokens=_rank_reduced(by_name.get(PREFETCH_HIT, [])),
        l3_backup_tokens=_rank_reduced(by_name.get(L3_BACKUP, [])),
        l3_dropped_tokens=_rank_reduced(by_name.get(L3_DROPPED, [])),
        l2_backup_tokens=gauge(L2_BACKUP),
        host_used_tokens=gauge(HOST_USED),
        host_total_tokens=gauge(HOST_TOTAL),
        l3_refused_keys=_rank_reduced(by_name.get(UMBP_REFUSED, [])),
        l3_writeback_stalls=_rank_reduced(by_name.get(UMBP_STALLS, [])),
        l3_lost_keys=_rank_reduced(by_name.get(UMBP_LOST, [])),
        l3_read_pages=pages,
        ssd_pages=pod_wide(SSD_PAGES),
        ssd_capacity_pages=pod_wide(SSD_CAPACITY),
        **ssd,
    )


def parse_pod(text: str) -> PodCounters:
    """``parse_samples`` + ``pod_counters`` for one ``/metrics`` page."""
    return pod_counters(parse_samples(text))


def increase(newer: PodCounters, older: PodCounters | None) -> PodCounters:
    """Counter increase from ``older`` to ``newer`` (gauges: ``newer``'s). A counter that went
    down means the server restarted: its value is then the increase since the restart, as in
    Prometheus' ``increase()``."""
    if older is None:
        return newer
    old, new = older.counters(), newer.counters()
    if any(new.get(k, 0.0) < v for k, v in old.items()):
        return newer  # reset
    cached = {k: v - older.cached_tokens.get(k, 0.0) for k, v in newer.cached_tokens.items()}
    return replace(
        newer,
        prompt_tokens=newer.prompt_tokens - older.prompt_tokens,
        cached_tokens=cached,
        prefetch_hit_tokens=newer.prefetch_hit_tokens - older.prefetch_hit_tokens,
        l3_backup_tokens=newer.l3_backup_tokens - older.l3_backup_tokens,
        l3_dropped_tokens=newer.l3_dropped_tokens - older.l3_dropped_tokens,
        l2_backup_tokens=None if newer.l2_backup_tokens is None
        else newer.l2_backup_tokens - (older.l2_backup_tokens or 0.0),
        l3_refused_keys=newer.l3_refused_keys - older.l3_refused_keys,
        l3_writeback_stalls=newer.l3_writeback_stalls - older.l3_writeback_stalls,
        l3_lost_keys=newer.l3_lost_keys - older.l3_lost_keys,
        l3_read_pages={k: v - older.l3_read_pages.get(k, 0.0)
                       for k, v in newer.l3_read_pages.items()},
        **{k: getattr(newer, k) - getattr(older, k) for k in SSD_COUNTERS},
    )


@dataclass(frozen=True)
class CacheFigures:
    """Cache figures of one CR over one span, summed over its pods."""

    pods: int
    prompt_tokens: float
    cached_tokens: Mapping[str, float]
    prefetch_hit_tokens: float
    l3_backup_tokens: float
    l3_dropped_tokens: float
    l2_backup_tokens: float | None
    host_used_tokens: float | None
    host_total_tokens: float | None
    l3_refused_keys: float = 0.0
    l3_writeback_stalls: float = 0.0
    l3_lost_keys: float = 0.0
    #: L3 hit tokens split by our store's tier (module docstring); None: no page counts
    l3_tier_tokens: Mapping[str, float] | None = None
    ssd: Mapping[str, float] = field(default_factory=dict)  # SSD_COUNTERS fields, summed
    ssd_pages: float | None = None
    ssd_capacity_pages: float | None = None

    def hit_ratio(self, tier: str | None = None) -> float | None:
        """Share of prompt tokens served from ``tier`` (None: from any cache tier; ``l3Dram``,
        ``l3Ssd``: L3 split by our store's tier); None when no prompt token was processed in
        the span, or the split is unknown."""
        if self.prompt_tokens <= 0:
            return None
        if tier in L3_SPLIT:
            if self.l3_tier_tokens is None:
                return None
            hits = self.l3_tier_tokens.get(L3_SPLIT[tier], 0.0)
        else:
            hits = (self.cached_tokens.get(tier, 0.0) if tier is not None
                    else sum(self.cached_tokens.values()))
        return min(1.0, max(0.0, hits / self.prompt_tokens))

    def ssd_bandwidth(self, direction: str) -> float | None:
        """Bytes per second of the SSD tier's ``read`` or ``write`` batches in the span (module
        docstring); None when it moved no bytes."""
        moved = self.ssd.get("ssd_read_bytes" if direction == "read" else "ssd_written_bytes", 0)
        secs = self.ssd.get("ssd_read_seconds" if direction == "read" else "ssd_write_seconds", 0)
        return moved / secs if moved > 0 and secs > 0 else None

    @property
    def host_used_ratio(self) -> float | None:
        if not self.host_total_tokens or self.host_used_tokens is None:
            return None
        return min(1.0, max(0.0, self.host_used_tokens / self.host_total_tokens))

    @property
    def l3_writes(self) -> str | None:
        """``Failing``, ``Ok``, ``Idle`` (nothing to write in the span) or None (unknown)."""
        if (self.l3_dropped_tokens > 0 or self.l3_refused_keys > 0 or self.l3_lost_keys > 0
                or self.l3_writeback_stalls > 0 or self.ssd.get("ssd_write_errors", 0) > 0):
            return "Failing"
        if self.l2_backup_tokens is None:
            return "Ok" if self.l3_backup_tokens > 0 else None
        if self.l2_backup_tokens < MIN_BACKUP_TOKENS:
            return "Ok" if self.l3_backup_tokens > 0 else "Idle"
        ratio = self.l3_backup_tokens / self.l2_backup_tokens
        return "Failing" if ratio < FAILING_WRITE_RATIO else "Ok"


def aggregate(pods: Iterable[PodCounters]) -> CacheFigures:
    """Sum per-pod figures (each already an increase over the span) into the CR's."""
    pods = list(pods)
    cached: dict[str, float] = {}
    for p in pods:
        for k, v in p.cached_tokens.items():
            cached[k] = cached.get(k, 0.0) + v

    def total(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    split: dict[str, float] | None = None
    for p in pods:
        served = sum(p.l3_read_pages.get(t, 0.0) for t in L3_TIERS)
        if served > 0:
            split = split or {}
            for t in L3_TIERS:
                split[t] = split.get(t, 0.0) + (
                    p.cached_tokens.get("storage", 0.0) * p.l3_read_pages.get(t, 0.0) / served)
    return CacheFigures(
        pods=len(pods),
        prompt_tokens=sum(p.prompt_tokens for p in pods),
        cached_tokens=cached,
        prefetch_hit_tokens=sum(p.prefetch_hit_tokens for p in pods),
        l3_backup_tokens=sum(p.l3_backup_tokens for p in pods),
        l3_dropped_tokens=sum(p.l3_dropped_tokens for p in pods),
        l2_backup_tokens=total([p.l2_backup_tokens for p in pods]),
        host_used_tokens=total([p.host_used_tokens for p in pods]),
        host_total_tokens=total([p.host_total_tokens for p in pods]),
        l3_refused_keys=sum(p.l3_refused_keys for p in pods),
        l3_writeback_stalls=sum(p.l3_writeback_stalls for p in pods),
        l3_lost_keys=sum(p.l3_lost_keys for p in pods),
        l3_tier_tokens=split,
        ssd={k: sum(getattr(p, k) for p in pods) for k in SSD_COUNTERS},
        ssd_pages=total([p.ssd_pages for p in pods]),
        ssd_capacity_pages=total([p.ssd_capacity_pages for p in pods]),
    )


def figures_from_pages(pages: Iterable[str]) -> CacheFigures:
    """Cumulative figures (since each server started) of the ``/metrics`` pages of one CR."""
    return aggregate(parse_pod(text) for text in pages)
