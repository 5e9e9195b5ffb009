"""Host allocator, mmap path (no mori): real mmap/memfd/mbind/madvise on this host.

Nothing is faked. This host has no hugepages reserved (HugePages_Total 0), so a hugepage
request takes the demotion path; the tests read the real backing back from /proc/self/smaps,
/proc/self/maps and /proc/self/numa_maps. Counts (resident bytes, workers), never timings.
"""

from __future__ import annotations

import gc
import logging
import weakref

import numpy as np
import pytest
from hicache_umbp.allocator import (
    BASE_PAGE,
    GIB,
    MIB,
    HostAllocator,
    HugepagesUnavailableError,
    hugepages_free,
    mapping_info,
    numa_nodes,
)

SIZE = 16 * MIB


def _maps_line(path: str, ptr: int) -> str:
    with open(path) as f:
        return next((line for line in f if int(line.split("-")[0].split()[0], 16) == ptr), "")


@pytest.fixture
def mmap_alloc():  # type: ignore[no-untyped-def]
    def make(**kw):  # type: ignore[no-untyped-def]
        return HostAllocator(use_mori=False, **kw)

    return make


def test_hugepage_request_reports_the_real_backing(mmap_alloc, caplog) -> None:  # type: ignore[no-untyped-def]
    alloc = mmap_alloc(hugepage_bytes=2 * MIB, prefault=True)
    with caplog.at_level(logging.WARNING, logger="hicache_umbp.allocator"):
        buf = alloc.alloc(SIZE)
    real_page = mapping_info(buf.ptr)["KernelPageSize"]
    assert buf.backing.page_bytes == real_page
    if hugepages_free(2 * MIB) * 2 * MIB >= SIZE:
        assert not buf.demoted and real_page == 2 * MIB
    else:  # this machine: no hugepages, so the demotion must be reported and loud
        assert buf.demoted and real_page == BASE_PAGE
        assert alloc.demotions == 1
        assert "HUGEPAGES DEMOTED" in caplog.text and "hugepages-2Mi" in caplog.text
    buf.free()


def test_demotion_can_be_refused(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    alloc = mmap_alloc(hugepage_bytes=GIB, allow_demotion=False)
    if hugepages_free(GIB) >= 1:
        assert not alloc.alloc(GIB).demoted
        return
    with pytest.raises(HugepagesUnavailableError, match="hugepages-1Gi"):
        alloc.alloc(SIZE)


def test_small_pages_are_not_a_demotion(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    buf = mmap_alloc(hugepage_bytes=0).alloc(SIZE)
    assert not buf.demoted and buf.backing.page_bytes == BASE_PAGE
    assert buf.backing.path == "mmap"


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_prefault_makes_every_page_resident(mmap_alloc, threads: int) -> None:  # type: ignore[no-untyped-def]
    buf = mmap_alloc(hugepage_bytes=0, prefault=False).alloc(SIZE)
    assert mapping_info(buf.ptr).get("Rss", 0) == 0
    assert buf.prefault(threads) == threads
    assert mapping_info(buf.ptr)["Rss"] == buf.mapped_size


def test_alloc_prefaults_by_default(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    buf = mmap_alloc(hugepage_bytes=0, prefault_threads=2).alloc(SIZE)
    assert mapping_info(buf.ptr)["Rss"] == buf.mapped_size


def test_shared_buffers_are_memfd_backed(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    buf = mmap_alloc(hugepage_bytes=0, shared=True).alloc(SIZE)
    assert buf.backing.shared
    assert "/memfd:hicache-host-pool" in _maps_line("/proc/self/maps", buf.ptr)
    private = mmap_alloc(hugepage_bytes=0).alloc(SIZE)
    assert "memfd" not in _maps_line("/proc/self/maps", private.ptr)


def test_numa_binding_is_applied(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    node = numa_nodes()[-1]
    buf = mmap_alloc(hugepage_bytes=0, numa_node=node).alloc(SIZE)
    line = _maps_line("/proc/self/numa_maps", buf.ptr)
    assert f"bind:{node}" in line
    assert f"N{node}={buf.mapped_size // BASE_PAGE}" in line


def test_view_roundtrips_and_keeps_the_buffer_alive(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    buf = mmap_alloc(hugepage_bytes=0).alloc(SIZE)
    arr = np.frombuffer(buf.view(), dtype=np.uint8)
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8)
    arr[:] = data
    assert np.array_equal(np.frombuffer(buf.view(), dtype=np.uint8), data)
    watch = weakref.ref(buf)
    del buf
    gc.collect()
    assert watch() is not None and not watch().freed, "a live view lost its buffer"
    del arr
    gc.collect()
    assert watch() is None


def test_buffer_keeps_its_allocator_alive(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    alloc = mmap_alloc(hugepage_bytes=0)
    buf = alloc.alloc(SIZE)
    watch = weakref.ref(alloc)
    del alloc
    gc.collect()
    assert watch() is buf.allocator


def test_free_is_idempotent_and_views_refuse_afterwards(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    buf = mmap_alloc(hugepage_bytes=0).alloc(SIZE)
    ptr = buf.ptr
    buf.free()
    buf.free()
    assert buf.freed
    assert _maps_line("/proc/self/maps", ptr) == ""
    with pytest.raises(ValueError, match="already freed"):
        buf.view()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"hugepage_bytes": 4096}, r"hugepage_bytes=4096 is not supported; allowed: 0"),
        ({"numa_node": 4096}, r"numa_node=4096 does not exist on this host; allowed: -1"),
        ({"prefault_threads": -1}, "prefault_threads must be >= 0"),
    ],
)
def test_bad_settings_name_the_field(kwargs, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        HostAllocator(use_mori=False, **kwargs)


def test_bad_size_is_rejected(mmap_alloc) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="size must be > 0"):
        mmap_alloc().alloc(0)
