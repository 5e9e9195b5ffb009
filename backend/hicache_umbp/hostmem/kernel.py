"""The kernel side of host memory: NUMA topology and the container's allowed nodes, what backs
a mapping (``/proc/self/smaps``), the hugepage pool, and the raw calls the allocator makes
(``mmap``/``memfd_create`` with hugepages, ``mbind``, ``madvise``, parallel prefault) through
ctypes, which releases the GIL around each call so prefault threads really run in parallel.

No mori, no torch: :mod:`hicache_umbp.hostmem.allocator` builds buffers from these.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import threading

from ..contract.units import KIB, MIB, round_up

BASE_PAGE = mmap.PAGESIZE

_MAP_SHARED, _MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_HUGETLB = 0x01, 0x02, 0x20, 0x40000
_MAP_HUGE_SHIFT = 26
_MFD_CLOEXEC, _MFD_HUGETLB = 0x0001, 0x0004
_MADV_POPULATE_WRITE = 23
_MADV_DONTFORK = 10
_MPOL_BIND = 2
_SYS_MBIND = 237  # x86_64
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
_libc.memset.restype = ctypes.c_void_p
_libc.syscall.restype = ctypes.c_long


def numa_nodes() -> list[int]:
    """NUMA nodes this host has (``/sys/devices/system/node/node<N>``)."""
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return [0]
    return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()) or [0]


STATUS_PATH = "/proc/self/status"


def _parse_node_list(text: str) -> list[int]:
    """``0-1,4`` -> [0, 1, 4] (the kernel's list format)."""
    nodes: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        nodes.update(range(int(lo), int(hi or lo) + 1))
    return sorted(nodes)


def allowed_numa_nodes() -> list[int]:
    """NUMA nodes this process may allocate on: the kernel's ``Mems_allowed_list`` (the
    container's cpuset ``cpuset.mems``, e.g. set by the kubelet's Memory Manager static policy),
    limited to the nodes that exist; all nodes when unknown."""
    present = numa_nodes()
    try:
        with open(STATUS_PATH) as f:
            for line in f:
                if line.startswith("Mems_allowed_list:"):
                    allowed = _parse_node_list(line.split(":", 1)[1])
                    return [n for n in allowed if n in present] or allowed
    except (OSError, ValueError):
        pass
    return present


def node_cpus(node: int) -> set[int]:
    """CPUs of ``node`` (``cpulist``) that this process may run on; all allowed CPUs if unknown."""
    allowed = os.sched_getaffinity(0)
    try:
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            text = f.read().strip()
    except OSError:
        return set(allowed)
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return (cpus & allowed) or set(allowed)


def mapping_info(ptr: int) -> dict[str, int]:
    """The ``/proc/self/smaps`` fields (in bytes) of the mapping holding ``ptr``; {} if none.

    ``Rss`` counts resident bytes (how much a prefault really touched), ``KernelPageSize`` the
    page size backing the mapping."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):
                    if inside:
                        break
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= ptr < hi
                elif inside and line.rstrip().endswith(" kB"):
                    name, value = line.split(":", 1)
                    fields[name] = int(value.split()[0]) * KIB
    except (OSError, ValueError):
        return {}
    return fields


def kernel_page_size(ptr: int) -> int:
    """``KernelPageSize`` of the mapping holding ``ptr``, 0 if unknown."""
    return mapping_info(ptr).get("KernelPageSize", 0)


def hugepages_free(hugepage_bytes: int) -> int:
    """Free hugepages of that size in the kernel pool (sysfs), 0 if unknown."""
    path = f"/sys/kernel/mm/hugepages/hugepages-{hugepage_bytes // KIB}kB/free_hugepages"
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def _map(length: int, shared: bool, hugepage_bytes: int) -> tuple[int, int]:
    """mmap ``length`` bytes; returns (ptr, memfd) with ptr 0 on failure (errno kept)."""
    huge = 0
    if hugepage_bytes:
        huge = _MAP_HUGETLB | (hugepage_bytes.bit_length() - 1) << _MAP_HUGE_SHIFT
    if not shared:
        p = _libc.mmap(None, length, _PROT_RW, _MAP_PRIVATE | _MAP_ANONYMOUS | huge, -1, 0)
        return (0 if p in (None, _MAP_FAILED) else int(p)), -1
    flags = _MFD_CLOEXEC
    if hugepage_bytes:
        flags |= _MFD_HUGETLB | (hugepage_bytes.bit_length() - 1) << _MAP_HUGE_SHIFT
    try:
        fd = os.memfd_create("hicache-host-pool", flags)
        os.ftruncate(fd, length)
    except OSError:
        return 0, -1
    p = _libc.mmap(None, length, _PROT_RW, _MAP_SHARED, fd, 0)
    if p in (None, _MAP_FAILED):
        os.close(fd)
        return 0, -1
    return int(p), fd


def _dont_fork(ptr: int, length: int) -> None:
    """Keep a *private* buffer out of every fork() (MADV_DONTFORK).

    Why: SGLang registers the host pool with the GPU driver (hipHostRegister /
    cudaHostRegister pin its pages for DMA). After a fork(), a private mapping is write-protected
    for copy-on-write in the parent too, and the parent's next write moves that virtual page to
    a new physical page while the device keeps reading the old, pinned one: stale data. SGLang's
    own mmap allocator (``storage/mmap/mmap_allocator.py``) gives the same reason for its
    MAP_SHARED|MAP_POPULATE pools and MADV_DONTFORK on private ones. Shared (memfd) mappings are
    never copied on write, so they are safe to pin as they are; prefaulting (MADV_POPULATE_WRITE
    below) gives the "pre-faulted pages" half of that rule. SGLang starts its workers with
    spawn, so no child needs the pool.
    """
    if _libc.madvise(ptr, length, _MADV_DONTFORK) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_DONTFORK) of {length} B failed: {os.strerror(err)}")


def _mbind(ptr: int, length: int, node: int) -> None:
    mask = ctypes.c_ulong(1 << node)
    rc = _libc.syscall(
        _SYS_MBIND, ctypes.c_void_p(ptr), ctypes.c_ulong(length), ctypes.c_int(_MPOL_BIND),
        ctypes.byref(mask), ctypes.c_ulong(node + 2), ctypes.c_uint(0),
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mbind to NUMA node {node} failed: {os.strerror(err)}")


def _prefault(ptr: int, length: int, threads: int, node: int) -> int:
    cpus = node_cpus(node) if node >= 0 else os.sched_getaffinity(0)
    workers = max(1, min(threads or len(cpus), length // BASE_PAGE))
    chunk = round_up(-(-length // workers), 2 * MIB)
    spans = [(o, min(chunk, length - o)) for o in range(0, length, chunk)]
    if len(spans) == 1:
        _populate(ptr, length)
        return 1

    errors: list[BaseException] = []

    def work(offset: int, n: int) -> None:
        try:
            if node >= 0:
                os.sched_setaffinity(0, cpus)  # this thread only: pid 0 is the caller
            _populate(ptr + offset, n)
        except BaseException as e:  # re-raised by the caller: a silent hole is a later SIGBUS
            errors.append(e)

    pool = [threading.Thread(target=work, args=span, daemon=True) for span in spans]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return len(pool)


_POPULATE_WORKS = True


def _populate(ptr: int, n: int) -> None:
    """Fault in [ptr, ptr+n) for writing; ctypes drops the GIL around the call."""
    global _POPULATE_WORKS
    if _POPULATE_WORKS:
        if _libc.madvise(ptr, n, _MADV_POPULATE_WRITE) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.EINVAL:
            raise MemoryError(f"prefaulting {n} B failed: {os.strerror(err)}")
        _POPULATE_WORKS = False  # kernel < 5.14: write zeros (fresh memory is zero anyway)
    _libc.memset(ptr, 0, n)
