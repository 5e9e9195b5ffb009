"""UMBPStore on the REAL amd-mori 1.2.4 (engine environment): embedded DRAM, embedded SSD node,
standalone servers and the configuration-driven ``build_store``.

Everything is real: mori's clients and servers, memfd host buffers, random page bytes. Nothing
is faked.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Iterator
from pathlib import Path

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
from hicache_umbp.contract.media import Medium
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
from hicache_umbp.store.keys import KeyScheme, PageFormat
from hicache_umbp.store.ring import MemfdStaging
from hicache_umbp.store.store import UMBPStore

from .conftest import StandaloneServers

pytestmark = pytest.mark.mori


MIB = 1 << 20
PART = 256 * 1024  # bytes per page part (small pages keep the tier quick on a shared machine)


class Pool:
    """A host pool like SGLang's page-first pool: ``pages`` pages of ``parts`` x ``PART``.

    ``shm``: allocated by mori's host allocator with AnonymousShm backing, the only memory a
    standalone server accepts; otherwise a memfd mapping (embedded clients take any memory).
    """

    def __init__(
        self, pages: int, parts: int, seed: int, part: int = PART, shm: bool = False
    ) -> None:
        self.pages, self.parts, self.part = pages, parts, part
        self.nbytes = pages * parts * part
        self._mem = MoriShmStaging(self.nbytes) if shm else MemfdStaging(self.nbytes)
        self.ptr = self._mem.ptr
        self.view = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))
        rng = np.random.default_rng(seed)
        self.view[:] = rng.integers(0, 256, self.nbytes, dtype=np.uint8)

    def ptrs(self, idx: range | list[int]) -> list[list[tuple[int, int]]]:
        base, part, parts = self.ptr, self.part, self.parts
        return [[(base + (i * parts + p) * part, part) for p in range(parts)] for i in idx]

    def page(self, i: int) -> np.ndarray:
        size = self.parts * self.part
        return self.view[i * size : (i + 1) * size]

    def zero(self) -> None:
        self.view[:] = 0

    def close(self) -> None:
        del self.view
        self._mem.close()


def hashes(n: int, tag: str) -> list[str]:
    return [f"{tag}-{i:060d}" for i in range(n)]


@pytest.fixture(params=[MHA_PARTS, MLA_PARTS], ids=["mha", "mla"])
def parts(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return request.param


@pytest.fixture
def pools() -> Iterator[list[Pool]]:
    made: list[Pool] = []
    yield made
    for p in made:
        p.close()


def scheme(parts: tuple[str, ...]) -> KeyScheme:
    return KeyScheme("test/store", "mori-model", 4, 1, parts)


def round_trip(store: UMBPStore, src: Pool, dst: Pool, tag: str, n: int, step: int = 8) -> None:
    hs = hashes(n, tag)
    assert store.register_buffer(src.ptr, src.nbytes)
    assert store.register_buffer(dst.ptr, dst.nbytes)
    for s in range(0, n, step):
        idx = range(s, min(n, s + step))
        assert store.batch_set(hs[s : s + step], src.ptrs(idx)) == [True] * len(idx)
    assert store.batch_exists(hs) == n
    dst.zero()
    for s in range(0, n, step):
        idx = range(s, min(n, s + step))
        assert store.batch_get(hs[s : s + step], dst.ptrs(idx)) == [True] * len(idx)
    for i in range(n):
        assert np.array_equal(dst.page(i), src.page(i)), f"page {i} differs"


def test_embedded_dram_round_trip_is_byte_exact(parts: tuple[str, ...], pools: list[Pool]) -> None:
    opened = make_embedded_dram_client(64 * MIB)
    store = UMBPStore(opened.client, scheme(parts), on_close=opened.close)
    src, dst = Pool(24, len(parts), 1), Pool(24, len(parts), 2)
    pools += [src, dst]
    round_trip(store, src, dst, "dram", 24)
    stats = store.stats()
    assert stats.pages_set == stats.pages_get == 24
    assert stats.bytes_get == 24 * len(parts) * PART
    assert stats.errors == {}
    store.close()


def test_partial_hits_return_the_present_prefix(pools: list[Pool]) -> None:
    opened = make_embedded_dram_client(64 * MIB)
    store = UMBPStore(opened.client, scheme(MHA_PARTS), on_close=opened.close)
    src, dst = Pool(16, 2, 3), Pool(16, 2, 4)
    pools += [src, dst]
    hs = hashes(16, "prefix")
    assert store.batch_set(hs[:10], src.ptrs(range(10))) == [True] * 10
    assert store.batch_exists(hs) == 10
    dst.zero()
    assert store.batch_get(hs, dst.ptrs(range(16))) == [True] * 10 + [False] * 6
    assert all(np.array_equal(dst.page(i), src.page(i)) for i in range(10))
    assert store.stats().get_misses == 6
    store.close()


def test_eviction_under_a_small_capacity_keeps_hits_byte_exact(pools: list[Pool]) -> None:
    """8 MiB of DRAM, 48 pages of 512 KiB (24 MiB): old pages go, what is found is exact."""
    opened = make_embedded_dram_client(8 * MIB)
    store = UMBPStore(opened.client, scheme(MHA_PARTS), on_close=opened.close)
    n = 48
    src, dst = Pool(n, 2, 5), Pool(n, 2, 6)
    pools += [src, dst]
    hs = hashes(n, "evict")
    stored = []
    for s in range(0, n, 2):
        stored += store.batch_set(hs[s : s + 2], src.ptrs(range(s, s + 2)))
    assert sum(stored) >= n // 2
    assert stored[-2:] == [True, True]
    dst.zero()
    got = store.batch_get(hs, dst.ptrs(range(n)))
    assert 0 < sum(got) < n  # some pages were evicted, the newest are still there
    assert got[-1] is True
    for i in range(n):
        if got[i]:
            assert np.array_equal(dst.page(i), src.page(i)), f"page {i} differs"
    assert store.batch_exists(hs) < n
    store.close()


def test_embedded_ssd_node_keeps_pages_in_the_ssd_directory(
    tmp_path: Path, pools: list[Pool]
) -> None:
    """The SSD node has no DRAM tier: every get is read from the segment logs under the dir."""
    ssd_dir = tmp_path / "ssd"
    opened = make_embedded_ssd_client(str(ssd_dir), 256 * MIB, max_value_bytes=PART)
    assert opened.max_batch_keys is not None
    store = UMBPStore(
        opened.client,
        scheme(MHA_PARTS),
        max_batch_pages=opened.max_batch_keys // 2,
        on_close=opened.close,
    )
    n = 40
    src, dst = Pool(n, 2, 7), Pool(n, 2, 8)
    pools += [src, dst]
    round_trip(store, src, dst, "ssd", n, step=n)  # 80 keys: chunked into 16-key calls
    assert store.stats().client_calls >= 2 + 2 * 5 + 1
    store.flush()
    segments = sorted(glob.glob(str(ssd_dir / "*")))
    assert segments, f"no data files under {ssd_dir}"
    on_disk = b"".join(Path(p).read_bytes() for p in segments if os.path.isfile(p))
    assert len(on_disk) >= n * 2 * PART
    for i in (0, n // 2, n - 1):  # the page bytes themselves are in the files
        assert src.page(i)[:PART].tobytes() in on_disk
    store.close()


def test_standalone_dram_and_ssd_servers(
    standalone_servers: StandaloneServers, tmp_path: Path, pools: list[Pool]
) -> None:
    dram_env = standalone_server_env("dram", capacity_bytes=64 * MIB)
    ssd_env = standalone_server_env(
        "ssd", capacity_bytes=256 * MIB, ssd_dir=str(tmp_path / "ssd"), value_bytes=PART
    )
    media: tuple[tuple[Medium, dict[str, str]], ...] = (("dram", dram_env), ("ssd", ssd_env))
    for medium, env in media:
        server = standalone_servers.start(medium, env)
        opened = make_standalone_client(server.socket_path, medium, wait_s=30)
        store = UMBPStore(
            opened.client,
            scheme(MHA_PARTS),
            max_batch_pages=(opened.max_batch_keys or 32) // 2,
            on_close=opened.close,
        )
        src, dst = Pool(20, 2, 9, shm=True), Pool(20, 2, 10, shm=True)
        pools += [src, dst]
        round_trip(store, src, dst, f"standalone-{medium}", 20)
        if medium == "ssd":
            assert glob.glob(str(tmp_path / "ssd" / "*")), "the SSD server wrote no data files"
        store.close()
        server.stop()
        assert server.process.returncode is not None


def test_build_store_from_the_configuration(tmp_path: Path, pools: list[Pool]) -> None:
    cfg = load_store_config(
        {"umbp_namespace": "prod/r1", "umbp_dram_bytes": str(64 * MIB), "umbp_local_ranks": 2},
        env={},
    )
    fmt = PageFormat("page_first", "bfloat16", 64)
    keys = KeyScheme("prod/r1", "org/model", 2, 1, MLA_PARTS, fmt)
    store = build_store(cfg.rank(1), keys=keys, value_bytes=PART)
    assert store.keys.page_keys("h") == [
        "hicache/v2/prod%2Fr1//org%2Fmodel//page_first/bfloat16/p64/tp2/r1/kv/h"
    ]
    src, dst = Pool(12, 1, 11), Pool(12, 1, 12)
    pools += [src, dst]
    round_trip(store, src, dst, "built", 12)
    store.close()
