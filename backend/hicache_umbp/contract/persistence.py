"""What of the L3 cache survives a restart, per mode, as measured on amd-mori 1.2.4 (pure; the
operator's plan summary prints it, ``docs/operations.md`` explains it).

Measured by ``tests/backend/test_warm_cache_mori.py`` (every "lost"/"kept" below is a test):

* mori's DRAM pool lives in the process that opened it: the engine (embedded) or the DRAM
  sidecar (standalone).
* mori's SSD tier -- the embedded SSD node and the standalone SSD server alike -- keeps its
  index only in memory and, when it starts, *discards* the segment files it finds in its
  directory (``PeerSsdManager::DiscardLeftoverOnStartup``, unconditional in 1.2.4; the log
  says ``startup discard: wiping <n>B SSD leftover``): a retained PVC or hostPath gives no warm
  cache after the process that wrote it is gone.
* our SSD tier (``umbp_ssd_engine=hicache``, :mod:`hicache_umbp.disk`) keeps its index and
  slots in files on the volume and opens them again as they are: its pages survive an engine
  restart and a pod restart on the same node and volume (tests/backend/test_disk_store.py,
  test_warm_cache_mori.py, the pod tier).
* standalone sidecars are separate containers of the pod: when only the engine container
  restarts they keep running and keep their pages, and the new engine finds them (keys are
  content addresses; the store reconnects and registers its buffers again).

"Engine restart": the engine container restarts, sidecars keep running. "Pod restart": the pod
is recreated on the same node with the same PVC (every container starts afresh). "Reschedule":
the pod moves to another node.
"""

from __future__ import annotations

from dataclasses import dataclass

from .media import l3_media, no_l3_tier

LOST_DRAM = "lost (the DRAM pool lives in the process that restarts)"
LOST_SSD = ("lost (mori 1.2.4 discards the SSD segment files it finds when its SSD tier "
            "starts, even on the same volume)")
KEPT_SIDECARS = ("kept (the standalone sidecars keep running and keep their pages; the engine "
                 "reconnects)")
LOST_POD = "lost (every container of the pod starts afresh)"
LOST_POD_SSD = ("lost (every container of the pod starts afresh, and the SSD sidecar discards "
                "the segment files it finds, even on the same volume)")
LOST_MOVED = "lost (nothing of the cache follows the pod to another node)"
KEPT_SSD = ("SSD pages kept (our SSD tier keeps its slot files and index on the volume; a "
            "claim or hostPath outlives the pod, an emptyDir does not)")


@dataclass(frozen=True)
class WarmCache:
    """What survives each kind of restart, one sentence each."""

    engine_restart: str
    pod_restart: str
    reschedule: str

    def summary(self) -> str:
        return (f"engine restart: {self.engine_restart}; pod restart (same node and volume): "
                f"{self.pod_restart}; reschedule: {self.reschedule}")


def warm_cache_survival(mode: str, *, dram: bool, ssd: bool,
                        ssd_engine: str = "mori") -> WarmCache:
    """What of the L3 cache survives restarts for ``mode`` (``embedded`` or ``standalone``)
    with a DRAM and/or an SSD tier (standalone always runs the DRAM sidecar), the SSD tier
    stored by ``ssd_engine`` (``hicache``: ours, kept; ``mori``: discarded at start)."""
    if mode not in ("embedded", "standalone"):
        raise ValueError(f"mode={mode!r}: warm-cache behaviour is known for embedded and "
                         "standalone (distributed is not supported by this backend)")
    if not l3_media(mode, dram=dram, ssd=ssd):
        raise ValueError(no_l3_tier(dram="dram", ssd="ssd"))
    if ssd and ssd_engine == "hicache":
        if mode == "standalone":
            return WarmCache(KEPT_SIDECARS, f"{LOST_POD} but the DRAM sidecar's; {KEPT_SSD}",
                             LOST_MOVED)
        engine = f"{LOST_DRAM}; {KEPT_SSD}" if dram else KEPT_SSD
        return WarmCache(engine, engine, LOST_MOVED)
    if mode == "standalone":
        return WarmCache(KEPT_SIDECARS, LOST_POD_SSD if ssd else LOST_POD, LOST_MOVED)
    engine = LOST_SSD if ssd and not dram else LOST_DRAM
    if ssd and dram:
        engine = f"{LOST_DRAM}; SSD pages {LOST_SSD}"
    return WarmCache(engine, engine, LOST_MOVED)
