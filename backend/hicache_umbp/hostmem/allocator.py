"""Host memory for KV pools: hugepages, NUMA binding, parallel prefault, honest reporting.

:class:`HostAllocator` hands out :class:`HostBuffer` objects. Two paths, same reporting:

* **mori** (the engine image and the engine environment, where ``mori.umbp`` imports): memory comes
  from ``UMBPHostMemAllocator.alloc(size, backing, hugepage_size, numa_node, prefault=False)``.
  Standalone mode needs it: the standalone server only accepts buffers this allocator made with an
  ``AnonymousShm`` / ``AnonymousShmHugetlb`` (memfd) backing.
* **mmap** (the 3.11 project venv, the operator, anything without mori): ``mmap`` through
  ctypes with ``MAP_HUGETLB | MAP_HUGE_<size>`` (private) or ``memfd_create(MFD_HUGETLB)``
  (shared), NUMA binding with ``mbind(MPOL_BIND)``.

Either way the buffer is allocated *without* ``MAP_POPULATE`` and then prefaulted by N threads,
each binding itself to the buffer's NUMA node's CPUs and populating its own slice with
``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+; ``memset`` otherwise). ctypes releases the GIL
around both calls, so the threads really run in parallel; one ``MAP_POPULATE`` thread is what
made a 1 TiB pool take minutes.

Hugepages are never silently lost: when the kernel has none (``HugePages_Free`` 0, or the cgroup
hugetlb limit), mori quietly returns 4 KiB memory and mmap fails with ENOMEM; the buffer then
reports ``demoted=True`` and the page size it really got (read back from ``/proc/self/smaps``),
and a WARNING is logged -- or :class:`HugepagesUnavailableError` is raised when
``allow_demotion=False``.

Lifetime: every buffer holds its allocator; every view (:meth:`HostBuffer.view`) holds its
buffer; memory is freed by :meth:`HostBuffer.free` (idempotent) or when the last reference is
gone. Do not call ``free`` while a tensor made from a view is still in use.
"""

from __future__ import annotations

import ctypes
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..contract.units import GIB, MIB, round_up

# The kernel-facing helpers live in hicache_umbp.hostmem.kernel; the public ones are re-exported.
from .kernel import (
    BASE_PAGE,
    _dont_fork,
    _libc,
    _map,
    _mbind,
    _prefault,
    allowed_numa_nodes,
    hugepages_free,
    kernel_page_size,
    mapping_info,
    node_cpus,
    numa_nodes,
)

__all__ = [
    "BASE_PAGE", "HUGEPAGE_BYTES", "Backing", "HostAllocator", "HostBuffer",
    "HugepagesUnavailableError", "allowed_numa_nodes", "hugepages_free", "kernel_page_size",
    "mapping_info", "node_cpus", "numa_nodes",
]

log = logging.getLogger(__name__)

HUGEPAGE_BYTES = (0, 2 * MIB, GIB)

class HugepagesUnavailableError(MemoryError):
    """Hugepages were asked for, the kernel had none, and demotion was not allowed."""


@dataclass(frozen=True)
class Backing:
    """What a buffer really got."""

    path: str  # "mori" or "mmap"
    shared: bool  # memfd-backed (AnonymousShm*): the standalone server can map it
    hugepage_bytes_requested: int
    page_bytes: int  # the kernel page size actually backing the mapping
    numa_node: int
    demoted: bool  # hugepages were asked for and the kernel gave 4 KiB pages
    mori_backing: str = ""  # UMBPHostBufferBacking name on the mori path


class HostBuffer:
    """One allocation. ``ptr``/``size`` for mori and SGLang; :meth:`view` for Python."""

    def __init__(
        self,
        allocator: HostAllocator,
        ptr: int,
        size: int,
        mapped_size: int,
        backing: Backing,
        release: Callable[[], None],
    ) -> None:
        self.allocator = allocator  # keeps the allocator (and mori's) alive as long as we live
        self.ptr = ptr
        self.size = size
        self.mapped_size = mapped_size
        self.backing = backing
        self._finalizer = weakref.finalize(self, release)

    @property
    def demoted(self) -> bool:
        return self.backing.demoted

    @property
    def freed(self) -> bool:
        return not self._finalizer.alive

    def free(self) -> None:
        """Release the memory now; later calls do nothing."""
        self._finalizer()

    def view(self) -> memoryview:
        """A writable byte view that keeps this buffer alive (``numpy.frombuffer`` accepts it)."""
        if self.freed:
            raise ValueError("buffer already freed")
        owner = _view_type(self.size).from_address(self.ptr)
        owner.buffer = self
        return memoryview(owner).cast("B")

    def prefault(self, threads: int = 0) -> int:
        """Touch every page with ``threads`` workers (0: one per CPU of the node); returns the
        number of workers used."""
        return _prefault(self.ptr, self.mapped_size, threads, self.backing.numa_node)

    def __repr__(self) -> str:
        b = self.backing
        return (
            f"HostBuffer(ptr=0x{self.ptr:x}, size={self.size}, page={b.page_bytes}, "
            f"path={b.path}, shared={b.shared}, numa={b.numa_node}, demoted={b.demoted})"
        )


_VIEW_TYPES: dict[int, Any] = {}


def _view_type(size: int) -> Any:
    # A subclass of the ctypes array type, so instances can carry the owning buffer.
    cls = _VIEW_TYPES.get(size)
    if cls is None:
        cls = type("HostBytes", (ctypes.c_uint8 * size,), {})
        _VIEW_TYPES[size] = cls
    return cls


class HostAllocator:
    """Allocates host buffers with one hugepage size, NUMA policy and prefault policy.

    ``hugepage_bytes``: 2 MiB (default), 1 GiB or 0 (4 KiB pages). ``numa_node``: -1 for none.
    ``shared``: memfd-backed, required for a standalone UMBP server. ``prefault_threads``: 0 for
    one per CPU of the NUMA node. ``allow_demotion``: take 4 KiB pages (loudly) when hugepages
    run out instead of raising. ``use_mori``: None picks mori when importable.
    """

    def __init__(
        self,
        *,
        hugepage_bytes: int = 2 * MIB,
        numa_node: int = -1,
        prefault: bool = True,
        prefault_threads: int = 0,
        shared: bool = False,
        allow_demotion: bool = True,
        use_mori: bool | None = None,
    ) -> None:
        if hugepage_bytes not in HUGEPAGE_BYTES:
            raise ValueError(
                f"hugepage_bytes={hugepage_bytes} is not supported; allowed: 0 (4 KiB pages), "
                f"{2 * MIB} (2 MiB), {GIB} (1 GiB)"
            )
        nodes = numa_nodes()
        if numa_node != -1 and numa_node not in nodes:
            raise ValueError(
                f"numa_node={numa_node} does not exist on this host; allowed: -1 (no binding) "
                f"or one of {nodes}"
            )
        allowed = allowed_numa_nodes()
        if numa_node != -1 and numa_node not in allowed:
            # mbind(MPOL_BIND) to a node outside the cpuset fails with EINVAL: say why first.
            raise ValueError(
                f"numa_node={numa_node} is outside the NUMA nodes this container may use "
                f"{allowed} (Mems_allowed_list of /proc/self/status: the pod's cpuset.mems, e.g. "
                "pinned by the kubelet Memory Manager's static policy); bind to one of those "
                "nodes, or use -1 (no binding)"
            )
        if prefault_threads < 0:
            raise ValueError(f"prefault_threads must be >= 0, got {prefault_threads}")
        self.hugepage_bytes = hugepage_bytes
        self.numa_node = numa_node
        self.prefault = prefault
        self.prefault_threads = prefault_threads
        self.shared = shared
        self.allow_demotion = allow_demotion
        self._mori: Any = _load_mori() if use_mori in (None, True) else None
        if use_mori is True and self._mori is None:
            raise RuntimeError("use_mori=True but mori.umbp is not importable here")
        self._mori_alloc: Any = self._mori.UMBPHostMemAllocator() if self._mori else None
        self.demotions = 0

    @property
    def path(self) -> str:
        return "mori" if self._mori is not None else "mmap"

    def alloc(self, size: int) -> HostBuffer:
        """A buffer of at least ``size`` bytes, prefaulted if the allocator says so."""
        if size <= 0:
            raise ValueError(f"size must be > 0, got {size}")
        buf = self._alloc_mori(size) if self._mori is not None else self._alloc_mmap(size)
        if buf.demoted:
            self.demotions += 1
            msg = (
                f"HUGEPAGES DEMOTED: asked for {self.hugepage_bytes} B pages for a {size} B host "
                f"buffer, the kernel gave {buf.backing.page_bytes} B pages "
                f"(HugePages_Free={hugepages_free(self.hugepage_bytes)}); expect slower "
                "transfers and more TLB misses. Reserve hugepages (pod request "
                f"hugepages-{'1Gi' if self.hugepage_bytes == GIB else '2Mi'}) to fix."
            )
            if not self.allow_demotion:
                buf.free()
                raise HugepagesUnavailableError(msg)
            log.warning(msg)
        if self.prefault:
            buf.prefault(self.prefault_threads)
        return buf

    # ------------------------------------------------------------------ mori path
    def _alloc_mori(self, size: int) -> HostBuffer:
        umbp = self._mori
        names = {(False, False): "Anonymous", (False, True): "AnonymousHugetlb",
                 (True, False): "AnonymousShm", (True, True): "AnonymousShmHugetlb"}
        want = names[(self.shared, self.hugepage_bytes > 0)]
        handle = self._mori_alloc.alloc(
            size,
            getattr(umbp.UMBPHostBufferBacking, want),
            self.hugepage_bytes or 2 * MIB,
            self.numa_node,
            False,
        )
        got = handle.actual_backing.name
        ptr, mapped = int(handle.ptr), int(handle.mapped_size)
        page = kernel_page_size(ptr) or BASE_PAGE
        backing = Backing(
            path="mori",
            shared=got.startswith("AnonymousShm"),
            hugepage_bytes_requested=self.hugepage_bytes,
            page_bytes=page,
            numa_node=self.numa_node,
            demoted=self.hugepage_bytes > 0
            and (not got.endswith("Hugetlb") or page < self.hugepage_bytes),
            mori_backing=got,
        )
        if not backing.shared:
            _dont_fork(ptr, mapped)
        mori_alloc = self._mori_alloc
        return HostBuffer(self, ptr, size, mapped, backing, lambda: mori_alloc.free(handle))

    # ------------------------------------------------------------------ mmap path
    def _alloc_mmap(self, size: int) -> HostBuffer:
        hp = self.hugepage_bytes
        ptr, mapped, fd = 0, 0, -1
        if hp:
            mapped = round_up(size, hp)
            ptr, fd = _map(mapped, self.shared, hp)
        demoted = hp > 0 and ptr == 0
        if ptr == 0:
            mapped = round_up(size, BASE_PAGE)
            ptr, fd = _map(mapped, self.shared, 0)
            if ptr == 0:
                err = ctypes.get_errno()
                raise MemoryError(f"mmap of {mapped} B failed: {os.strerror(err)}")
        if self.numa_node >= 0:
            _mbind(ptr, mapped, self.numa_node)
        if not self.shared:
            _dont_fork(ptr, mapped)
        backing = Backing(
            path="mmap",
            shared=self.shared,
            hugepage_bytes_requested=hp,
            page_bytes=BASE_PAGE if demoted or not hp else hp,
            numa_node=self.numa_node,
            demoted=demoted,
        )

        def release(ptr: int = ptr, mapped: int = mapped, fd: int = fd) -> None:
            _libc.munmap(ptr, mapped)
            if fd >= 0:
                os.close(fd)

        return HostBuffer(self, ptr, size, mapped, backing, release)


def _load_mori() -> Any:
    try:
        from mori import umbp  # lazy: the allocator must work without mori
    except ImportError:
        return None
    return umbp


