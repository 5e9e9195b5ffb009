"""Building one rank's store from the configuration and the registered host pool's page size.

The SGLang adapter builds the store when SGLang registers its host pool, not when it constructs
the backend: only then are the page part size (which sizes the SSD staging slots and the
write-back ring) and the page format (part of every key, :mod:`hicache_umbp.store.keys`) known.
Sizes the tiers cannot honour fail here, once, with a :class:`ConfigError` that names the page
size and the limit (:func:`hicache_umbp.contract.page_limits.page_size_problems`), before any
client is opened. The one place that wires configuration, mori clients, tiers and store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .clients.buffers import MoriShmStaging
from .clients.factories import OpenedClient, make_client
from .clients.runtime import require_distributed
from .contract.page_limits import page_size_problems
from .contract.settings import BY_KEY, ConfigError, RankConfig, StoreConfig
from .contract.staging import write_back_ring_keys
from .disk import DiskStore
from .store.keys import KeyScheme
from .store.protocol import UMBPClientLike
from .store.ring import MemfdStaging
from .store.store import UMBPStore
from .store.tiers import TieredClient

log = logging.getLogger(__name__)


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
    checked against every limit first (``page_size_problems``).
    """
    cfg = rank_config.config
    if cfg.umbp_mode == "distributed":
        require_distributed()
    check_page_size(rank_config, value_bytes, keys.parts_per_page)
    if opener is not None:
        return UMBPStore(opener(rank_config), keys, log_interval_s=cfg.umbp_log_interval_s)
    media = rank_config.media()
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
            if medium == "ssd" and cfg.umbp_ssd_engine == "hicache":
                opened.append(open_disk_tier(cfg, keys, value_bytes))
            else:
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
        try:
            client = _tiered(cfg, dram, ssd, ring_keys, value_bytes, keys.parts_per_page)
        except (RuntimeError, OSError, MemoryError) as e:
            close_all()
            s = BY_KEY["umbp_tier_queue_bytes"]
            raise ConfigError(
                [f"umbp_tier_queue_bytes ({s.env}) = {cfg.umbp_tier_queue_bytes} bytes: the "
                 f"write-back ring of rank {rank_config.local_rank} ({ring_keys} page parts "
                 f"of {value_bytes} bytes) could not be mapped: {e!r}; the container's "
                 "memory cannot hold it"]) from e
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
        medium=opened[0].medium if len(opened) == 1 else "dram",
    )


def open_disk_tier(cfg: StoreConfig, keys: KeyScheme, value_bytes: int) -> OpenedClient:
    """Our SSD tier (:mod:`hicache_umbp.disk`) on the pod's drives, shared by its ranks."""
    store = DiskStore.open(
        cfg.ssd_dirs(),
        capacity_bytes=cfg.ssd_pod_bytes(),
        value_bytes=value_bytes,
        identity=keys.pod_identity,
        io_threads=cfg.umbp_ssd_io_threads,
        direct_io=cfg.umbp_ssd_direct_io,
        durable=cfg.umbp_ssd_durability == "strict",
        log_interval_s=cfg.umbp_log_interval_s,
    )
    geo = store.geometry
    return OpenedClient(
        store, "ssd", cfg.umbp_mode, max_batch_keys=None, max_value_bytes=geo.slot_bytes,
        description=(f"hicache SSD tier on {len(store.drives)} drive(s) "
                     f"({geo.nslots} x {geo.slot_bytes} B slots each)"),
        _on_close=[store.close])


def _tiered(cfg: StoreConfig, dram: OpenedClient, ssd: OpenedClient, ring_keys: int,
            value_bytes: int, parts_per_page: int) -> TieredClient:
    return TieredClient(
        dram.client,
        ssd.client,
        write_policy=cfg.umbp_tier_write_policy,
        # The ring takes exactly ring_keys parts of value_bytes: <= the byte budget.
        queue_keys=ring_keys,
        queue_bytes=ring_keys * value_bytes,
        promote_on_hit=cfg.umbp_promote_on_hit,
        ssd_max_batch_keys=ssd.max_batch_keys,
        ssd_max_value_bytes=ssd.max_value_bytes,
        parts_per_page=parts_per_page,
        log_interval_s=cfg.umbp_log_interval_s,
        # Standalone servers accept only mori-allocated AnonymousShm buffers.
        staging=MoriShmStaging if cfg.umbp_mode == "standalone" else MemfdStaging,
    )
