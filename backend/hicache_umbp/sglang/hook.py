"""Make SGLang 0.5.23's HiCache host pools use our hugepage/NUMA/prefault allocator.

Why a hook: with ``--hicache-storage-backend dynamic`` SGLang builds every host KV pool with
``pool_host.common.get_allocator_from_storage("dynamic")``, which only knows SGLang's built-in
backends and returns the default ``HostTensorAllocator`` (4 KiB anonymous mmap). The allocator
of :mod:`hicache_umbp.hostmem.allocator` would be silently unused.

Mechanism (no file of SGLang is changed): SGLang's own plugin hook registry
(``sglang.srt.plugins.hook_registry.HookRegistry``) wraps ``get_allocator_from_storage`` with an
AROUND hook and propagates the wrapper into every module that imported the function by name
(``pool_host.base``, ``pool_host.mha``, ``memory_pool_host``). The wrapper returns
:class:`UMBPHostTensorAllocator` only when the dynamic backend is ours (the extra-config's
``module_path`` is :mod:`hicache_umbp.sglang.adapter`); every other backend keeps SGLang's choice.
For SGLang's built-in ``mori`` backend it keeps SGLang's allocator but first sets this scheduler's
own NUMA node in the one process-wide variable that allocator reads
(:func:`hicache_umbp.launch.builtin.scheduler_numa_env`).

Every process that builds a host pool must run :func:`install` before it builds one. SGLang
0.5.23 starts schedulers (and the DP controller) with ``multiprocessing`` *spawn*
(``engine.py``: ``mp.set_start_method("spawn", force=True)``); a spawned child re-imports the
parent's main module by name (``__mp_main__``) before it unpickles its target. The process entry
``python -m hicache_umbp.serve`` calls :func:`install` at import time, so every SGLang child
process, at any depth, installs the hook before its scheduler exists: no ``.pth`` file, no
``sitecustomize``. (SGLang's entry-point plugin group ``sglang.srt.plugins``, loaded by every
scheduler, can call :func:`plugin` as a second route; see docs.)

Fail loudly: :func:`install` refuses any SGLang other than
:data:`hicache_umbp.contract.versions.SGLANG_VERSION`, and verifies that every module that must see
the wrapper does; :func:`check_pool_allocator` (called by the adapter on ``register_mem_pool_host``)
raises when the hook is installed but the pool was built by another allocator.

Hugepage demotion (the kernel had no hugepages, the allocator fell back to 4 KiB pages) is
logged as an error-level line and recorded in :func:`host_pool_status`, which is also written
as JSON next to the launcher report (``HICACHE_REPORT_PATH``'s directory,
``host-pool-rank<r>.json``) so the launcher can report it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..contract.load import load_store_config
from ..contract.names import ADAPTER_MODULE
from ..contract.paths import host_pool_status_path
from ..contract.settings import BY_KEY, ConfigError, StoreConfig
from ..contract.units import page_label
from ..contract.versions import SGLANG_VERSION

log = logging.getLogger(__name__)

TARGET = "sglang.srt.mem_cache.pool_host.common.get_allocator_from_storage"
# SGLang's built-in mori backend registers its host pool here (a ledger entry for the reaper).
BUILTIN_REGISTRATION_TARGET = (
    "sglang.srt.mem_cache.storage.umbp.umbp_store.UMBPStore.register_mem_pool_host")
# SGLang checks each host pool against its host-memory budget here (pool_host/base.py).
BUDGET_TARGET = "sglang.srt.mem_cache.pool_host.base.HostKVCache._allocate_host_buffer"
# Modules that bind the function by name at import time; each must see the wrapper.
BINDING_MODULES = (
    "sglang.srt.mem_cache.pool_host.common",
    "sglang.srt.mem_cache.pool_host.base",
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.memory_pool_host",
)
# SGLang's built-in backend's allocator kind (pool_host.common.get_allocator_from_storage).
BUILTIN_ALLOCATOR_TYPE = "mori"

_lock = threading.Lock()
_installed = False
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


# ----------------------------------------------------------------------------- installation


def installed() -> bool:
    return _installed


def install() -> None:
    """Wrap SGLang's host-allocator selection in this process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        import sglang
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        version = getattr(sglang, "__version__", "?")
        if version != SGLANG_VERSION:
            raise RuntimeError(
                f"hicache_umbp's host-allocator hook supports SGLang {SGLANG_VERSION}, found "
                f"{version}: re-verify get_allocator_from_storage and the host pool modules "
                f"({', '.join(BINDING_MODULES)}) before changing hicache_umbp.contract.versions"
            )
        import importlib

        modules = [importlib.import_module(m) for m in BINDING_MODULES]
        HookRegistry.register(TARGET, _around_get_allocator, HookType.AROUND)
        HookRegistry.register(BUDGET_TARGET, _around_allocate_host_buffer, HookType.AROUND)
        from ..clients.reaper import around_builtin_registration

        HookRegistry.register(BUILTIN_REGISTRATION_TARGET, around_builtin_registration,
                              HookType.AROUND)
        HookRegistry.apply_hooks()
        stale = [m.__name__ for m in modules if not _answers_probe(m)]
        from sglang.srt.mem_cache.pool_host.base import HostKVCache

        if getattr(HostKVCache._allocate_host_buffer, "__wrapped__", None) is None:
            stale.append(BUDGET_TARGET)
        if stale:
            raise RuntimeError(
                "SGLang internals changed: get_allocator_from_storage is not wrapped in "
                f"{stale}; the UMBP host allocator would be silently unused"
            )
        _installed = True
        log.info("hicache_umbp: host-allocator hook installed (SGLang %s)", version)


def plugin() -> None:
    """Entry point for SGLang's ``sglang.srt.plugins`` group (loaded in every scheduler)."""
    install()


_PROBE = "__hicache_umbp_probe__"


def _answers_probe(module: Any) -> bool:
    """True when the module's binding of the function runs our wrapper (a real call)."""
    fn = getattr(module, "get_allocator_from_storage", None)
    return callable(fn) and fn(_PROBE) == _PROBE


def _around_get_allocator(original: Callable[[str], Any], allocator_type: str) -> Any:
    if allocator_type == _PROBE:
        return _PROBE
    if allocator_type == BUILTIN_ALLOCATOR_TYPE:
        _set_builtin_rank_env(os.environ)
    if allocator_type == "dynamic":
        extra = _server_extra_config()
        if extra is not None and extra.get("module_path") == ADAPTER_MODULE:
            return UMBPHostTensorAllocator(extra)
    chosen = original(allocator_type)
    # Tagged so check_pool_allocator can tell "SGLang chose another allocator" (fine) from
    # "the pool was built without asking us" (SGLang's internals changed).
    with contextlib.suppress(AttributeError, TypeError):
        chosen._hicache_requested = allocator_type
    return chosen


def _around_allocate_host_buffer(original: Callable[..., Any], pool: Any, *a: Any,
                                 **kw: Any) -> Any:
    """Check a hugepage-backed pool against hugepages, not against host RAM.

    SGLang 0.5.23 refuses a pool larger than ``host_memory_budget_bytes()`` = (min(MemAvailable,
    cgroup memory limit - usage) - 10 GiB) / ranks per host. Hugepages count in neither number:
    on a node with hugepages reserved they are outside MemAvailable, and Kubernetes accounts them
    outside the container's memory limit (hugepages-<size> request). So a pod sized correctly
    for a hugepage pool fails at scheduler start. For the hugepage-backed pools of our allocator
    and of SGLang's built-in one (``--hicache-storage-backend mori``) the budget becomes what
    this rank may really take: the free hugepages of the page size (of its NUMA node when bound)
    within the container's hugetlb cgroup limit. A 4 KiB pool (or a hugepage pool the allocator
    may demote when hugepages are short) keeps SGLang's own check unchanged.
    """
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    allocator = getattr(pool, "allocator", None)
    requested = int(pool.size) * int(pool.size_per_token)
    builtin = _builtin_hugepages(allocator)
    if builtin is not None:
        # SGLang's built-in (mori) allocator: the same budget for its hugepage pools. Short of
        # hugepages, SGLang's own check stays, and so does its demotion to 4 KiB pages (the
        # launcher already refused the start unless host_allow_4k_fallback).
        page, numa = builtin
        problems = hugepage_problems(page, numa, requested, "the built-in host pool")
        if problems:
            log.warning("hicache_umbp: %s; SGLang's host-memory check applies",
                        "; ".join(problems))
            return original(pool, *a, **kw)
        with host_memory_budget_scope(requested):
            return original(pool, *a, **kw)
    if not isinstance(allocator, UMBPHostTensorAllocator) or not allocator.hugepage_bytes:
        return original(pool, *a, **kw)
    problems = allocator.hugepage_problems(requested)
    if not problems:
        with host_memory_budget_scope(requested):
            return original(pool, *a, **kw)
    if allocator.config.host_allow_4k_fallback:
        log.warning("hicache_umbp: %s; host_allow_4k_fallback: SGLang's host-memory check "
                    "applies to the 4 KiB pool", "; ".join(problems))
        return original(pool, *a, **kw)
    from ..hostmem.allocator import HugepagesUnavailableError

    raise HugepagesUnavailableError(
        f"the HiCache host pool of rank {allocator.local_rank} cannot be backed by hugepages: "
        + "; ".join(problems))


def _builtin_hugepages(allocator: Any) -> tuple[int, int] | None:
    """(hugepage bytes, NUMA node) of SGLang's built-in allocator when it maps hugepages."""
    from sglang.srt.mem_cache.storage.umbp.umbp_host_allocator import (
        UMBPHostTensorAllocator as BuiltinAllocator,
    )

    if not isinstance(allocator, BuiltinAllocator):
        return None
    try:  # what its __init__ read from SGLANG_HICACHE_HOST_* (SGLang 0.5.23)
        wanted, page, numa = allocator._use_hugepage, allocator._hugepage_size, allocator._numa_node
    except AttributeError as e:
        raise RuntimeError(f"SGLang's built-in host allocator changed ({e}): re-verify "
                           "umbp_host_allocator.py before trusting the hugepage budget") from e
    return (int(page), int(numa)) if wanted else None


def _set_builtin_rank_env(env: Any) -> None:
    """Give this scheduler its own NUMA node before SGLang's built-in allocator (and mori's
    DRAM tier) read the one process-wide value (hicache_umbp.launch.builtin)."""
    from ..launch.builtin import scheduler_numa_env

    if not any(BY_KEY[k].env in env for k in ("host_numa", "umbp_dram_numa")):
        return  # not started by our launcher: SGLang's own behaviour
    for name, value in scheduler_numa_env(env, local_rank_from_runtime(env)).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


def hugepage_problems(page: int, numa: int, nbytes: int, what: str) -> list[str]:
    """Why ``nbytes`` of ``page``-sized hugepages (on ``numa``, -1: any) would not fit now
    (``[]``: fits): the launcher's own check (hugetlb cgroup headroom, the node's and the NUMA
    node's free pages) on the real node, for this one pool."""
    from ..launch.hugepages import PoolDemand, check_size
    from ..launch.noderoot import NodeRoot

    demand = PoolDemand(what, page, (nbytes,), (numa,))
    return list(check_size(NodeRoot("/"), page, [demand]).problems)


def _server_extra_config() -> dict[str, Any] | None:
    """The published ``--hicache-storage-backend-extra-config`` of this process, parsed the way
    SGLang parses it (inline JSON or ``@file`` JSON/TOML/YAML)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.runtime_context import get_memory

    try:
        raw = get_memory().hicache_storage_backend_extra_config
    except (ValueError, RuntimeError):
        return None  # no server config published in this process (a bare pool, a test)
    if not raw:
        return None
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(raw)
    return dict(extra)


# ----------------------------------------------------------------------------- the allocator


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


def check_pool_allocator(pool: Any, config: StoreConfig) -> None:
    """Called by the adapter once SGLang registers the host pool with it."""
    allocator = getattr(pool, "allocator", None)
    ours = isinstance(allocator, UMBPHostTensorAllocator)
    if _installed and not ours and not hasattr(allocator, "_hicache_requested"):
        raise RuntimeError(
            "the host-allocator hook is installed but SGLang built the host pool with "
            f"{type(allocator).__name__} without calling get_allocator_from_storage: "
            "SGLang's host-pool internals changed"
        )
    if not ours:
        log.warning(
            "hicache_umbp: the host KV pool uses SGLang's default allocator (4 KiB pages, no "
            "NUMA binding); start SGLang with `python -m hicache_umbp.serve` to use hugepages"
        )


__all__ = [
    "ConfigError",
    "HostPoolAllocation",
    "UMBPHostTensorAllocator",
    "any_demoted",
    "check_pool_allocator",
    "host_pool_status",
    "install",
    "installed",
    "plugin",
]
