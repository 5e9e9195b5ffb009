"""Make SGLang 0.5.23's HiCache host pools use our hugepage/NUMA/prefault allocator.

Why a hook: with ``--hicache-storage-backend dynamic`` SGLang builds every host KV pool with
``pool_host.common.get_allocator_from_storage("dynamic")``, which only knows SGLang's built-in
backends and returns the default ``HostTensorAllocator`` (4 KiB anonymous mmap). The allocator
of :mod:`hicache_umbp.hostmem.allocator` would be silently unused.

Mechanism (no file of SGLang is changed): SGLang's own plugin hook registry
(``sglang.srt.plugins.hook_registry.HookRegistry``) wraps ``get_allocator_from_storage`` with an
AROUND hook and propagates the wrapper into every module that imported the function by name
(``pool_host.base``, ``pool_host.mha``, ``memory_pool_host``). The wrapper returns
:class:`~.host_allocator.UMBPHostTensorAllocator` only when the dynamic backend is ours (the
extra-config's ``module_path`` is :data:`hicache_umbp.contract.names.ADAPTER_MODULE`); every other
backend keeps SGLang's choice.
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

The allocator the wrapper returns is :mod:`.host_allocator`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..contract.names import ADAPTER_MODULE
from ..contract.settings import BY_KEY
from ..contract.versions import SGLANG_VERSION
from .host_allocator import UMBPHostTensorAllocator, hugepage_problems, local_rank_from_runtime

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
    if allocator_type and allocator_type != "default":
        # The host pool of an engine with an L3 backend (SGLang's get_allocator_type(): the
        # backend's name, "default" without one): its prefetches hash pages with SGLang's JIT
        # extension; build and load it now, before the engine serves (page_hash).
        from .page_hash import warm_page_hash

        warm_page_hash()
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


def check_pool_allocator(pool: Any) -> None:
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
    "check_pool_allocator",
    "install",
    "installed",
    "plugin",
]
