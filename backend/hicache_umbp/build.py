"""Building one rank's store from the configuration and the registered host pool's page size.

The SGLang adapter builds the store when SGLang registers its host pool, not when it constructs
the backend: only then are the page part size (which sizes the SSD staging slots and the
write-back ring) and the page format (part of every key, :mod:`hicache_umbp.store.keys`) known.
Sizes the tiers cannot honour fail here, once, with a :class:`ConfigError` that names the page
size and the limit (:func:`page_size_problems`), before any client is opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .clients.factories import OpenedClient, UMBPClientLike, configured_media, make_client
from .contract.settings import BY_KEY, ConfigError, RankConfig
from .contract.staging import (
    SSD_STAGING_SLOTS,
    MemfdStaging,
    MoriShmStaging,
    ssd_keys_per_call,
    write_back_ring_keys,
)
from .store.keys import KeyScheme
from .store.store import UMBPStore
from .store.tiers import TieredClient

log = logging.getLogger(__name__)


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
    media = configured_media(rank)
    if cfg.umbp_mode == "embedded":
        for medium, cap, key in (("dram", rank.dram_bytes, "umbp_dram_bytes"),
                                 ("ssd", rank.ssd_bytes, "umbp_ssd_bytes")):
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
    slot = cfg.umbp_ssd_slot_bytes
    if (cfg.umbp_mode == "standalone" and "ssd" in media
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


def check_page_size(rank: RankConfig, value_bytes: int, parts_per_page: int) -> None:
    problems = page_size_problems(rank, value_bytes, parts_per_page)
    if problems:
        raise ConfigError(problems)


def build_store(
    rank_config: RankConfig,
    *,
    keys: KeyScheme,
    value_bytes: int,
    opener: Callable[[RankConfig], UMBPClientLike] | None = None,
) -> UMBPStore:
    """The store for one rank as the configuration asks (needs the real mori unless
    ``opener`` hands in a client, as the sglang test tier does with its in-process double).

    One medium configured: the mori client for it (embedded DRAM, embedded SSD node, or the
    standalone server of that medium). DRAM and SSD both configured: a
    :class:`~hicache_umbp.store.tiers.TieredClient` over the two, with ``umbp_tier_write_policy``,
    ``umbp_tier_queue_bytes`` (the ring's byte budget, see
    :func:`~hicache_umbp.contract.staging.write_back_ring_keys`) and ``umbp_promote_on_hit``.

    ``value_bytes`` is the registered host pool's page part size (the largest value the tiers
    must store): it sizes the embedded SSD node's staging slots and the write-back ring, and is
    checked against every limit first (:func:`page_size_problems`).
    """
    cfg = rank_config.config
    check_page_size(rank_config, value_bytes, keys.parts_per_page)
    if opener is not None:
        return UMBPStore(opener(rank_config), keys, log_interval_s=cfg.umbp_log_interval_s)
    media = configured_media(rank_config)
    ring_keys = (
        write_back_ring_keys(cfg.umbp_tier_queue_bytes, value_bytes, keys.parts_per_page)
        if len(media) > 1
        else 0
    )
    opened: list[OpenedClient] = []

    def close_all() -> None:
        for o in reversed(opened):
            o.close()

    try:
        for medium in media:
            opened.append(make_client(rank_config, medium, ssd_value_bytes=value_bytes))
    except BaseException:
        close_all()
        raise
    max_pages: int | None = None
    if len(opened) == 1:
        client: UMBPClientLike = opened[0].client
        if opened[0].max_batch_keys is not None:
            max_pages = max(1, opened[0].max_batch_keys // keys.parts_per_page)
    else:
        dram, ssd = opened
        client = TieredClient(
            dram.client,
            ssd.client,
            write_policy=cfg.umbp_tier_write_policy,
            # The ring takes exactly ring_keys parts of value_bytes: <= the byte budget.
            queue_keys=ring_keys,
            queue_bytes=ring_keys * value_bytes,
            promote_on_hit=cfg.umbp_promote_on_hit,
            ssd_max_batch_keys=ssd.max_batch_keys,
            ssd_max_value_bytes=ssd.max_value_bytes,
            parts_per_page=keys.parts_per_page,
            log_interval_s=cfg.umbp_log_interval_s,
            # Standalone servers accept only mori-allocated AnonymousShm buffers.
            staging=MoriShmStaging if cfg.umbp_mode == "standalone" else MemfdStaging,
        )
    log.info(
        "UMBP store for rank %d: %s; page part %d bytes; keys %s",
        rank_config.local_rank,
        " in front of ".join(o.description for o in opened),
        value_bytes,
        keys.page_keys("<page>")[0],
    )
    return UMBPStore(
        client,
        keys,
        log_interval_s=cfg.umbp_log_interval_s,
        max_batch_pages=max_pages,
        on_close=close_all,
    )
