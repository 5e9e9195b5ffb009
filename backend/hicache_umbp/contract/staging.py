"""Staging memory of the L3 path: how much there is (pure formulas the operator's planner
imports). The buffers are :mod:`hicache_umbp.store.ring` and :mod:`hicache_umbp.clients.buffers`.

Sizes (:func:`staging_memory_per_rank`, :func:`write_back_ring_keys`): every staging slot holds
one page *part* (K or V of an MHA page, the whole MLA page), so every size follows from the
registered host pool's real part bytes, never from a default. Measured on amd-mori 1.2.4: an
embedded SSD node with 16 slots of 8,994,816 B (a DeepSeek-R1 bf16 page of 128 tokens) grew the
process RSS by 139.8 MiB for 137.25 MiB of slots (one prefaulted mapping).
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import BY_KEY, SSD_SLOT_BYTES_DEFAULT, ConfigError
from .units import ceil_div

#: Staging slots of mori's SSD node per put batch (its ``ssd_staging_buffer_slots`` default).
SSD_STAGING_SLOTS = 16
#: Largest value (one key's bytes) an SSD node accepts unless told otherwise: one staging slot.
#: The store sizes embedded slots from the registered host pool's page part instead
#: (:mod:`hicache_umbp.build`); this default is the standalone sidecar's (umbp_ssd_slot_bytes).
SSD_VALUE_BYTES_DEFAULT = SSD_SLOT_BYTES_DEFAULT


@dataclass(frozen=True)
class StagingMemory:
    """Host memory one rank's L3 client stages pages in, in bytes (not hugepages: memfd, mori
    shm or anonymous memory, so it counts against the container's memory limit)."""

    #: write-back ring of the DRAM+SSD composition (engine process), 0 without both tiers
    ring_bytes: int
    #: staging slots of the embedded SSD node (engine process), 0 unless embedded SSD
    ssd_staging_bytes: int

    @property
    def total(self) -> int:
        return self.ring_bytes + self.ssd_staging_bytes


def write_back_ring_keys(queue_bytes: int, value_bytes: int, parts_per_page: int) -> int:
    """Page parts the write-back ring holds: ``queue_bytes // value_bytes``.

    The ring then takes exactly ``keys x value_bytes`` bytes, never more than the budget (the
    operator counts the budget against the pod memory). It must hold one whole page
    (``parts_per_page x value_bytes``), or no page could ever be written back.
    """
    page_bytes = parts_per_page * value_bytes
    if queue_bytes < page_bytes:
        setting = BY_KEY["umbp_tier_queue_bytes"]
        raise ConfigError(
            [f"{setting.key} ({setting.env})={queue_bytes} bytes is smaller than one page: "
             f"{parts_per_page} part(s) x {value_bytes} bytes = {page_bytes} bytes; the "
             f"write-back ring needs a budget of at least {page_bytes} bytes"]
        )
    return queue_bytes // value_bytes


def staging_memory_per_rank(
    *,
    page_part_bytes: int,
    parts_per_page: int,
    mode: str,
    dram: bool,
    ssd: bool,
    queue_bytes: int,
    staging_slots: int = SSD_STAGING_SLOTS,
) -> StagingMemory:
    """The true staging memory of one rank for pages of ``parts_per_page`` x
    ``page_part_bytes`` (MHA: 2 parts, MLA: 1):

    * write-back ring, when a DRAM and an SSD tier are both on (embedded or standalone: the
      composition runs in the engine): ``floor(queue_bytes / part) x part`` (<= queue_bytes);
      raises :class:`ConfigError` when that is less than one page;
    * embedded SSD node staging, when the SSD tier is on in embedded mode:
      ``staging_slots x part`` (16 x part by default). A standalone SSD tier stages in the
      umbp-ssd sidecar instead: :func:`sidecar_ssd_staging_bytes`.

    ``dram``: the DRAM tier is on (standalone mode always has the DRAM sidecar).
    """
    if page_part_bytes < 1 or parts_per_page < 1 or staging_slots < 1:
        raise ValueError("page_part_bytes, parts_per_page and staging_slots must be >= 1")
    tiered = ssd and (dram or mode == "standalone")
    ring = 0
    if tiered:
        ring = write_back_ring_keys(queue_bytes, page_part_bytes, parts_per_page)
        ring *= page_part_bytes
    ssd_staging = staging_slots * page_part_bytes if ssd and mode == "embedded" else 0
    return StagingMemory(ring_bytes=ring, ssd_staging_bytes=ssd_staging)


def ssd_keys_per_call(
    value_bytes: int, slot_bytes: int, staging_slots: int = SSD_STAGING_SLOTS
) -> int:
    """Values of ``value_bytes`` one SSD put or get batch can stage: mori's SSD node gives each
    value ``ceil(value_bytes / slot_bytes)`` of its ``staging_slots`` slots (measured on 1.2.4:
    a sidecar with 16 slots of 8 MiB stages 8 DeepSeek-R1 parts of 8,994,816 B per batch, and
    refuses the rest of a larger batch). 0 when one value needs more than every slot."""
    if value_bytes < 1 or slot_bytes < 1 or staging_slots < 1:
        raise ValueError("value_bytes, slot_bytes and staging_slots must be >= 1")
    return staging_slots // ceil_div(value_bytes, slot_bytes)


def sidecar_ssd_staging_bytes(slot_bytes: int, staging_slots: int = SSD_STAGING_SLOTS) -> int:
    """Staging memory of one umbp-ssd sidecar: ``staging_slots x slot_bytes``, which mori takes
    from the sidecar's DRAM pool (``UMBP_DRAM_CAPACITY``, see
    :func:`hicache_umbp.contract.mori_env.standalone_server_env`); ``slot_bytes`` >= the page
    part."""
    if slot_bytes < 1 or staging_slots < 1:
        raise ValueError("slot_bytes and staging_slots must be >= 1")
    return staging_slots * slot_bytes
