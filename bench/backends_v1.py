"""The v1 calls alone: ours against SGLang's built-in ``mori`` backend without the controller's
threads around them (part of ``bench/backends.py``).

Why apart: through the controller a 128-page prefetch spends about as long in SGLang's own
work (hashing the tokens, four queue handoffs between its threads) as in the backend, and that
part swings by milliseconds on a shared machine. Here both backends are built exactly as the
controller's ``attach_storage_backend`` builds them (``StorageBackendFactory`` with the
controller's storage config, ``register_mem_pool_host``, ``register_mem_host_pool_v2`` for the
group, ``on_host_pools_registered``) on the same host pool, and ``batch_set_v1`` /
``batch_get_v1`` / ``batch_exists`` are called directly, as SGLang's backup, prefetch-io and
prefetch threads call them: 128 pages per call, interleaved, order alternating, many
repetitions, bytes checked.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import backend_setup as B

from backend import sglang_env as E
from backend import sglang_stack as S

SET_REPS = 8  # fresh pages each (mori keys are write-once): 8 x 128 MiB per backend
GET_REPS = 30
V1_DRAM = 2 << 30


def build(stack: S.Stack, name: str, workdir: Path) -> Any:
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    backend, extra = B.backend_config(name, workdir, ssd=False)
    if name == "ours":
        extra["umbp_dram_bytes"] = V1_DRAM
    else:
        extra["dram_capacity_bytes"] = V1_DRAM
    ctrl = stack.ctrl
    cfg = ctrl._generate_storage_config(E.MODEL_NAME, dict(extra))
    store = StorageBackendFactory.create_backend(backend, cfg, stack.host)
    store.register_mem_pool_host(stack.host)
    for entry in ctrl.mem_pool_host.entries:
        store.register_mem_host_pool_v2(entry.host_pool, entry.name)
    store.on_host_pools_registered()
    return store


def ratio(ours: list[float], theirs: list[float]) -> float:
    """Median of the per-repetition ratios (time theirs / time ours: > 1 is ours faster)."""
    return statistics.median(t / o for o, t in zip(ours, theirs, strict=True))


def compare(stack: S.Stack, workdir: Path) -> dict[str, Any]:
    host, pages, page = stack.host, B.PAGES, B.PAGE
    names = ("ours", "builtin")
    stores = {n: build(stack, n, workdir) for n in names}
    src, dst = host.alloc(pages * page), host.alloc(pages * page)
    E.fill_pages(host, src, seed=7)
    want = E.page_bytes(host, src)
    nbytes = sum(len(p) for p in want)
    rng = random.Random(7)
    times: dict[str, dict[str, list[float]]] = {
        n: {"set": [], "get": [], "exists": [], "set_cpu": [], "get_cpu": []} for n in names}
    try:
        for rep in range(SET_REPS):
            for name in names if rep % 2 else names[::-1]:
                keys = [f"{rng.getrandbits(256):064x}" for _ in range(pages)]
                t, c = time.perf_counter(), time.process_time()
                ok = stores[name].batch_set_v1(keys, src)
                times[name]["set"].append(time.perf_counter() - t)
                times[name]["set_cpu"].append(time.process_time() - c)
                assert all(ok), f"{name}: batch_set_v1 failed"
        keys = [f"{rng.getrandbits(256):064x}" for _ in range(pages)]
        for store in stores.values():
            assert all(store.batch_set_v1(keys, src))
        for rep in range(GET_REPS):
            for name in names if rep % 2 else names[::-1]:
                t, c = time.perf_counter(), time.process_time()
                ok = stores[name].batch_get_v1(keys, dst)
                times[name]["get"].append(time.perf_counter() - t)
                times[name]["get_cpu"].append(time.process_time() - c)
                t = time.perf_counter()
                present = stores[name].batch_exists(keys)
                times[name]["exists"].append(time.perf_counter() - t)
                assert all(ok) and present == pages, f"{name}: {sum(ok)} pages, {present} exist"
        for name in names:
            E.wipe_pages(host, dst)
            assert all(stores[name].batch_get_v1(keys, dst))
            assert E.page_bytes(host, dst) == want, f"{name}: bytes differ"
    finally:
        for store in stores.values():
            store.close()
        host.free(src)
        host.free(dst)
    med = {n: {"set_gbps": nbytes / statistics.median(t["set"]) / 1e9,
               "get_gbps": nbytes / statistics.median(t["get"]) / 1e9,
               "exists_us_per_key": statistics.median(t["exists"]) / pages * 1e6,
               "set_cpu_ms": statistics.median(t["set_cpu"]) * 1e3,
               "get_cpu_ms": statistics.median(t["get_cpu"]) * 1e3}
           for n, t in times.items()}
    return {"median": med,
            "vs_builtin_set_v1": ratio(times["ours"]["set"], times["builtin"]["set"]),
            "vs_builtin_get_v1": ratio(times["ours"]["get"], times["builtin"]["get"]),
            "exists_speed_vs_builtin": ratio(times["ours"]["exists"],
                                             times["builtin"]["exists"]),
            # The process's CPU time per call (mori copies on its own threads too): each
            # backend's whole work per batch, which other jobs inflate far less than wall time.
            "cpu_vs_builtin_set_v1": ratio(times["ours"]["set_cpu"], times["builtin"]["set_cpu"]),
            "cpu_vs_builtin_get_v1": ratio(times["ours"]["get_cpu"], times["builtin"]["get_cpu"])}
