"""What of the L3 cache survives a restart, per mode and SSD engine (pure; the operator's plan
summary prints it, ``docs/operations.md`` explains it).

The hicache SSD tier (``umbp_ssd_engine=hicache``, :mod:`hicache_umbp.disk`) keeps its slot
files and its index on the volume and opens them again as they are, in the engine process in
either mode: its pages survive an engine restart and a pod restart on the same node and volume
(an emptyDir is a new volume for a new pod, so there only the engine restart keeps them).

Measured by ``tests/backend/test_warm_cache_mori.py`` (every "lost"/"kept" below is a test):

* mori's DRAM pool lives in the process that opened it: the engine (embedded) or the DRAM
  sidecar (standalone).
* mori's SSD tier -- the embedded SSD node and the standalone SSD server alike -- keeps its
  index only in memory and, when it starts, *discards* the segment files it finds in its
  directory (``PeerSsdManager::DiscardLeftoverOnStartup``, unconditional in 1.2.4; the log
  says ``startup discard: wiping <n>B SSD leftover``): a retained PVC or hostPath gives no warm
  cache after the process that wrote it is gone.
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
KEPT_SSD = ("kept (the hicache SSD tier's slot files and index stay on the volume and are "
            "opened again)")
LOST_SSD_EMPTYDIR = "lost (an emptyDir SSD volume is new for every pod)"


@dataclass(frozen=True)
class WarmCache:
    """What survives each kind of restart, one sentence each."""

    engine_restart: str
    pod_restart: str
    reschedule: str

    def summary(self) -> str:
        return (f"engine restart: {self.engine_restart}; pod restart (same node and volume): "
                f"{self.pod_restart}; reschedule: {self.reschedule}")


def warm_cache_survival(mode: str, *, dram: bool, ssd: bool, ssd_engine: str = "mori",
                        ssd_volume_kept: bool = True) -> WarmCache:
    """What of the L3 cache survives restarts for ``mode`` (``embedded`` or ``standalone``)
    with a DRAM and/or an SSD tier (standalone always runs the DRAM sidecar) stored by
    ``ssd_engine``; ``ssd_volume_kept``: a new pod on the same node gets the same SSD volume
    (a claim or a hostPath; not an emptyDir)."""
    if mode not in ("embedded", "standalone"):
        raise ValueError(f"mode={mode!r}: warm-cache behaviour is known for embedded and "
                         "standalone (distributed is not supported by this backend)")
    if not l3_media(mode, dram=dram, ssd=ssd):
        raise ValueError(no_l3_tier(dram="dram", ssd="ssd"))
    if ssd and ssd_engine == "hicache":
        return _ours(mode, dram=dram, volume_kept=ssd_volume_kept)
    if mode == "standalone":
        return WarmCache(KEPT_SIDECARS, LOST_POD_SSD if ssd else LOST_POD, LOST_MOVED)
    engine = LOST_SSD if ssd and not dram else LOST_DRAM
    if ssd and dram:
        engine = f"{LOST_DRAM}; SSD pages {LOST_SSD}"
    return WarmCache(engine, engine, LOST_MOVED)


def _ours(mode: str, *, dram: bool, volume_kept: bool) -> WarmCache:
    """The hicache SSD tier, behind the DRAM tier of ``mode`` (if any)."""
    pod_ssd = KEPT_SSD if volume_kept else LOST_SSD_EMPTYDIR
    if mode == "standalone":
        return WarmCache(f"DRAM pages {KEPT_SIDECARS}; SSD pages {KEPT_SSD}",
                         f"DRAM pages {LOST_POD}; SSD pages {pod_ssd}", LOST_MOVED)
    if not dram:
        return WarmCache(KEPT_SSD, pod_ssd, LOST_MOVED)
    return WarmCache(f"DRAM pages {LOST_DRAM}; SSD pages {KEPT_SSD}",
                     f"DRAM pages {LOST_DRAM}; SSD pages {pod_ssd}", LOST_MOVED)
