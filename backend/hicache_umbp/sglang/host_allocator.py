"""The host KV pool allocator SGLang gets from our hook: hugepages, NUMA binding and prefault
(:class:`~hicache_umbp.hostmem.allocator.HostAllocator`) behind SGLang's ``HostTensorAllocator``
interface, and a record of how every pool buffer is really backed.

Hugepage demotion (the kernel had no hugepages, the allocator fell back to 4 KiB pages) is
logged as an error-level line and recorded in :func:`host_pool_status`, which is also written
as JSON next to the launcher report (``HICACHE_REPORT_PATH``'s directory,
``host-pool-rank<r>.json``, :func:`hicache_umbp.contract.paths.host_pool_status_path`) so the
launcher can report it. Which rank a scheduler is comes from SGLang's published parallel
context (:func:`local_rank_from_runtime`, the index :mod:`.ranks` defines).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..contract.load import load_store_config
from ..contract.paths import host_pool_status_path
from ..contract.settings import BY_KEY, StoreConfig
from ..contract.units import page_label

log = logging.getLogger(__name__)

_lock = threading.Lock()
_status: list[HostPoolAllocation] = []


@dataclass(frozen=True)
class HostPoolAllocation:
    """One host pool buffer our allocator made, as the kernel backs it."""

    local_rank: int
    ptr: int
    nbytes: int
    backing: str  # what the allocator got: path[/shm]/page size, e.g. "mmap/2MiB", "mori/4KiB"
    page_bytes: int  # kernel page size really backing the buffer
    hugepage_bytes_requested: int
    demoted: bool  # hugepages were asked for and 4 KiB pages were used
    numa_node: int
    prefaulted: bool
    alloc_s: float = 0.0  # allocation + prefault, seconds (the pool's share of time to Ready)
    page_hash_s: float = 0.0  # building/loading SGLang's page-hash extension first (page_hash)


def hugepage_problems(page: int, numa: int, nbytes: int, what: str) -> list[str]:
    """Why ``nbytes`` of ``page``-sized hugepages (on ``numa``, -1: any) would not fit now
    (``[]``: fits): the launcher's own check (hugetlb cgroup headroom, the node's and the NUMA
    node's free pages) on the real node, for this one pool."""
    from ..launch.hugepages import PoolDemand, check_size
    from ..launch.noderoot import NodeRoot

    demand = PoolDemand(what, page, (nbytes,), (numa,))
    return list(check_size(NodeRoot("/"), page, [demand]).problems)


def local_rank_from_runtime(env: Mapping[str, str]) -> int:
    """This scheduler's per-rank index, from SGLang's published parallel context."""
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    from .ranks import RankPosition, parse_dp_rank_env

    par = get_parallel()
    if is_dp_attention_enabled():
        tp_rank, tp_size, dp_rank = par.attn_tp_rank, par.attn_tp_size, par.attn_dp_rank
    else:
        tp_rank, tp_size, dp_rank = par.tp_rank, par.tp_size, 0
    dp_env = parse_dp_rank_env(env)
    pos = RankPosition(
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank if dp_env is None else dp_env,
        pp_rank=par.pp_rank,
        pp_size=par.pp_size,
    )
    return pos.local_rank


class UMBPHostTensorAllocator:
    """SGLang ``HostTensorAllocator`` interface over :mod:`hicache_umbp.hostmem.allocator`.

    Not a subclass of SGLang's class on purpose: SGLang's ROCm path
    (``_uses_hip_owned_host_memory``) replaces only the exact default allocator type with
    hipHostMalloc; storage allocators keep their own backing, as ours must.
    """

    def __init__(self, extra: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        self.env = os.environ if env is None else env
        self.config: StoreConfig = load_store_config(extra, self.env)
        self.local_rank = local_rank_from_runtime(self.env)
        self.rank_config = self.config.rank(self.local_rank)
        self.dtype: torch.dtype | None = None
        self.dims: tuple[int, ...] | None = None
        self.buffers: list[Any] = []  # keep every region alive as long as the allocator
        self.allocations: list[HostPoolAllocation] = []
        self._hicache_requested = "dynamic"

    @property
    def hugepage_bytes(self) -> int:
        """Page size the host pool asks for (0: 4 KiB pages)."""
        return int(self.config.host_hugepage_bytes)

    def hugepage_problems(self, nbytes: int) -> list[str]:
        """Why ``nbytes`` of this rank's host pool would not fit in hugepages (``[]``: fits).

        The launcher's own check (:func:`hicache_umbp.launch.hugepages.check_size`) on the real
        node, for this one pool: hugetlb cgroup headroom, the node's and the NUMA node's free
        pages of the size, read when the pool is about to be allocated.
        """
        return hugepage_problems(self.hugepage_bytes, self.rank_config.host_numa, nbytes,
                                 f"host pool of rank {self.local_rank}")

    def allocate(self, dims: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
        if device != "cpu":
            raise ValueError(f"the UMBP host allocator makes CPU memory; got device={device!r}")
        self.dims, self.dtype = tuple(dims), dtype
        nbytes = math.prod(dims) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(dims, dtype=dtype)
        region, record = allocate_region(nbytes, self.config, self.local_rank)
        self.buffers.append(region)
        self.allocations.append(record)
        flat = torch.frombuffer(region_view(region), dtype=torch.uint8, count=nbytes)
        return flat.view(dtype).reshape(dims)


def allocate_region(
    nbytes: int, config: StoreConfig, local_rank: int
) -> tuple[Any, HostPoolAllocation]:
    """Allocate one host pool buffer with the core allocator, log and record its backing.

    Standalone mode needs memfd-backed memory (the sidecar server maps the pool). Without
    ``host_allow_4k_fallback`` a node without free hugepages fails the start here, with the
    core allocator's message (:class:`hicache_umbp.hostmem.allocator.HugepagesUnavailableError`).
    """
    from ..hostmem.allocator import HostAllocator
    from .page_hash import ready_seconds

    rank = config.rank(local_rank)
    allocator = HostAllocator(
        hugepage_bytes=config.host_hugepage_bytes,
        numa_node=rank.host_numa,
        prefault=config.host_prefault,
        prefault_threads=config.host_prefault_threads,
        shared=config.umbp_mode == "standalone",
        allow_demotion=config.host_allow_4k_fallback,
    )
    t0 = time.monotonic()
    region = allocator.alloc(nbytes)
    alloc_s = time.monotonic() - t0
    b = region.backing
    record = HostPoolAllocation(
        local_rank=local_rank,
        ptr=int(region.ptr),
        nbytes=nbytes,
        backing=f"{b.path}{'/shm' if b.shared else ''}/{page_label(b.page_bytes)}",
        page_bytes=int(b.page_bytes),
        hugepage_bytes_requested=config.host_hugepage_bytes,
        demoted=bool(b.demoted),
        numa_node=rank.host_numa,
        prefaulted=config.host_prefault,
        alloc_s=round(alloc_s, 4),
        page_hash_s=round(ready_seconds() or 0.0, 4),
    )
    if record.demoted:
        log.error(
            "hicache_umbp: HUGEPAGES DEMOTED for the host KV pool of rank %d (%d bytes): asked "
            "for %d-byte pages, got %d-byte pages (host_allow_4k_fallback allowed the start)",
            local_rank, nbytes, config.host_hugepage_bytes, record.page_bytes,
        )
    else:
        log.info(
            "hicache_umbp: host KV pool of rank %d: %d bytes, %s, numa %d, prefault %s, %.3f s",
            local_rank, nbytes, record.backing, record.numa_node, record.prefaulted,
            record.alloc_s,
        )
    with _lock:
        _status.append(record)
    _write_status(record)
    return region, record


def region_view(region: Any) -> Any:
    """A writable buffer-protocol view of a core allocator region (it keeps the region alive,
    and the region keeps its allocator alive)."""
    return region.view()


def host_pool_status() -> list[HostPoolAllocation]:
    """Every host pool buffer our allocator made in this process."""
    with _lock:
        return list(_status)


def any_demoted() -> bool:
    return any(a.demoted for a in host_pool_status())


def _write_status(record: HostPoolAllocation) -> None:
    report = os.environ.get(BY_KEY["report_path"].env)
    if not report:
        return
    path = host_pool_status_path(report, record.local_rank)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(asdict(record), f)
    except OSError as e:
        log.warning("hicache_umbp: could not write %s: %s", path, e)


__all__ = [
    "HostPoolAllocation",
    "UMBPHostTensorAllocator",
    "allocate_region",
    "any_demoted",
    "host_pool_status",
    "hugepage_problems",
    "local_rank_from_runtime",
]
