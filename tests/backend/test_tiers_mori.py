"""DRAM in front of SSD on the REAL amd-mori 1.2.4: a working set four times the DRAM tier is
served byte-exact from the two tiers (embedded clients, standalone servers, and ``build_store``
from a DRAM+SSD configuration).

Everything is real: two mori clients (a DRAM pool and an SSD node writing segment logs, or two
``umbp_standalone_server`` processes), the write-back thread, memfd / mori-allocated buffers and
random page bytes. Nothing is faked.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hicache_umbp.build import build_store
from hicache_umbp.clients.buffers import MoriShmStaging
from hicache_umbp.clients.factories import (
    make_embedded_dram_client,
    make_embedded_ssd_client,
    make_standalone_client,
)
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.store import UMBPStore
from hicache_umbp.store.tiers import TieredClient

from .conftest import StandaloneServers
from .test_store_mori import PART, Pool, hashes

pytestmark = pytest.mark.mori

MIB = 1 << 20
DRAM = 8 * MIB  # the DRAM tier
PAGES = 64  # 64 pages x 2 parts x 256 KiB = 32 MiB: four times the DRAM tier
BATCH = 4  # pages per batch_set (2 MiB)
# More staging slots than keys per batch; the short read lease comes from the real path
# (hicache_umbp.clients.factories.SSD_READ_LEASE_MS, standalone_server_env).
SSD_SLOTS = 64


def close_both(*opened: Any) -> Callable[[], None]:
    """The tiered client's close hook: close each opened client, DRAM first."""
    def close() -> None:
        for o in opened:
            o.close()
    return close


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
        on_close=close_both(dram, ssd),
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
        on_close=close_both(dram, ssd),
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
    store = build_store(cfg.rank(0), keys=KeyScheme("", "m", 1, 0, MHA_PARTS), value_bytes=PART)
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


# ----------------------------------------------------------------------------- issue 11, item 6g


def _evict_first_part_only(dram: object, k_key: str, v_key: str, pool: Pool) -> int:
    """Make mori's DRAM tier drop the page's K part but keep its V part: read V (refreshing its
    LRU position), then put filler values until K is gone. Returns the fillers used."""
    client = dram
    (v_ptr, _), = pool.ptrs([2])[0][:1]
    assert client.batch_get_into_ptr([v_key], [v_ptr], [PART]) == [True]  # type: ignore[attr-defined]
    for i in range(64):
        (f_ptr, _), = pool.ptrs([3 + i % 8])[0][:1]
        assert client.batch_put_from_ptr([f"filler-{i}"], [f_ptr], [PART]) == [True]  # type: ignore[attr-defined]
        if client.batch_exists([k_key, v_key]) == [False, True]:  # type: ignore[attr-defined]
            return i + 1
    raise AssertionError("mori's DRAM tier never evicted K alone")


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_a_page_rewritten_after_a_partial_dram_eviction_is_never_torn(
    tmp_path: Path, policy: str
) -> None:
    """Real: mori's embedded DRAM pool (8 MiB) in front of its SSD node, our TieredClient and
    store. Writer A stores page P (K and V = 0x01), it reaches SSD; mori's DRAM then evicts
    P's K but keeps its V (we read V and put filler values straight into the DRAM client, the
    only staged step); writer B stores P again with 0x02. mori keys are write-once per key, so
    DRAM took B's K beside A's V, and a read returned K=0x02, V=0x01 -- a torn page. A page
    must come back whole: here A's page, from SSD."""
    cfg = load_store_config(
        {
            "umbp_dram_bytes": str(DRAM),
            "umbp_ssd_enabled": "true",
            "umbp_ssd_dir": str(tmp_path),
            "umbp_ssd_bytes": str(256 * MIB),
            "umbp_tier_write_policy": policy,
            "umbp_tier_queue_bytes": str(16 * PART),
        },
        env={},
    )
    keys = KeyScheme("t", "m", 1, 0, MHA_PARTS)
    store = build_store(cfg.rank(0), keys=keys, value_bytes=PART)
    tiers = store.client
    assert isinstance(tiers, TieredClient)
    a, b, dst = Pool(1, 2, 1), Pool(1, 2, 2), Pool(12, 2, 3)
    a.view[:] = 1
    b.view[:] = 2
    page = "f" * 64
    k_key, v_key = keys.page_keys(page)
    try:
        assert store.batch_set([page], a.ptrs([0])) == [True]
        assert store.flush()
        _evict_first_part_only(tiers.dram, k_key, v_key, dst)
        assert store.batch_set([page], b.ptrs([0])) == [True]
        assert store.flush()
        dst.zero()
        assert store.batch_get([page], dst.ptrs([0])) == [True]
        got = dst.page(0)
        k, v = got[:PART], got[PART:]
        assert k.min() == k.max() and v.min() == v.max(), "a part mixes two writes"
        assert (int(k[0]), int(v[0])) == (1, 1), f"torn page: K from write {k[0]}, V {v[0]}"
    finally:
        store.close()
        for p in (a, b, dst):
            p.close()


# ----------------------------------------------------------------------------- issue 11, item 2

R1_PART = 8_994_816  # DeepSeek-R1 bf16 MLA page of 128 tokens: 61 layers x 128 x 576 x 2 B


def test_pages_larger_than_8_mib_reach_ssd_and_come_back(tmp_path: Path) -> None:
    """Real: mori's embedded DRAM pool (32 MiB: 3 pages) in front of its SSD node, built by
    build_store from the configuration with the host pool's real part size. 16 DeepSeek-R1
    pages (8,994,816 B each, 144 MB) are set, flushed and read back byte-exact, mostly from SSD.
    Before the slots were sized from the page, they were 8 MiB: the SSD refused the parts
    (writeback_failed rose while every set returned True) and pages evicted from DRAM were
    lost."""
    cfg = load_store_config(
        {
            "umbp_dram_bytes": str(32 * MIB),
            "umbp_ssd_enabled": "true",
            "umbp_ssd_dir": str(tmp_path),
            "umbp_ssd_bytes": str(1024 * MIB),
            "umbp_tier_queue_bytes": str(4 * R1_PART),
        },
        env={},
    )
    keys = KeyScheme("t", "r1", 1, 0, MLA_PARTS)
    store = build_store(cfg.rank(0), keys=keys, value_bytes=R1_PART)
    tiers = store.client
    assert isinstance(tiers, TieredClient)
    n = 16
    src, dst = Pool(n, 1, 41, part=R1_PART), Pool(n, 1, 42, part=R1_PART)
    hs = hashes(n, "r1")
    try:
        for s in range(0, n, 4):
            assert store.batch_set(hs[s : s + 4], src.ptrs(range(s, s + 4))) == [True] * 4
        assert store.flush()
        st = tiers.tier_stats()
        # Pages DRAM took went through the ring, the rest straight to SSD: all of them landed.
        assert st.writeback_failed == 0 and st.writeback_done > 0
        assert st.writeback_done + st.ssd_direct_writes == n
        dst.zero()
        for s in range(0, n, 4):
            assert store.batch_get(hs[s : s + 4], dst.ptrs(range(s, s + 4))) == [True] * 4
        for i in range(n):
            assert np.array_equal(dst.page(i), src.page(i)), f"page {i} differs"
        assert tiers.tier_stats().ssd_hits >= n - 3
    finally:
        store.close()
        src.close()
        dst.close()


def test_a_sidecar_with_8_mib_slots_stores_deepseek_r1_pages_in_smaller_batches(
    standalone_servers: StandaloneServers, tmp_path: Path
) -> None:
    """Real: two umbp_standalone_server sidecars (DRAM 32 MiB, SSD with the default 16 slots
    of 8 MiB) and build_store in standalone mode. mori stages a value in ceil(value / slot)
    slots, so a DeepSeek-R1 part (8,994,816 B) takes 2 and one SSD batch holds 8 of them: the
    raw sidecar refuses the tail of a 16-part batch. The store sizes its SSD batches from the
    registered part size, so 16 pages reach the SSD and read back byte-exact. Before, it sent
    16 parts per call and the sidecar refused half of them (writeback_failed)."""
    from hicache_umbp.hostmem.allocator import HostAllocator

    ssd_env = standalone_server_env("ssd", capacity_bytes=1024 * MIB, ssd_dir=str(tmp_path / "s"))
    standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=32 * MIB),
                             name="dram")
    server = standalone_servers.start("ssd", ssd_env, name="ssd")
    raw = make_standalone_client(server.socket_path, "ssd", wait_s=30, max_batch_keys=16)
    buf = HostAllocator(hugepage_bytes=0, shared=True, prefault=False).alloc(16 * R1_PART)
    try:
        assert raw.client.register_memory(buf.ptr, buf.size) is True
        ptrs = [buf.ptr + i * R1_PART for i in range(16)]
        got = raw.client.batch_put_from_ptr([f"raw{i}" for i in range(16)], ptrs, [R1_PART] * 16)
        assert 0 < sum(got) <= 8, got
    finally:
        raw.client.deregister_memory(buf.ptr)
        raw.close()
        buf.free()
    cfg = load_store_config(
        {"umbp_mode": "standalone", "umbp_ssd_enabled": "true", "umbp_socket_dir": str(tmp_path),
         "umbp_tier_queue_bytes": str(4 * R1_PART)},
        env={},
    )
    store = build_store(cfg.rank(0), keys=KeyScheme("t", "r1", 1, 0, MLA_PARTS),
                        value_bytes=R1_PART)
    tiers = store.client
    assert isinstance(tiers, TieredClient)
    n = 16
    src, dst = Pool(n, 1, 43, part=R1_PART, shm=True), Pool(n, 1, 44, part=R1_PART, shm=True)
    hs = hashes(n, "r1-standalone")
    try:
        assert store.register_buffer(src.ptr, src.nbytes) and store.register_buffer(dst.ptr,
                                                                                     dst.nbytes)
        for s in range(0, n, 4):
            assert store.batch_set(hs[s : s + 4], src.ptrs(range(s, s + 4))) == [True] * 4
        assert store.flush()
        st = tiers.tier_stats()
        assert st.writeback_failed == 0
        assert st.writeback_done + st.ssd_direct_writes == n
        dst.zero()
        for s in range(0, n, 4):
            assert store.batch_get(hs[s : s + 4], dst.ptrs(range(s, s + 4))) == [True] * 4
        assert all(np.array_equal(dst.page(i), src.page(i)) for i in range(n))
        assert tiers.tier_stats().ssd_hits >= n - 3
    finally:
        store.close()
        src.close()
        dst.close()


def test_a_page_part_no_sidecar_batch_can_stage_is_refused_at_build(tmp_path: Path) -> None:
    """Real configuration and build_store (no server is needed: the check runs before any
    client opens). A part larger than all 16 slots of the sidecar (16 x 8 MiB) can never be
    stored: the store refuses it, naming the page size and the limit."""
    cfg = load_store_config(
        {"umbp_mode": "standalone", "umbp_ssd_enabled": "true",
         "umbp_socket_dir": str(tmp_path), "umbp_tier_queue_bytes": str(1 << 30)},
        env={},
    )
    big = 16 * 8 * MIB + 1
    with pytest.raises(ConfigError) as err:
        build_store(cfg.rank(0), keys=KeyScheme("t", "m", 1, 0, MLA_PARTS), value_bytes=big)
    msg = str(err.value)
    assert str(big) in msg and "umbp_ssd_slot_bytes" in msg and str(8 * MIB) in msg
