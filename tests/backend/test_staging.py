"""Staging memory formulas (``hicache_umbp.contract.staging``) the operator's planner imports.

Pure arithmetic, checked against numbers measured on real mori 1.2.4 (noted per test).
"""

from __future__ import annotations

import pytest
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.contract.staging import (
    SSD_STAGING_SLOTS,
    StagingMemory,
    sidecar_ssd_staging_bytes,
    ssd_keys_per_call,
    staging_memory_per_rank,
)
from hicache_umbp.contract.units import GIB, MIB

R1_PART = 8_994_816


def test_embedded_dram_and_ssd_for_a_deepseek_r1_page() -> None:
    """Measured: 16 slots of 8,994,816 B grew an SSD node's RSS by 139.8 MiB (137.25 MiB of
    slots); the ring holds floor(1 GiB / part) parts."""
    mem = staging_memory_per_rank(page_part_bytes=R1_PART, parts_per_page=1, mode="embedded",
                                  dram=True, ssd=True, queue_bytes=GIB)
    assert mem == StagingMemory(ring_bytes=(GIB // R1_PART) * R1_PART,
                                ssd_staging_bytes=SSD_STAGING_SLOTS * R1_PART)
    assert mem.total == 119 * R1_PART + 16 * R1_PART


@pytest.mark.parametrize(
    ("mode", "dram", "ssd", "ring", "staging"),
    [
        ("embedded", True, False, False, False),  # DRAM only: nothing staged
        ("embedded", False, True, False, True),  # SSD node alone: its slots
        ("standalone", True, True, True, False),  # the ring in the engine, slots in the sidecar
        ("standalone", True, False, False, False),
    ],
)
def test_which_buffers_exist_per_mode(
    mode: str, dram: bool, ssd: bool, ring: bool, staging: bool
) -> None:
    mem = staging_memory_per_rank(page_part_bytes=MIB, parts_per_page=2, mode=mode, dram=dram,
                                  ssd=ssd, queue_bytes=64 * MIB)
    assert (mem.ring_bytes > 0, mem.ssd_staging_bytes > 0) == (ring, staging)


def test_a_ring_budget_below_one_page_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"umbp_tier_queue_bytes.*8388608 bytes.*8994816"):
        staging_memory_per_rank(page_part_bytes=R1_PART, parts_per_page=1, mode="embedded",
                                dram=True, ssd=True, queue_bytes=8 * MIB)


@pytest.mark.parametrize(
    ("value", "slot", "keys"),
    [(8 * MIB, 8 * MIB, 16), (R1_PART, R1_PART, 16), (R1_PART, 8 * MIB, 8), (1, 8 * MIB, 16),
     (16 * 8 * MIB, 8 * MIB, 1), (16 * 8 * MIB + 1, 8 * MIB, 0)],
)
def test_ssd_keys_per_call(value: int, slot: int, keys: int) -> None:
    """Measured on a real sidecar with 16 slots of 8 MiB: a batch stages 8 R1 parts."""
    assert ssd_keys_per_call(value, slot) == keys


def test_sidecar_staging_is_slots_times_slot() -> None:
    assert sidecar_ssd_staging_bytes(8 * MIB) == 128 * MIB
    with pytest.raises(ValueError):
        sidecar_ssd_staging_bytes(0)
