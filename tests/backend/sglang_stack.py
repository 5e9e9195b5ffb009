"""The HiCache stack SGLang 0.5.23's scheduler builds, on CPU, for the ``sglang`` tier and the
engine benchmarks (imported only by test_*_sglang.py and bench/).

How the scheduler builds it (read from the installed SGLang): ``UnifiedRadixCache.init_hicache``
parses ``--hicache-storage-backend-extra-config`` with
``HybridCacheController.parse_storage_backend_extra_config`` and calls
``attach_hybrid_pool_to_unified_cache``, which selects a stack strategy for the device KV pool
(``_PlainKvStrategy`` for a plain MHA or MLA pool) and runs its ``build``:
``build_kv_only_stack`` -> ``build_kv_host_pool`` (host pool sized by ``--hicache-size`` in GB,
layout from ``--hicache-mem-layout``, allocator from ``get_allocator_from_storage``) wrapped in a
``HostPoolGroup``, then ``HybridCacheController`` (storage backend attached at construction:
``StorageBackendFactory``, ``register_mem_pool_host``, then ``register_mem_host_pool_v2`` for
every pool of the group, layout leases around every backup and prefetch transfer).
:func:`scheduler_stack` makes exactly those calls with the published server args; only
``_apply_stack_result`` (wiring the result into a radix tree we do not have) is left out.

The scheduler's part between the controller's threads (``UnifiedRadixCache``: submitting the
prefetch, allocating host pages for the hit with ``allocate_storage_hit``, handing the operation
to the prefetch-io thread, draining the ack queues) is played by :func:`prefetch` and
:func:`backup`, with the same calls and the same threshold rule.
"""

from __future__ import annotations

import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import sglang_env as E

QUEUE_TIMEOUT_S = 120.0


@dataclass
class Stack:
    """One scheduler's HiCache stack: the controller, its host pool group and KV host pool."""

    ctrl: Any  # HybridCacheController
    group: Any  # HostPoolGroup
    host: Any  # the KV host pool (MHATokenToKVPoolHost / MLATokenToKVPoolHost)
    device: Any
    server_args: Any

    @property
    def backend(self) -> Any:
        return self.ctrl.storage_backend

    def close(self) -> None:
        if self.ctrl.enable_storage:
            self.ctrl.detach_storage_backend()


def scheduler_stack(
    model_dir: Path,
    kind: str,
    extra: dict[str, Any] | None,
    *,
    backend: str | None = "dynamic",
    layout: str = "page_first",
    hicache_size_gb: int = E.HICACHE_SIZE_GB,
    page: int = E.PAGE,
    device_tokens: int = E.DEVICE_TOKENS,
    device_pool: Any | None = None,
    attach: bool = True,
) -> Stack:
    """Publish the server args, then build the KV stack as ``attach_hybrid_pool_to_unified_cache``
    does for a plain ``kind`` ("mha" / "mla") device pool. ``attach=False`` builds it without a
    storage backend (the host pool still comes from the allocator the published backend
    selects); attach one later with the controller's ``attach_storage_backend``, as SGLang's
    runtime attach does."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
        HybridCacheController,
    )
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _select_strategy
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.runtime_context import get_memory, get_serving

    args = E.publish_scheduler(model_dir, extra, backend, layout=layout,
                               hicache_size_gb=hicache_size_gb, page=page)
    if device_pool is None:
        make = E.mla_device_pool if kind == "mla" else E.mha_device_pool
        device_pool = make(page=page, size=device_tokens)
    allocator = PagedTokenToKVPoolAllocator(
        device_pool.size, page, device_pool.dtype, "cpu", device_pool, need_sort=False
    )
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=allocator, page_size=page)
    storage_extra, threshold = None, 256
    if backend is not None and attach:
        storage_extra, threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(
            get_memory().hicache_storage_backend_extra_config
        )
    strategy = _select_strategy(device_pool, {ComponentType.FULL})
    result = strategy.build(
        cache=None, kvcache=device_pool, params=params, server_args=args,
        load_cache_event=threading.Event(), storage_backend=backend if attach else None,
        storage_backend_extra_config=storage_extra, prefetch_threshold=threshold,
        model_name=get_serving().served_model_name, enable_storage_metrics=False,
    )
    ctrl = result.cache_controller
    assert type(ctrl) is HybridCacheController
    group = result.host_pool_group
    return Stack(ctrl, group, group.get_pool(PoolName.KV), device_pool, args)


def threads_alive(ctrl: Any) -> bool:
    return all(
        t.is_alive()
        for t in (ctrl.prefetch_thread, ctrl.prefetch_io_aux_thread,
                  ctrl.prefetch_sync_thread, ctrl.backup_thread)
    )


def wait_for(queue: Any, timeout_s: float = QUEUE_TIMEOUT_S) -> Any:
    """Next item of a controller queue (a hang fails the test instead of blocking it)."""
    return queue.get(block=True, timeout=timeout_s)


def radix_key(tokens: list[int], page: int) -> Any:
    """The page-aligned key the scheduler hands to ``submit_prefetch``."""
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", tokens)).page_aligned(page)


def page_hashes(tokens: list[int], page: int, last_hash: str | None = None) -> list[str]:
    """The hash chain the radix tree gives a node's pages (``compute_node_hash_values``;
    ``last_hash``: the parent node's last page hash)."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    hashes = get_storage_hash_str(radix_key(tokens, page), last_hash, page_size=page)
    assert isinstance(hashes, list)
    return hashes


def backup(ctrl: Any, host_indices: torch.Tensor, tokens: list[int],
           hashes: list[str] | None = None) -> int:
    """``write_backup_storage``'s call, then the ack the scheduler drains; tokens backed up."""
    page = ctrl.page_size
    hashes = page_hashes(tokens, page) if hashes is None else hashes
    op_id = ctrl.write_storage(host_indices, tokens, hashes)
    op = wait_for(ctrl.ack_backup_queue)
    assert op.id == op_id
    return int(op.completed_tokens)


@dataclass
class Prefetched:
    tokens: int  # tokens the io thread completed (0 on a miss or a declined hit)
    host_indices: torch.Tensor | None
    hit_tokens: int  # the hit query's (rank-reduced) answer
    operation: Any


def prefetch(ctrl: Any, rid: str, tokens: list[int], last_hash: str | None = None) -> Prefetched:
    """A storage prefetch as ``UnifiedRadixCache`` drives it: ``submit_prefetch``, the hit
    query's answer from ``prefetch_hit_queue``, hits below ``prefetch_threshold`` declined,
    ``allocate_storage_hit`` (partial allowed), the operation handed to the io thread, acks
    drained until ``completed_req``. ``last_hash``: the hash of the page before ``tokens`` (a
    prefetch that continues a matched prefix)."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

    page = ctrl.page_size
    submission = ctrl.submit_prefetch(CacheRequestHandle(rid, 0), radix_key(tokens, page),
                                      last_hash, None, [], None)
    op = submission.operation
    assert op is not None
    hit = wait_for(ctrl.prefetch_hit_queue)
    assert hit is op
    hit_tokens = int(op.storage_hit_count)
    if hit_tokens == 0 or hit_tokens < ctrl.prefetch_threshold:
        op.mark_terminate()  # revoke_pending_prefetch
        return Prefetched(0, None, hit_tokens, op)
    indices, alloc_len = ctrl.allocate_storage_hit(
        op, hit_tokens, allow_partial=True, min_tokens=ctrl.prefetch_threshold,
        evict_host=lambda n: 0,
    )
    assert indices is not None, "host pool full"
    op.storage_hit_count = alloc_len
    op.hash_value = op.hash_value[: alloc_len // page]
    op.host_indices = indices
    ctrl.prefetch_buffer.put(op)
    completed = 0
    deadline = time.monotonic() + QUEUE_TIMEOUT_S
    while time.monotonic() < deadline:
        ack = wait_for(ctrl.ack_prefetch_queue)
        assert ack.operation is op
        if ack.completed_tokens is not None:
            completed = int(ack.completed_tokens)
        if ack.completed_req:
            return Prefetched(completed, indices, hit_tokens, op)
    raise AssertionError("prefetch did not complete")
