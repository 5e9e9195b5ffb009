"""UMBP backend inside real SGLang 0.5.23 on CPU: adapter overhead and controller-path GB/s.

1. Adapter overhead against a real SGLang host pool (MHA page_first, bf16, 64-token pages):
   keys (KeyScheme) + pointers (the adapter's page pointers) per page at 128-page batches, as
   SGLang's prefetch/backup threads call it; also the whole stack (adapter + store) over a
   client that returns at once, and SGLang's own ``get_page_buffer_meta`` for comparison.
2. End-to-end through SGLang's real HiCacheController (backup thread, hit query, prefetch-io
   thread) on the same host pool and the same pages: our backend (interface_v1, UMBP client =
   a memory store below it, since mori is not installable in this 3.11 venv) against SGLang's
   built-in ``file`` backend (HiCacheFile under a temp dir). The store below our backend is
   measured two ways: :class:`ArenaClient` (pre-allocated prefaulted arena, like mori's
   embedded DRAM tier; the headline ratios) and the test double (a fresh ``bytes`` per put).

Run: ``make bench-sglang`` (``.cache/venvs/sglang/bin/python bench/sglang_backend.py``).
Last line: one JSON object with ``adapter_us_per_page``, ``vs_hicachefile_set``,
``vs_hicachefile_get`` and the raw numbers.
"""

from __future__ import annotations

import gc
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hicache_umbp.sglang_adapter import (  # noqa: E402
    UMBPHiCacheStorage,
    dynamic_extra_config,
    use_client_opener,
)
from support.memory_client import MemoryUMBPClient  # noqa: E402

from backend import sglang_env as E  # noqa: E402

PAGE = 64
BATCH = 128
LAYERS = 4
HEADS = 8
HEAD_DIM = 128
E2E_PAGES = 128  # 2 parts x 512 KiB per page: 128 MiB per direction
ROUNDS = 3  # best of 3 per backend
MIB = 1 << 20


class NullClient:
    """Returns success at once: isolates the cost of our stack above the client."""

    def batch_put_from_ptr(self, keys: Any, ptrs: Any, sizes: Any) -> list[bool]:
        return [True] * len(keys)

    batch_get_into_ptr = batch_put_from_ptr

    def batch_exists(self, keys: Any) -> list[bool]:
        return [True] * len(keys)

    def batch_exists_consecutive(self, keys: Any) -> int:
        return len(keys)

    def register_memory(self, ptr: int, size: int) -> bool:
        return True

    def deregister_memory(self, ptr: int) -> None:
        return None

    def flush(self) -> bool:
        return True


class ArenaClient:
    """A DRAM store laid out like mori's embedded DRAM tier: one pre-allocated, prefaulted
    arena, values placed by a bump allocator, copies in and out with memmove.

    Used beside the test double because the double allocates a fresh Python ``bytes`` per put
    (an mmap, page faults and zeroing for every 512 KiB value), which measures the double, not
    the backend; mori's DRAM tier (13-18 GB/s batched put measured, DESIGN.md section 7)
    writes into memory it allocated and prefaulted at start.
    """

    def __init__(self, capacity: int) -> None:
        import ctypes

        self._ctypes = ctypes
        self._arena = (ctypes.c_uint8 * capacity)()
        ctypes.memset(self._arena, 1, capacity)  # prefault, like mori's DRAM pool
        self._base = ctypes.addressof(self._arena)
        self._capacity = capacity
        self._used = 0
        self._index: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def batch_put_from_ptr(self, keys: Any, ptrs: Any, sizes: Any) -> list[bool]:
        out = []
        with self._lock:
            for key, ptr, size in zip(keys, ptrs, sizes, strict=True):
                if key in self._index:
                    out.append(True)
                    continue
                if self._used + size > self._capacity:
                    out.append(False)
                    continue
                self._ctypes.memmove(self._base + self._used, ptr, size)
                self._index[key] = (self._used, size)
                self._used += size
                out.append(True)
        return out

    def batch_get_into_ptr(self, keys: Any, ptrs: Any, sizes: Any) -> list[bool]:
        out = []
        for key, ptr, size in zip(keys, ptrs, sizes, strict=True):
            hit = self._index.get(key)
            if hit is None or hit[1] != size:
                out.append(False)
                continue
            self._ctypes.memmove(ptr, self._base + hit[0], size)
            out.append(True)
        return out

    def batch_exists(self, keys: Any) -> list[bool]:
        return [k in self._index for k in keys]

    def batch_exists_consecutive(self, keys: Any) -> int:
        n = 0
        for k in keys:
            if k not in self._index:
                break
            n += 1
        return n

    def register_memory(self, ptr: int, size: int) -> bool:
        return True

    def deregister_memory(self, ptr: int) -> None:
        return None

    def flush(self) -> bool:
        return True


def pools(device_tokens: int) -> tuple[Any, Any]:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dev = MHATokenToKVPool(
        size=device_tokens, page_size=PAGE, dtype=torch.bfloat16, head_num=HEADS,
        head_dim=HEAD_DIM, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )
    info = dev.get_device_pool_infos()[0].buffer_info
    host = MHATokenToKVPoolHost(
        info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout="page_first",
        pin_memory=False, device="cpu", device_capacity_tokens=device_tokens, start_layer=0,
        end_layer=LAYERS - 1,
    )
    return dev, host


def storage_config(extra: dict[str, Any]) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench-model", extra_config=dict(extra),
    )


def best_us_per_page(fn: Any, repeats: int = 7, inner: int = 20) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t) / inner)
    return best / BATCH * 1e6


def adapter_overhead(host: Any, extra: dict[str, Any]) -> dict[str, float]:
    with use_client_opener(lambda rank_config: NullClient()):
        backend = UMBPHiCacheStorage(storage_config(extra), {})
    backend.register_mem_pool_host(host)
    rng = random.Random(0)
    page_starts = rng.sample(range(host.size // PAGE), BATCH)
    idx = torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in page_starts])
    hashes = [f"{rng.getrandbits(256):064x}" for _ in range(BATCH)]
    keys = backend.stores[0].keys

    def keys_and_pointers() -> None:
        keys.batch_keys(hashes)
        backend.page_pointers(idx, BATCH)

    return {
        "adapter_us_per_page": best_us_per_page(keys_and_pointers),
        "stack_set_us_per_page": best_us_per_page(lambda: backend.batch_set_v1(hashes, idx)),
        "stack_get_us_per_page": best_us_per_page(lambda: backend.batch_get_v1(hashes, idx)),
        "sglang_page_meta_us_per_page": best_us_per_page(
            lambda: host.get_page_buffer_meta(idx), repeats=3, inner=5
        ),
        "pointer_plan": backend._plan is not None,
    }


def controller_round(dev: Any, host: Any, backend: str, extra: dict[str, Any],
                     client: Any | None, seed: int) -> dict[str, float]:
    """Back up E2E_PAGES pages through the controller, wipe, prefetch them back; GB/s each way."""
    import contextlib

    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    allocator = PagedTokenToKVPoolAllocator(dev.size, PAGE, torch.bfloat16, "cpu", dev,
                                            need_sort=False)
    opener = use_client_opener(lambda rank_config: client) if client else contextlib.nullcontext()
    with opener:
        ctrl = HiCacheController(
            token_to_kv_pool_allocator=allocator, mem_pool_host=host, page_size=PAGE,
            tp_group=None, load_cache_event=threading.Event(), write_policy="write_back",
            io_backend="direct", storage_backend=backend, model_name="bench-model",
            storage_backend_extra_config=dict(extra),
        )
    try:
        rng = random.Random(seed)  # new pages every round: HiCacheFile skips known keys
        tokens = [rng.randrange(32000) for _ in range(E2E_PAGES * PAGE)]
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
        idx = host.alloc(len(tokens))
        E.fill_random(host, seed=3)
        want = E.page_bytes(host, idx)
        nbytes = E2E_PAGES * host.get_size_per_token() * PAGE
        gc.collect()
        t = time.perf_counter()
        op_id = ctrl.write_storage(idx, tokens, hash_value=hashes)
        op = E.wait_for(ctrl.ack_backup_queue, 600)
        set_s = time.perf_counter() - t
        assert op.id == op_id and op.completed_tokens == len(tokens), "backup incomplete"
        host.free(idx)
        E.wipe(host)
        t = time.perf_counter()
        fetched, new_idx, _ = prefetch_timed(ctrl, tokens)
        get_s = time.perf_counter() - t
        assert fetched == len(tokens), f"prefetch got {fetched} of {len(tokens)} tokens"
        assert E.page_bytes(host, new_idx) == want, "prefetched bytes differ"
        host.free(new_idx)
        return {"set_gbps": nbytes / set_s / 1e9, "get_gbps": nbytes / get_s / 1e9,
                "bytes": nbytes}
    finally:
        ctrl.detach_storage_backend()


def memcpy_gbps(nbytes: int) -> float:
    """Best of 5 single-threaded memmoves of ``nbytes`` between prefaulted buffers: the ceiling
    for any one-copy store on this machine."""
    import ctypes

    src = (ctypes.c_uint8 * nbytes)()
    dst = (ctypes.c_uint8 * nbytes)()
    ctypes.memset(src, 1, nbytes)
    ctypes.memset(dst, 2, nbytes)
    best_s = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        ctypes.memmove(dst, src, nbytes)
        best_s = min(best_s, time.perf_counter() - t)
    return nbytes / best_s / 1e9


def best(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: max(r[k] for r in rounds) for k in rounds[0]}


def prefetch_timed(ctrl: Any, tokens: list[int]) -> tuple[int, Any, Any]:
    return E.prefetch(ctrl, f"bench-{time.monotonic_ns()}", tokens)


def main() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="hicache-bench-"))
    try:
        model = E.tiny_model_dir(workdir)
        extra = dynamic_extra_config(umbp_dram_bytes=1 << 30, umbp_namespace="bench",
                                     host_hugepage_bytes=0)
        E.publish_scheduler(model, extra)
        dev, host = pools(device_tokens=E2E_PAGES * PAGE * 2)
        page_mib = host.get_size_per_token() * PAGE / MIB
        print(f"host pool: {host.size // PAGE} pages of {PAGE} tokens, {page_mib:.2f} MiB/page "
              f"(MHA page_first, {LAYERS} layers x {HEADS} heads x {HEAD_DIM}, bf16)")

        over = adapter_overhead(host, extra)
        print(f"adapter keys+pointers: {over['adapter_us_per_page']:.3f} us/page "
              f"(128-page batches; target <= 2); SGLang get_page_buffer_meta alone: "
              f"{over['sglang_page_meta_us_per_page']:.3f} us/page")
        print(f"adapter+store over a null client: set {over['stack_set_us_per_page']:.3f} "
              f"us/page, get {over['stack_get_us_per_page']:.3f} us/page")

        capacity = ROUNDS * E2E_PAGES * 2 * MIB
        double = MemoryUMBPClient(capacity)
        arena = ArenaClient(capacity)
        file_extra = {"file_storage_path": str(workdir / "hicache-file")}
        runs: dict[str, list[dict[str, float]]] = {"arena": [], "double": [], "file": []}
        for r in range(ROUNDS):  # interleaved, so all three see the same machine noise
            runs["arena"].append(controller_round(dev, host, "dynamic", extra, arena, r))
            runs["double"].append(controller_round(dev, host, "dynamic", extra, double, r))
            runs["file"].append(controller_round(dev, host, "file", file_extra, None, 100 + r))
        ours, dbl, theirs = best(runs["arena"]), best(runs["double"]), best(runs["file"])
        set_ratio = ours["set_gbps"] / theirs["set_gbps"]
        get_ratio = ours["get_gbps"] / theirs["get_gbps"]
        for name, res in (("umbp/arena", ours), ("umbp/double", dbl), ("HiCacheFile", theirs)):
            print(f"controller {name:12s} backup {res['set_gbps']:6.2f} GB/s  "
                  f"prefetch {res['get_gbps']:6.2f} GB/s")
        copy = memcpy_gbps(E2E_PAGES * 2 * 512 * 1024)
        print(f"one memmove of the same bytes: {copy:.2f} GB/s (the one-copy ceiling here)")
        print(f"umbp (arena client) vs HiCacheFile: backup {set_ratio:.1f}x, prefetch "
              f"{get_ratio:.1f}x (target >= 3x); with the test double: backup "
              f"{dbl['set_gbps'] / theirs['set_gbps']:.1f}x, prefetch "
              f"{dbl['get_gbps'] / theirs['get_gbps']:.1f}x")
        result = {
            "adapter_us_per_page": round(over["adapter_us_per_page"], 4),
            "vs_hicachefile_set": round(set_ratio, 2),
            "vs_hicachefile_get": round(get_ratio, 2),
            "stack_set_us_per_page": round(over["stack_set_us_per_page"], 4),
            "stack_get_us_per_page": round(over["stack_get_us_per_page"], 4),
            "sglang_page_meta_us_per_page": round(over["sglang_page_meta_us_per_page"], 4),
            "pointer_plan": over["pointer_plan"],
            "vs_hicachefile_set_double": round(dbl["set_gbps"] / theirs["set_gbps"], 2),
            "vs_hicachefile_get_double": round(dbl["get_gbps"] / theirs["get_gbps"], 2),
            "umbp_set_gbps": round(ours["set_gbps"], 3),
            "umbp_get_gbps": round(ours["get_gbps"], 3),
            "umbp_double_set_gbps": round(dbl["set_gbps"], 3),
            "umbp_double_get_gbps": round(dbl["get_gbps"], 3),
            "memcpy_gbps": round(copy, 3),
            "file_set_gbps": round(theirs["set_gbps"], 3),
            "file_get_gbps": round(theirs["get_gbps"], 3),
            "bytes_per_direction": ours["bytes"],
            "batch_pages": BATCH,
            "page_tokens": PAGE,
            "rounds": ROUNDS,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
