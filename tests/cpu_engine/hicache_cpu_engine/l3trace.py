"""Measurement harness (test support): where the time of one L3 hit goes in real SGLang 0.5.23.

Active only when ``CPU_ENGINE_L3_TRACE`` names a directory. Wraps, at run time through
SGLang's own plugin hook registry (no file of SGLang is changed), the methods an L3 hit passes
through, and appends one JSON line per call edge to ``<dir>/l3trace-<pid>.jsonl``:

* the scheduler: a request queued (``Scheduler._add_request_to_queue``), its prefetch issued
  (``_prefetch_kvcache``), each admission poll (``UnifiedRadixCache.check_prefetch_progress``:
  False while the prefetch holds the request back), the fetched pages inserted
  (``_handle_prefetch_result``), each forward pass (``run_batch``) and its result;
* the cache controller's threads: the hit query (``_storage_hit_query`` -> the backend's
  ``batch_exists``) and its rank sync, the host bounce allocated for the hit
  (``allocate_storage_hit``), the transfer thread's pages (``HiCacheController._page_transfer``
  -> ``batch_get_v1``), the progress acks reduced by the sync thread, the L2 -> L1 load;
* our backend's ``batch_exists`` / ``batch_get_v1`` (``hicache_umbp.sglang.adapter``).

Timestamps are ``time.monotonic()`` (one clock for every process of the machine) so bench/l3_hit.py
can put them on one time line per request id. Costs one ``write`` per edge: fine for a measurement,
never meant for serving (the engine image does not ship this package).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

ENV = "CPU_ENGINE_L3_TRACE"

CC = "sglang.srt.managers.cache_controller.HiCacheController"
HCC = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller.HybridCacheController"
URC = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
SCHED = "sglang.srt.managers.scheduler.Scheduler"
ADAPTER = "hicache_umbp.sglang.adapter.UMBPHiCacheStorage"
L2T = "sglang.srt.mem_cache.l2_transfer.L2TransferEngine"
HOST = "sglang.srt.mem_cache.pool_host.base.HostKVCache"

_lock = threading.Lock()
_out: Any = None


def _emit(ev: str, **fields: Any) -> None:
    global _out
    rec = {"ev": ev, "t": time.monotonic(), "pid": os.getpid(),
           "thread": threading.current_thread().name, **fields}
    line = json.dumps(rec, default=str) + "\n"
    with _lock:
        if _out is None:
            os.makedirs(os.environ[ENV], exist_ok=True)
            path = os.path.join(os.environ[ENV], f"l3trace-{os.getpid()}.jsonl")
            _out = open(path, "a", buffering=1)  # noqa: SIM115  # one file for the process
        _out.write(line)


def _rid(obj: Any) -> Any:
    for attr in ("request_id", "rid"):
        if hasattr(obj, attr):
            return getattr(obj, attr)
    handle = getattr(obj, "handle", None) or getattr(obj, "cache_request_handle", None)
    return getattr(handle, "rid", None)


def _span(name: str, rid_of: Callable[..., Any], result: Callable[[Any], dict[str, Any]]
          | None = None) -> Callable[..., Any]:
    """An AROUND hook: ``<name>.start`` and ``<name>.end`` (with ``result(ret)`` fields)."""

    def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        rid = rid_of(*args, **kwargs)
        _emit(f"{name}.start", rid=rid)
        ret = original(*args, **kwargs)
        _emit(f"{name}.end", rid=rid, **(result(ret) if result else {}))
        return ret

    return hook


def _batch_rids(_self: Any, batch: Any, *a: Any, **k: Any) -> Any:
    return [r.rid for r in getattr(batch, "reqs", [])]


def _poll(original: Callable[..., Any], self: Any, request: Any, *a: Any, **k: Any) -> Any:
    done = original(self, request, *a, **k)
    _emit("poll", rid=getattr(request, "rid", None), done=bool(done))
    return done


def _run_batch(original: Callable[..., Any], self: Any, batch: Any, *a: Any, **k: Any) -> Any:
    rids = [r.rid for r in getattr(batch, "reqs", [])]
    mode = str(getattr(batch, "forward_mode", ""))
    tokens = getattr(batch, "extend_num_tokens", None)
    _emit("forward.start", rids=rids, mode=mode, extend_tokens=tokens)
    ret = original(self, batch, *a, **k)
    _emit("forward.end", rids=rids, mode=mode)
    return ret


def _ack(original: Callable[..., Any], self: Any, ack: Any, *a: Any, **k: Any) -> Any:
    ret = original(self, ack, *a, **k)
    _emit("ack", rid=ack.rid, completed_tokens=ack.completed_tokens,
          completed_req=bool(ack.completed_req))
    return ret


def _hits(ret: Any) -> dict[str, Any]:
    return {"hit_tokens": ret[1]} if isinstance(ret, tuple) and len(ret) == 2 else {}


def _pages(original: Callable[..., Any], self: Any, keys: Any, *a: Any, **k: Any) -> Any:
    name = original.__name__
    _emit(f"{name}.start", pages=len(keys))
    ret = original(self, keys, *a, **k)
    found = ret if isinstance(ret, int) else sum(bool(x) for x in ret)
    _emit(f"{name}.end", pages=len(keys), found=found)
    return ret


def targets() -> dict[str, Callable[..., Any]]:
    first = lambda _self, x, *a, **k: _rid(x)  # noqa: E731
    req = lambda _self, req, *a, **k: getattr(req, "rid", None)  # noqa: E731
    return {
        f"{SCHED}._add_request_to_queue": _span("queued", req),
        f"{SCHED}._prefetch_kvcache": _span("prefetch_issue", req),
        f"{SCHED}.run_batch": _run_batch,
        f"{SCHED}.process_batch_result": _span("batch_result", _batch_rids),  # rid: a list
        f"{HCC}.prefetch": _span("submit", lambda _s, handle, *a, **k: getattr(handle, "rid",
                                                                                handle)),
        f"{HCC}._storage_hit_query": _span("hit_query", first, _hits),
        f"{HCC}._sync_prefetch_hit_query": _span("hit_sync", first),
        f"{HCC}.allocate_storage_hit": _span("host_alloc", first),
        f"{CC}._page_transfer": _span("transfer", first),
        f"{HCC}._reduce_prefetch_ack": _ack,
        f"{HCC}.load": _span("load_l2_l1", lambda *a, **k: None),
        f"{CC}.start_loading": _span("start_loading", lambda *a, **k: None),
        # inside start_loading: index preparation, then the per-layer host -> device copies
        f"{L2T}._prepare_transfers": _span("prepare_transfers", lambda *a, **k: None),
        f"{HOST}.load_to_device_per_layer_physical": _span("h2d_copy", lambda *a, **k: None),
        f"{URC}.check_prefetch_progress": _poll,
        f"{URC}._handle_prefetch_result": _span("insert_host", first),
        f"{ADAPTER}.batch_exists": _pages,
        f"{ADAPTER}.batch_get_v1": _pages,
    }


def register(registry: Any, around: Any) -> None:
    """Register every wrapper (before SGLang's ``apply_hooks``) when the variable is set."""
    if not os.environ.get(ENV):
        return
    for target, hook in targets().items():
        registry.register(target, hook, around)
