"""DRAM in front of SSD on the REAL amd-mori 1.2.4: a working set four times the DRAM tier is
served byte-exact from the two tiers (embedded clients, standalone servers, and ``build_store``
from a DRAM+SSD configuration).

Everything is real: two mori clients (a DRAM pool and an SSD node writing segment logs, or two
``umbp_standalone_server`` processes), the write-back thread, memfd / mori-allocated buffers and
random page bytes. Nothing is faked.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest
from hicache_umbp.client import (
    make_embedded_dram_client,
    make_embedded_ssd_client,
    make_standalone_client,
)
from hicache_umbp.config import load_store_config
from hicache_umbp.keys import MHA_PARTS, KeyScheme
from hicache_umbp.mori_env import standalone_server_env
from hicache_umbp.store import UMBPStore, build_store
from hicache_umbp.tiers import MoriShmStaging, TieredClient

from .conftest import StandaloneServers
from .test_store_mori import PART, Pool, hashes

pytestmark = pytest.mark.mori

MIB = 1 << 20
DRAM = 8 * MIB  # the DRAM tier
PAGES = 64  # 64 pages x 2 parts x 256 KiB = 32 MiB: four times the DRAM tier
BATCH = 4  # pages per batch_set (2 MiB)
# More staging slots than keys per batch; the short read lease comes from the real path
# (hicache_umbp.client.SSD_READ_LEASE_MS, standalone_server_env).
SSD_SLOTS = 64


def serve_larger_than_dram(store: UMBPStore, tiers: TieredClient, tag: str) -> None:
    src, dst = Pool(PAGES, 2, 21, shm=True), Pool(PAGES, 2, 22, shm=True)
    try:
        hs = hashes(PAGES, tag)
        assert store.register_buffer(src.ptr, src.nbytes)
        assert store.register_buffer(dst.ptr, dst.nbytes)
        for s in range(0, PAGES, BATCH):
            got = store.batch_set(hs[s : s + BATCH], src.ptrs(range(s, s + BATCH)))
            assert got == [True] * BATCH, f"pages {s}..{s + BATCH - 1}: {got}"
        assert store.flush()
        assert store.batch_exists(hs) == PAGES
        dst.zero()
        for s in range(0, PAGES, 8):
            got = store.batch_get(hs[s : s + 8], dst.ptrs(range(s, s + 8)))
            assert got == [True] * 8, f"pages {s}..{s + 7}: {got}"
        for i in range(PAGES):
            assert np.array_equal(dst.page(i), src.page(i)), f"page {i} differs"
        st = tiers.tier_stats()
        assert st.ssd_hits > 0, "nothing came from SSD: the working set fit in DRAM"
        assert st.writeback_failed == 0
        assert st.misses == 0
    finally:
        store.close()
        src.close()
        dst.close()


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_embedded_dram_in_front_of_an_ssd_node(tmp_path: Path, policy: str) -> None:
    dram = make_embedded_dram_client(DRAM)
    ssd = make_embedded_ssd_client(
        str(tmp_path / "ssd"), 256 * MIB, max_value_bytes=PART, staging_slots=SSD_SLOTS
    )
    tiers = TieredClient(
        dram.client,
        ssd.client,
        write_policy=policy,
        queue_bytes=16 * PART,
        ssd_max_batch_keys=16,
        on_close=lambda: (dram.close(), ssd.close()),
    )
    store = UMBPStore(tiers, KeyScheme("t", "m", 1, 0, MHA_PARTS))
    serve_larger_than_dram(store, tiers, f"emb-{policy}")
    assert glob.glob(str(tmp_path / "ssd" / "*"))


def test_two_standalone_servers(standalone_servers: StandaloneServers, tmp_path: Path) -> None:
    d = standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=DRAM))
    s = standalone_servers.start(
        "ssd",
        standalone_server_env(
            "ssd",
            capacity_bytes=256 * MIB,
            ssd_dir=str(tmp_path / "ssd"),
            value_bytes=PART,
            staging_slots=SSD_SLOTS,
        ),
    )
    dram = make_standalone_client(d.socket_path, "dram", wait_s=30)
    ssd = make_standalone_client(s.socket_path, "ssd", wait_s=30)
    tiers = TieredClient(
        dram.client,
        ssd.client,
        queue_bytes=16 * PART,
        ssd_max_batch_keys=16,
        staging=MoriShmStaging,
        on_close=lambda: (dram.close(), ssd.close()),
    )
    store = UMBPStore(tiers, KeyScheme("t", "m", 1, 0, MHA_PARTS))
    serve_larger_than_dram(store, tiers, "standalone")
    assert tiers.tier_stats().writeback_done > 0


def test_build_store_composes_dram_and_ssd_from_the_configuration(tmp_path: Path) -> None:
    cfg = load_store_config(
        {
            "umbp_dram_bytes": str(DRAM),
            "umbp_ssd_enabled": "true",
            "umbp_ssd_dir": str(tmp_path),
            "umbp_ssd_bytes": str(256 * MIB),
        },
        env={},
    )
    store = build_store(
        cfg.rank(0), model_id="m", tp_size=1, rank=0, parts=MHA_PARTS, value_bytes=PART
    )
    tiers = store.client
    assert isinstance(tiers, TieredClient)
    assert tiers.write_policy == cfg.umbp_tier_write_policy
    serve_larger_than_dram(store, tiers, "built")
    assert glob.glob(str(tmp_path / "rank-0" / "*"))


@pytest.mark.parametrize("read_first", [True, False])
def test_mori_dram_evicts_fresh_puts_first_once_full_of_read_keys(read_first: bool) -> None:
    """Why write-back copies inside the put (tiers.py): on a DRAM tier full of keys that were
    read, mori 1.2.4 acknowledges fresh puts and evicts exactly them in the same call, so a
    background DRAM -> SSD copy would find nothing to copy. Without the reads it is plain LRU."""
    opened = make_embedded_dram_client(DRAM)  # 32 values of 256 KiB
    pool = Pool(32, 1, 31)
    try:
        client = opened.client
        old, new = hashes(24, "old"), hashes(8, "new")
        ptrs = [p for [(p, _)] in pool.ptrs(range(32))]
        assert client.batch_put_from_ptr(old, ptrs[:24], [PART] * 24) == [True] * 24
        if read_first:
            assert client.batch_get_into_ptr(old, ptrs[:24], [PART] * 24) == [True] * 24
        assert client.batch_put_from_ptr(new, ptrs[24:], [PART] * 8) == [True] * 8
        if read_first:
            assert client.batch_exists(old) == [True] * 24
            assert client.batch_exists(new) == [False] * 8  # acknowledged, then evicted
        else:
            assert client.batch_exists(new) == [True] * 8
            assert not all(client.batch_exists(old))
    finally:
        opened.close()
        pool.close()
