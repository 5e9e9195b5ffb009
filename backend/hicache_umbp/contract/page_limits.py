"""Which pages a rank's L3 tiers can hold: the store refuses the others when SGLang registers
its host pool, and the operator's planner refuses them at admission with the same words.

A page is ``parts_per_page`` parts of ``value_bytes`` (MHA: K and V, MLA: one part); the limits
are the embedded tiers' capacities, the write-back ring's budget and the 16 staging slots of one
standalone SSD batch (:mod:`.staging`).
"""

from __future__ import annotations

from .settings import BY_KEY, ConfigError, RankConfig
from .staging import SSD_STAGING_SLOTS, ssd_keys_per_call, write_back_ring_keys

#: The parts of one page, as the store keys them: K and V of an MHA page, the one latent part of
#: an MLA page (replicated on every rank).
MHA_PARTS: tuple[str, ...] = ("k", "v")
MLA_PARTS: tuple[str, ...] = ("kv",)

def page_size_problems(rank: RankConfig, value_bytes: int, parts_per_page: int) -> list[str]:
    """What this rank's tiers cannot do with pages of ``parts_per_page`` x ``value_bytes``.

    * every tier must hold one whole page (embedded DRAM and SSD capacity per rank);
    * DRAM + SSD: the write-back ring budget must hold one page;
    * one batch of a standalone SSD sidecar must stage a whole page: a part takes
      ``ceil(part / umbp_ssd_slot_bytes)`` of its 16 slots (:func:`ssd_keys_per_call`).
    Embedded SSD slots are sized from ``value_bytes`` itself, so they always fit.
    """
    cfg = rank.config
    page = parts_per_page * value_bytes
    what = f"a page of {parts_per_page} part(s) x {value_bytes} bytes = {page} bytes"
    problems: list[str] = []
    if value_bytes < 1:
        return [f"page part size {value_bytes} bytes: the host pool reported no page bytes"]
    media = rank.media()
    ours = cfg.umbp_ssd_engine == "hicache"
    if cfg.umbp_mode == "embedded":
        for medium, cap, key in (("dram", rank.dram_bytes, "umbp_dram_bytes"),
                                 ("ssd", rank.ssd_bytes, "umbp_ssd_bytes")):
            if medium == "ssd" and ours:
                continue  # the pod's drives are shared: checked below
            if medium in media and cap < page:
                problems.append(
                    f"{key} ({BY_KEY[key].env}) of rank {rank.local_rank} = {cap} bytes cannot "
                    f"hold {what}"
                )
    if len(media) > 1:
        try:
            write_back_ring_keys(cfg.umbp_tier_queue_bytes, value_bytes, parts_per_page)
        except ConfigError as e:
            problems += e.problems
    if "ssd" in media and ours:
        drives = max(1, len(cfg.ssd_dirs()))
        share = cfg.ssd_pod_bytes() // drives
        slot_bytes = -(-value_bytes // 4096) * 4096
        if share < parts_per_page * slot_bytes:
            s = BY_KEY["umbp_ssd_bytes"]
            problems.append(
                f"{s.key} ({s.env}): the pod's {cfg.ssd_pod_bytes()} bytes over {drives} "
                f"drive(s) leave {share} bytes per drive, which cannot hold {what} (one 4 KiB-"
                f"aligned slot of {slot_bytes} bytes per part)")
    slot = cfg.umbp_ssd_slot_bytes
    if (cfg.umbp_mode == "standalone" and "ssd" in media and not ours
            and ssd_keys_per_call(value_bytes, slot) < parts_per_page):
        s = BY_KEY["umbp_ssd_slot_bytes"]
        problems.append(
            f"the page part of {value_bytes} bytes ({what}) does not fit one batch of the "
            f"umbp-ssd sidecar: {SSD_STAGING_SLOTS} staging slots of {s.key} ({s.env}) = "
            f"{slot} bytes stage at most {SSD_STAGING_SLOTS * slot // parts_per_page} bytes per "
            f"part; start the sidecar with UMBP_DISTRIBUTED_DRAM_PAGE_SIZE >= {value_bytes} "
            f"and set {s.key} to the same number"
        )
    return problems
