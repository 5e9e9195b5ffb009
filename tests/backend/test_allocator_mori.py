"""Host allocator, mori path: real ``UMBPHostMemAllocator`` and a real standalone server.

Nothing is faked: memory comes from mori's allocator; the standalone server is a real
``umbp_standalone_server`` process (started and killed by PID by the fixture).
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from hicache_umbp.clients.factories import make_standalone_client
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.units import MIB
from hicache_umbp.hostmem.allocator import (
    BASE_PAGE,
    HostAllocator,
    hugepages_free,
    mapping_info,
)

from .conftest import StandaloneServers

pytestmark = pytest.mark.mori

SIZE = 16 * MIB


def test_default_path_is_mori_and_reports_demotion() -> None:
    alloc = HostAllocator(hugepage_bytes=2 * MIB, shared=True, prefault=False)
    assert alloc.path == "mori"
    buf = alloc.alloc(SIZE)
    real_page = mapping_info(buf.ptr).get("KernelPageSize", BASE_PAGE)
    assert buf.backing.page_bytes == real_page
    if hugepages_free(2 * MIB) * 2 * MIB >= SIZE:
        assert buf.backing.mori_backing == "AnonymousShmHugetlb" and not buf.demoted
    else:  # mori silently falls back to AnonymousShm: we must notice
        assert buf.backing.mori_backing == "AnonymousShm"
        assert buf.demoted and alloc.demotions == 1
    buf.free()
    buf.free()


@pytest.mark.parametrize("threads", [1, 4])
def test_mori_buffers_are_prefaulted_in_parallel(threads: int) -> None:
    buf = HostAllocator(hugepage_bytes=0, prefault=False).alloc(SIZE)
    assert mapping_info(buf.ptr).get("Rss", 0) == 0
    assert buf.prefault(threads) == threads
    assert mapping_info(buf.ptr)["Rss"] == buf.mapped_size


def test_views_keep_mori_buffers_and_allocator_alive() -> None:
    alloc = HostAllocator(hugepage_bytes=0)
    buf = alloc.alloc(SIZE)
    arr = np.frombuffer(buf.view(), dtype=np.uint8)
    arr[:] = 3
    a_ref, b_ref = weakref.ref(alloc), weakref.ref(buf)
    del alloc, buf
    gc.collect()
    assert b_ref() is not None and a_ref() is not None
    assert int(arr.sum()) == 3 * SIZE
    del arr
    gc.collect()
    assert b_ref() is None


def test_standalone_server_needs_shared_buffers(standalone_servers: StandaloneServers) -> None:
    """A memfd (AnonymousShm) buffer registers with the server and round-trips; a private one
    is refused -- why the allocator must be ``shared=True`` in standalone mode."""
    server = standalone_servers.start("dram", standalone_server_env("dram", capacity_bytes=SIZE))
    opened = make_standalone_client(server.socket_path, "dram", wait_s=30)
    client = opened.client
    shared = HostAllocator(hugepage_bytes=0, shared=True).alloc(2 * MIB)
    view = np.frombuffer(shared.view(), dtype=np.uint8)
    view[:MIB] = np.random.default_rng(3).integers(0, 256, MIB, dtype=np.uint8)
    assert client.register_memory(shared.ptr, shared.size) is True
    assert client.batch_put_from_ptr(["k"], [shared.ptr], [MIB]) == [True]
    assert client.batch_get_into_ptr(["k"], [shared.ptr + MIB], [MIB]) == [True]
    assert np.array_equal(view[:MIB], view[MIB:])
    private = HostAllocator(hugepage_bytes=0, shared=False).alloc(2 * MIB)
    with pytest.raises(RuntimeError, match="AnonymousShm"):
        client.register_memory(private.ptr, private.size)
    client.deregister_memory(shared.ptr)
    opened.close()


# ----------------------------------------------------------------------------- issue 11, item 6a


@pytest.mark.parametrize(("shared", "backing"), [(False, "AnonymousHugetlb"),
                                                 (True, "AnonymousShmHugetlb")])
def test_mori_hugepage_buffers_are_really_backed_and_prefaulted_in_parallel(
    hugepages_2m, shared: bool, backing: str
) -> None:
    """Real hugepages reserved for the test (the fixture gives them back), real mori allocator:
    64 MiB with hugetlb backing on NUMA node 0, prefaulted by 2 threads. mori reports the
    hugetlb backing, the kernel 2 MiB pages on node 0, every page taken from the pool."""
    pool = hugepages_2m(64)
    free_before = pool.free()
    alloc = HostAllocator(hugepage_bytes=2 * MIB, shared=shared, numa_node=0, prefault=False,
                          allow_demotion=False)
    buf = alloc.alloc(64 * MIB)
    try:
        assert buf.backing.mori_backing == backing and not buf.demoted
        assert mapping_info(buf.ptr)["KernelPageSize"] == 2 * MIB
        assert buf.prefault(2) == 2
        assert free_before - pool.free() == buf.mapped_size // (2 * MIB)
        with open("/proc/self/numa_maps") as f:
            line = next(ln for ln in f if int(ln.split()[0], 16) == buf.ptr)
        assert "huge" in line and f"N0={buf.mapped_size // (2 * MIB)}" in line
        if not shared:  # private buffers stay out of fork() (allocator._dont_fork)
            with open("/proc/self/smaps") as f:
                text = f.read()
            block = text[text.index(f"{buf.ptr:x}-"):]
            flags = next(ln for ln in block.splitlines() if ln.startswith("VmFlags:"))
            assert " dc" in flags
    finally:
        buf.free()
    assert pool.free() == free_before
