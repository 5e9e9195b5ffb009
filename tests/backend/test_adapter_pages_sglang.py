"""The adapter's page format and page sizes inside real SGLang 0.5.23 objects over the REAL
amd-mori 1.2.4 (issue 11).

Real: SGLang's StorageBackendFactory, HiCacheStorageConfig, device and host KV pools on CPU (bf16,
fp16 and fp8 dtypes, page sizes, page_first / page_first_direct / page_head layouts, an MLA pool
with DeepSeek-R1's geometry), our config parsing, build checks, key scheme and store, and the mori
client the configuration opens: embedded DRAM, or a real ``umbp_standalone_server`` where two
deployments share pages (a sidecar, as they would in production). The call-count test wraps the
real client in :class:`support.faults.FaultyClient`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.sglang.adapter import UMBPHiCacheStorage
from hicache_umbp.sglang.host_pool import host_buffer_ranges
from hicache_umbp.store.keys import parse_key

from . import sglang_env as E
from .conftest import StandaloneServers
from .test_adapter_sglang import (
    MIB,
    base_extra,
    hashes,
    make_backend,
    present,
    standalone_extra,
    storage_config,
)

pytestmark = pytest.mark.sglang

# ----------------------------------------------------------------------------- issue 11, item 4

# One field of the page format differs per case; everything else (namespace, model, TP, hashes)
# is equal, and both deployments share one umbp-dram sidecar. "settings": extra-config keys.
KEY_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "kv_dtype": ({"dtype": torch.bfloat16}, {"dtype": torch.float16}),
    "page_size": ({"page": E.PAGE}, {"page": 2 * E.PAGE}),
    "layout": ({"layout": "page_first"}, {"layout": "page_first_direct"}),
    "format_tag": ({}, {"format_tag": "unified-token-major"}),
    "backend_tag": ({}, {"settings": {"extra_backend_tag": "blue"}}),
    "model_id_keeps_format_tag": (
        {"settings": {"umbp_model_id": "org/m"}},
        {"settings": {"umbp_model_id": "org/m"}, "format_tag": "unified-token-major"},
    ),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_deployments_differing_in_one_page_format_field_never_read_each_others_pages(
    case: str, standalone_servers: StandaloneServers,
) -> None:
    """Real SGLang host pools (bf16/fp16, page sizes, layouts; our allocator's mori-shm memory)
    and our adapter on two deployments that share a real umbp-dram sidecar, as pods of one
    node share one. The format tag is set on the pool instance the way SGLang's unified pool
    declares it (a class attribute)."""

    def deployment(kw: dict[str, Any]) -> tuple[UMBPHiCacheStorage, Any, Any]:
        kw = dict(kw)
        extra = standalone_extra(standalone_servers, **kw.pop("settings", {}))
        return make_backend(extra=extra, hook_allocator=True, **kw)

    a_kw, b_kw = KEY_CASES[case]
    a, host_a, client_a = deployment(a_kw)
    b, host_b, client_b = deployment(b_kw)
    n = 3
    keys = hashes(n, seed=31)
    idx_a = host_a.alloc(n * host_a.page_size)
    E.fill_pages(host_a, idx_a, seed=31)
    assert a.batch_set_v1(keys, idx_a) == [True] * n
    assert a.batch_exists(keys) == n
    assert b.batch_exists(keys) == 0, f"{case}: B sees A's pages"
    idx_b = host_b.alloc(n * host_b.page_size)
    E.wipe_pages(host_b, idx_b)
    assert b.batch_get_v1(keys, idx_b) == [False] * n
    assert not any(any(p) for p in E.page_bytes(host_b, idx_b)), "A's bytes reached B"
    # On the shared server: A's keys (A's page format) are there, B's are not.
    assert all(present(client_b, a.stores[0].keys.batch_keys(keys)))
    assert not any(present(client_a, b.stores[0].keys.batch_keys(keys)))
    assert {parse_key(k).page_format for k in a.stores[0].keys.batch_keys(keys)} == {
        a.page_format}
    assert a.page_format != b.page_format or a.backend_tag != b.backend_tag
    a.close()
    b.close()


@pytest.mark.parametrize(("dtype", "kv_cache_dtype", "want"), [
    (torch.bfloat16, None, "bfloat16"),
    (torch.bfloat16, "auto", "bfloat16"),
    (torch.float8_e4m3fn, "fp8_e4m3", "uint8:fp8_e4m3"),
    (torch.float8_e5m2, "fp8_e5m2", "uint8:fp8_e5m2"),
])
def test_fp8_pools_are_told_apart_by_sglangs_kv_cache_dtype(
    dtype: torch.dtype, kv_cache_dtype: str | None, want: str
) -> None:
    """Real host pools: SGLang stores every fp8 KV cache as uint8 in the host pool, so the pool
    alone cannot tell e4m3 from e5m2; the server's --kv-cache-dtype completes the field."""
    from hicache_umbp.sglang.host_pool import page_format_of

    host = E.host_pool(E.mha_device_pool(dtype=dtype))
    fmt = page_format_of(host, kv_cache_dtype)
    assert fmt.kv_dtype == want
    assert (fmt.layout, fmt.page_tokens, fmt.format_tag) == ("page_first", E.PAGE, "")


# ----------------------------------------------------------------------------- issue 11, item 2

R1_PART = 8_994_816  # DeepSeek-R1 bf16 MLA page of 128 tokens: 61 layers x 128 x 576 x 2 B


def r1_host_pool() -> Any:
    """A real MLA host pool with DeepSeek-R1's page geometry (61 layers, kv_lora_rank 512,
    rope 64, bf16, 128-token pages), on CPU."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    dev = MLATokenToKVPool(
        size=256, page_size=128, dtype=torch.bfloat16, kv_lora_rank=512, qk_rope_head_dim=64,
        layer_num=61, device="cpu", enable_memory_saver=False,
    )
    info = dev.get_device_pool_infos()[0].buffer_info
    return MLATokenToKVPoolHost(
        info, target_layer_num=61, host_to_device_ratio=2.0, host_size=0, page_size=128,
        layout="page_first", pin_memory=False, device="cpu", allocator_type="default",
        device_capacity_tokens=256, start_layer=0, end_layer=60,
    )


def _attach(extra: dict[str, Any], host: Any) -> UMBPHiCacheStorage:
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    cfg = storage_config(extra, mla=True)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)
    return backend


def test_the_store_is_sized_from_the_registered_pools_real_page_part(tmp_path: Any) -> None:
    """Real SGLang MLA host pool with DeepSeek-R1's geometry over real embedded mori DRAM. The
    adapter opens its store when SGLang registers the pool, with the pool's real part size
    (8,994,816 B, not an 8 MiB default) and page format, and DeepSeek pages round-trip."""
    host = r1_host_pool()
    backend = _attach(base_extra(umbp_local_ranks=1, umbp_dram_bytes=64 * MIB), host)
    assert backend.value_bytes == R1_PART
    assert backend.page_format is not None
    assert (backend.page_format.page_tokens, backend.page_format.kv_dtype) == (128, "bfloat16")
    idx = host.alloc(2 * 128)
    E.fill_random(host, seed=5)
    before = E.page_bytes(host, idx)
    keys = hashes(2, seed=5)
    assert backend.batch_set_v1(keys, idx) == [True, True]
    E.wipe(host)
    assert backend.batch_get_v1(keys, idx) == [True, True]
    assert E.page_bytes(host, idx) == before


def test_a_ring_smaller_than_one_real_page_fails_once_at_registration(tmp_path: Any) -> None:
    """Real SGLang R1-shaped pool, the real configuration and build checks (the check runs
    before any mori client opens). An 8 MiB write-back budget held one page
    of the old 8 MiB default part, so the old adapter accepted it and its pages never reached
    SSD; it cannot hold one real 8,994,816 B page: registration fails naming both sizes."""
    host = r1_host_pool()
    extra = base_extra(
        umbp_local_ranks=1, umbp_ssd_enabled=True, umbp_ssd_dir=str(tmp_path),
        umbp_ssd_bytes=1 << 30, umbp_tier_queue_bytes=8 * MIB,
    )
    with pytest.raises(ConfigError) as err:
        _attach(extra, host)
    msg = str(err.value)
    assert "umbp_tier_queue_bytes" in msg and str(8 * MIB) in msg and str(R1_PART) in msg


def test_split_head_groups_share_one_client_registration_and_batch_limit() -> None:
    """Real page_head host pool with tp_lcm_size (two head groups) over real embedded mori DRAM,
    its client counted by :class:`support.faults.FaultyClient`. The groups are siblings of one
    store: the pool buffer is registered with the client once and only the head store closes
    the client."""
    extra = base_extra()
    backend, _host, client = make_backend(
        "mha", "page_head", spy=True, extra=extra, tp_rank=1, tp_size=2, tp_lcm_size=4,
        should_split_heads=True, extra_config=extra,
    )
    assert len(backend.stores) == 2
    head, sibling = backend.stores
    assert sibling.client is head.client and sibling.max_batch_pages == head.max_batch_pages
    ranges = host_buffer_ranges(_host)
    assert client.calls["register_memory"] == len(ranges) == 1  # before: once per group
    backend.close()
    assert client.closed == 1
    assert client.calls["deregister_memory"] == len(ranges)


# ----------------------------------------------------------------------------- pointer plan


@pytest.mark.parametrize(
    ("kind", "layout", "over"),
    [("mha", "page_first", {}), ("mha", "page_first_direct", {}), ("mla", "page_first", {}),
     ("mla", "page_first_direct", {}),
     ("mha", "page_head", {"tp_rank": 1, "tp_size": 2, "tp_lcm_size": 4,
                           "should_split_heads": True})],
)
def test_pointer_plan_equals_sglangs_page_meta(kind: str, layout: str, over: Any) -> None:
    backend, host, _ = make_backend(kind, layout, **over)
    assert backend._plan is not None
    rng = random.Random(1)
    pages = rng.sample(range(host.size // E.PAGE), 12)
    idx = torch.cat([torch.arange(p * E.PAGE, (p + 1) * E.PAGE) for p in pages])
    ptrs, sizes = backend._meta(idx)
    flat = [pair for page in backend.page_pointers(idx, len(pages)) for pair in page]
    assert flat == list(zip(ptrs, sizes, strict=True))


def test_pool_without_linear_pointers_falls_back_to_sglangs_meta() -> None:
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    host = E.host_pool(E.mha_device_pool())
    real_meta = host.get_page_buffer_meta
    calls: list[int] = []

    def scrambled(indices: torch.Tensor) -> tuple[list[int], list[int]]:
        # Neighbouring pages swapped (0<->1, 2<->3, ...): not affine in the page start.
        calls.append(len(indices))
        n_pages = host.size // E.PAGE
        starts = []
        for i in indices[:: E.PAGE]:
            page = int(i) // E.PAGE
            swapped = page ^ 1 if page ^ 1 < n_pages else page
            starts.append(torch.arange(swapped * E.PAGE, (swapped + 1) * E.PAGE))
        return real_meta(torch.cat(starts))

    host.get_page_buffer_meta = scrambled
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(base_extra()),
                                                   host)
    backend.register_mem_pool_host(host)
    assert backend._plan is None
    idx = host.alloc(3 * E.PAGE)
    E.fill_random(host, seed=21)
    keys = hashes(3, seed=21)
    n_calls = len(calls)
    assert backend.batch_set_v1(keys, idx) == [True] * 3
    assert len(calls) == n_calls + 1
    E.wipe(host)
    assert backend.batch_get_v1(keys, idx) == [True] * 3
