"""The planner's standalone L3 on the REAL amd-mori 1.2.4: the env it renders for the umbp-dram
and umbp-ssd sidecars and for the engine's store takes the issue's page (DeepSeek-R1 bf16,
128 tokens: 8,994,816 B per part, more than the old 8 MiB slot) through the SSD tier.

Real: both ``umbp_standalone_server`` processes started with the sidecar env from the planned
StatefulSet (started by PID, always killed at teardown), the stores built by the backend's own
``build_store`` from the planned ConfigMap for every rank, mori-allocated shm host buffers.
Only what a test machine cannot hold is changed: the SSD directory and capacity, the DRAM
sidecar's capacity (made smaller than the pages written, so most are served by SSD) and the
socket directory. Every staging size (slot, slots, the SSD sidecar's DRAM pool) is the plan's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hicache_umbp.build import build_store
from hicache_umbp.clients.buffers import MoriShmStaging
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.contract.page_limits import MLA_PARTS
from hicache_umbp.contract.settings import BY_KEY
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.tiers import TieredClient
from support.planned_l3 import planned_l3, running_sidecars

pytestmark = pytest.mark.mori

MIB = 1 << 20
PART = 8_994_816  # 128 tokens x 70,272 B
PAGES = 16  # 144 MB: more than the 64 MiB DRAM sidecar holds


def _planned() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """ConfigMap env and the sidecars' env of the DeepSeek-R1 example at pageSize 128 (TP2 to
    keep the test machine's memory small: 2 x 32 slots of 8,994,816 B in the SSD sidecar)."""

    def edit(cr: dict[str, Any]) -> None:
        cr["spec"]["engine"].update(pageSize=128, tensorParallelSize=2)
        cr["spec"]["l3"]["tiering"] = {"queueSize": "128Mi"}
        cr["spec"]["l3"]["ssd"]["engine"] = "mori"  # the umbp-ssd sidecar is the subject

    planned = planned_l3("deepseek-r1-mi355x.yaml", edit)
    assert planned.plan.sizing.page is not None and planned.plan.sizing.page.part_bytes == PART
    return planned.engine_env, planned.sidecars


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    cm, sidecars = _planned()
    ssd = sidecars["umbp-ssd"]
    assert ssd["UMBP_DISTRIBUTED_DRAM_PAGE_SIZE"] == cm[BY_KEY["umbp_ssd_slot_bytes"].env] == str(
        PART
    )
    assert ssd["UMBP_DISTRIBUTED_SSD_STAGING_BUFFER_SLOTS"] == "64"  # 2 x 16 per rank, 2 ranks
    ssd.update(UMBP_SSD_DIR=str(tmp_path / "ssd"), UMBP_SSD_CAPACITY=str(1 << 30))
    sidecars["umbp-dram"]["UMBP_DRAM_CAPACITY"] = str(64 * MIB)
    with running_sidecars(sidecars, tmp_path) as sockets:
        yield cm, sockets


def test_the_planned_sidecars_stage_pages_larger_than_8_mib(
    servers: tuple[dict[str, str], Path],
) -> None:
    cm, sockets = servers
    env = {k: v for k, v in cm.items() if k.startswith("HICACHE_UMBP_")}
    env[BY_KEY["umbp_socket_dir"].env] = str(sockets)
    cfg = load_store_config({}, env)
    # MLA: one part per page, keyed as rank 0 of tp 1 on every rank (one writer, all read).
    keys = KeyScheme("inference/deepseek-r1", "m", 1, 0, MLA_PARTS)
    stores = [build_store(cfg.rank(r), keys=keys, value_bytes=PART) for r in range(2)]
    src, dst = MoriShmStaging(PAGES * PART), MoriShmStaging(PAGES * PART)
    try:
        view = np.ctypeslib.as_array((ctypes.c_uint8 * (PAGES * PART)).from_address(src.ptr))
        view[:] = np.random.default_rng(11).integers(0, 256, PAGES * PART, dtype=np.uint8)
        out = np.ctypeslib.as_array((ctypes.c_uint8 * (PAGES * PART)).from_address(dst.ptr))
        for s in stores:
            assert s.register_buffer(src.ptr, src.size) and s.register_buffer(dst.ptr, dst.size)
        hs = [f"page-{i:059d}" for i in range(PAGES)]

        def ptrs(base: int) -> list[list[tuple[int, int]]]:
            return [[(base + i * PART, PART)] for i in range(PAGES)]

        writer = stores[0]
        tiers = [s.client for s in stores]
        assert all(isinstance(t, TieredClient) for t in tiers)
        # One 16-slot batch of the sidecar stages 16 of these pages (the old 8 MiB slot: 8).
        assert all(t._ssd_step == 16 for t in tiers)  # type: ignore[attr-defined]
        assert writer.batch_set(hs, ptrs(src.ptr)) == [True] * PAGES
        assert writer.flush()
        for s in stores:  # every rank reads every page back, byte-exact
            out[:] = 0
            assert s.batch_get(hs, ptrs(dst.ptr)) == [True] * PAGES
            assert np.array_equal(out, view)
        stats = [t.tier_stats() for t in tiers]  # type: ignore[attr-defined]
        # Most pages came from the SSD sidecar (the 64 MiB DRAM sidecar holds at most 7),
        # nothing was refused for its size or lost on the way to SSD.
        assert all(st.ssd_hits >= PAGES - 7 and st.misses == 0 for st in stats), stats
        assert stats[0].writeback_failed == stats[0].ssd_too_large == 0, stats[0]
    finally:
        for s in stores:
            s.close()
        src.close()
        dst.close()
