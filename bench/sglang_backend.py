"""UMBP backend inside real SGLang 0.5.23 on CPU: adapter overhead and controller-path GB/s.

1. Adapter overhead against a real SGLang host pool (MHA page_first, bf16, 64-token pages):
   keys (KeyScheme) + pointers (the adapter's page pointers) per page at 128-page batches, as
   SGLang's prefetch/backup threads call it; also the whole stack (adapter + store) over a
   client that returns at once, and SGLang's own ``get_page_buffer_meta`` for comparison.
2. End-to-end through the stack SGLang's scheduler builds (``HybridCacheController`` over a
   ``HostPoolGroup``, host pool sized by ``--hicache-size``; ``tests/backend/sglang_stack.py``)
   on the same host pool and the same kind of pages: our backend over the real amd-mori 1.2.4
   embedded DRAM tier against SGLang's built-in ``file`` backend (HiCacheFile under a temp dir),
   interleaved rounds (``bench/backends.py``'s round: one 128-page backup, ``batch_exists``, one
   prefetch, every byte checked), and one memmove of the same bytes for scale.

Run: ``make bench-sglang``. Last line: one JSON object with ``adapter_us_per_page``,
``vs_hicachefile_set``, ``vs_hicachefile_get`` and the raw numbers.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before sglang is imported
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import backend_setup as setup  # noqa: E402
import backends as B  # noqa: E402
from hicache_umbp.contract.names import dynamic_extra_config  # noqa: E402
from hicache_umbp.sglang.adapter import UMBPHiCacheStorage  # noqa: E402
from support.faults import use_client_opener  # noqa: E402

from backend import sglang_env as E  # noqa: E402
from backend import sglang_stack as S  # noqa: E402

PAGE = 64
BATCH = 128
LAYERS = 4
HEADS = 8
HEAD_DIM = 128
E2E_PAGES = 128  # 2 parts x 512 KiB per page: 128 MiB per direction
ROUNDS = 5  # median of 5 interleaved rounds per backend
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


def main() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="hicache-bench-"))
    try:
        model = E.tiny_model_dir(workdir)
        extra = dynamic_extra_config(umbp_dram_bytes=1 << 30, umbp_namespace="bench",
                                     host_hugepage_bytes=0)
        E.publish_scheduler(model, extra, page=PAGE)
        _dev, host = pools(device_tokens=E2E_PAGES * PAGE * 2)
        page_mib = host.get_size_per_token() * PAGE / MIB
        print(f"host pool: {host.size // PAGE} pages of {PAGE} tokens, {page_mib:.2f} MiB/page "
              f"(MHA page_first, {LAYERS} layers x {HEADS} heads x {HEAD_DIM}, bf16)")

        over = adapter_overhead(host, extra)
        print(f"adapter keys+pointers: {over['adapter_us_per_page']:.3f} us/page "
              f"(128-page batches; target <= 2); SGLang get_page_buffer_meta alone: "
              f"{over['sglang_page_meta_us_per_page']:.3f} us/page")
        print(f"adapter+store over a null client: set {over['stack_set_us_per_page']:.3f} "
              f"us/page, get {over['stack_get_us_per_page']:.3f} us/page")

        stack = S.scheduler_stack(model, "mha", extra | {"host_prefault": True}, attach=False,
                                  page=PAGE, device_pool=setup.device_pool("mha"))
        runs: dict[str, list[dict[str, float]]] = {"ours": [], "file": []}
        for r in range(ROUNDS + 1):  # interleaved; round 0 warms up
            for name in runs:
                res = B.run_round(stack, name, workdir, seed=1000 * r + len(runs[name]))
                if r:
                    runs[name].append(res)
        stack.close()
        med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in runs.items()}
        ours, theirs = med["ours"], med["file"]

        def ratio(key: str) -> float:
            return statistics.median(o[key] / t[key]
                                     for o, t in zip(runs["ours"], runs["file"], strict=True))

        set_ratio, get_ratio = ratio("set_gbps"), ratio("get_gbps")
        for name, res in (("umbp/mori", ours), ("HiCacheFile", theirs)):
            print(f"controller {name:12s} backup {res['set_gbps']:6.2f} GB/s  "
                  f"prefetch {res['get_gbps']:6.2f} GB/s")
        copy = memcpy_gbps(E2E_PAGES * 2 * 512 * 1024)
        print(f"one memmove of the same bytes: {copy:.2f} GB/s (the one-copy ceiling here)")
        print(f"umbp (real mori) vs HiCacheFile: backup {set_ratio:.1f}x, prefetch "
              f"{get_ratio:.1f}x (target >= 3x)")
        result = {
            "adapter_us_per_page": round(over["adapter_us_per_page"], 4),
            "vs_hicachefile_set": round(set_ratio, 2),
            "vs_hicachefile_get": round(get_ratio, 2),
            "stack_set_us_per_page": round(over["stack_set_us_per_page"], 4),
            "stack_get_us_per_page": round(over["stack_get_us_per_page"], 4),
            "sglang_page_meta_us_per_page": round(over["sglang_page_meta_us_per_page"], 4),
            "pointer_plan": over["pointer_plan"],
            "umbp_set_gbps": round(ours["set_gbps"], 3),
            "umbp_get_gbps": round(ours["get_gbps"], 3),
            "memcpy_gbps": round(copy, 3),
            "file_set_gbps": round(theirs["set_gbps"], 3),
            "file_get_gbps": round(theirs["get_gbps"], 3),
            "batch_pages": BATCH,
            "page_tokens": PAGE,
            "rounds": ROUNDS,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
