"""The adapter's page format and page sizes inside real SGLang 0.5.23 objects (issue 11).

Real: SGLang's StorageBackendFactory, HiCacheStorageConfig, device and host KV pools on CPU (bf16,
fp16 and fp8 dtypes, page sizes, page_first / page_first_direct / page_head layouts, an MLA pool
with DeepSeek-R1's geometry), our config parsing, build checks, key scheme and store. Faked: the
UMBP client is the in-process double (tests/support/memory_client.py), which the ``mori`` tier
validates against the real mori; the same key separation runs on real mori in
test_keys_mori.py, and the page sizes in test_tiers_mori.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hicache_umbp.config import ConfigError
from hicache_umbp.keys import parse_key
from hicache_umbp.pages import host_buffer_ranges
from hicache_umbp.sglang_adapter import UMBPHiCacheStorage, use_client_opener
from support.memory_client import MemoryUMBPClient

from . import sglang_env as E
from .test_adapter_sglang import MIB, base_extra, hashes, make_backend, storage_config

pytestmark = pytest.mark.sglang

# ----------------------------------------------------------------------------- issue 11, item 4

# One field of the page format differs per case; everything else (namespace, model, TP, hashes)
# is equal, and both deployments share one store.
KEY_CASES = {
    "kv_dtype": ({"dtype": torch.bfloat16}, {"dtype": torch.float16}),
    "page_size": ({"page": E.PAGE}, {"page": 2 * E.PAGE}),
    "layout": ({"layout": "page_first"}, {"layout": "page_first_direct"}),
    "format_tag": ({}, {"format_tag": "unified-token-major"}),
    "backend_tag": ({}, {"extra": base_extra(extra_backend_tag="blue")}),
    "model_id_keeps_format_tag": (
        {"extra": base_extra(umbp_model_id="org/m")},
        {"extra": base_extra(umbp_model_id="org/m"), "format_tag": "unified-token-major"},
    ),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_deployments_differing_in_one_page_format_field_never_read_each_others_pages(
    case: str,
) -> None:
    """Real SGLang host pools (bf16/fp16, page sizes, layouts) and our adapter; the shared
    store is the in-process double (mori's write-once, exact-size semantics; the same key
    separation is checked on the real mori in test_keys_mori.py). The format tag is set on the
    pool instance the way SGLang's unified pool declares it (a class attribute)."""
    a_kw, b_kw = KEY_CASES[case]
    shared = MemoryUMBPClient(64 * MIB)
    a, host_a, _ = make_backend(client=shared, **a_kw)
    b, host_b, _ = make_backend(client=shared, **b_kw)
    n = 3
    keys = hashes(n, seed=31)
    idx_a = host_a.alloc(n * host_a.page_size)
    E.fill_random(host_a, seed=31)
    assert a.batch_set_v1(keys, idx_a) == [True] * n
    assert a.batch_exists(keys) == n
    assert b.batch_exists(keys) == 0, f"{case}: B sees A's pages"
    idx_b = host_b.alloc(n * host_b.page_size)
    assert b.batch_get_v1(keys, idx_b) == [False] * n
    stored = shared.keys()  # only A wrote: every key carries A's page format
    assert {parse_key(k).page_format for k in stored} == {a.page_format}
    assert a.page_format != b.page_format or a.backend_tag != b.backend_tag


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
    from hicache_umbp.sglang_adapter import page_format_of

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


def _attach(extra: dict[str, Any], host: Any, client: MemoryUMBPClient) -> UMBPHiCacheStorage:
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    cfg = storage_config(extra, mla=True)
    with use_client_opener(lambda rank_config: client):
        backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)
    return backend  # type: ignore[no-any-return]


def test_the_store_is_sized_from_the_registered_pools_real_page_part(tmp_path: Any) -> None:
    """Real SGLang MLA host pool with DeepSeek-R1's geometry; store below is the double. The
    adapter opens its store when SGLang registers the pool, with the pool's real part size
    (8,994,816 B, not an 8 MiB default) and page format, and DeepSeek pages round-trip."""
    host = r1_host_pool()
    client = MemoryUMBPClient(256 * MIB)
    backend = _attach(base_extra(umbp_local_ranks=1), host, client)
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
    """Real SGLang R1-shaped pool, the real configuration and build checks; the client is the
    double (the check runs before any client opens). An 8 MiB write-back budget held one page
    of the old 8 MiB default part, so the old adapter accepted it and its pages never reached
    SSD; it cannot hold one real 8,994,816 B page: registration fails naming both sizes."""
    host = r1_host_pool()
    extra = base_extra(
        umbp_local_ranks=1, umbp_ssd_enabled=True, umbp_ssd_dir=str(tmp_path),
        umbp_ssd_bytes=1 << 30, umbp_tier_queue_bytes=8 * MIB,
    )
    with pytest.raises(ConfigError) as err:
        _attach(extra, host, MemoryUMBPClient(256 * MIB))
    msg = str(err.value)
    assert "umbp_tier_queue_bytes" in msg and str(8 * MIB) in msg and str(R1_PART) in msg


def test_split_head_groups_share_one_client_registration_and_batch_limit() -> None:
    """Real page_head host pool with tp_lcm_size (two head groups); store below is the double.
    The groups are siblings of one store: the pool buffer is registered with the client once
    and only the head store closes the client."""
    extra = base_extra()
    client = MemoryUMBPClient(64 * MIB)
    backend, _host, _ = make_backend(
        "mha", "page_head", client=client, extra=extra, tp_rank=1, tp_size=2, tp_lcm_size=4,
        should_split_heads=True, extra_config=extra,
    )
    assert len(backend.stores) == 2
    head, sibling = backend.stores
    assert sibling.client is head.client and sibling.max_batch_pages == head.max_batch_pages
    ranges = host_buffer_ranges(_host)
    assert client.calls["register_memory"] == len(ranges) == 1  # before: once per group
    closed: list[int] = []
    client.close = lambda: closed.append(1)  # type: ignore[attr-defined]
    backend.close()
    assert closed == [1]
    assert client.calls["deregister_memory"] == len(ranges)
