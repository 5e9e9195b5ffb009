"""The CPU test support (tests/cpu_engine) itself, against real SGLang 0.5.23 objects.

Real: SGLang's device KV pools and host pools (MHA and MLA, page_first and page_first_direct),
their own ``backup_from_device_all_layer`` / ``load_to_device_per_layer``, which call the transfer
ops by name; SGLang's hook registry. What is ours: the pure-torch ops the plugin puts in their
place and the ``sgl_kernel`` stand-in. Every byte moved is compared with the source tensor.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.sglang

PAGE = 16
LAYERS = 3
TOKENS = 256


@pytest.fixture(scope="module", autouse=True)
def cpu_plugin() -> None:
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # the plugin's own gate (SGLang read it at import)
    from hicache_cpu_engine import plugin

    plugin.plugin()


def device_pool(kind: str):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    if kind == "mla":
        pool = MLATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=torch.bfloat16,
                                kv_lora_rank=16, qk_rope_head_dim=8, layer_num=LAYERS,
                                device="cpu", enable_memory_saver=False)
        buffers = list(pool.kv_buffer)
    else:
        pool = MHATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=torch.bfloat16, head_num=2,
                                head_dim=8, layer_num=LAYERS, device="cpu",
                                enable_memory_saver=False)
        buffers = list(pool.k_buffer) + list(pool.v_buffer)
    g = torch.Generator().manual_seed(7)
    for b in buffers:
        raw = b.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
    return pool, buffers


def host_pool(dev, layout: str):
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    info = dev.get_device_pool_infos()[0].buffer_info
    common = dict(host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
                  pin_memory=True, device="cpu", allocator_type="default",
                  device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS - 1)
    if isinstance(dev, MLATokenToKVPool):
        return MLATokenToKVPoolHost(info, target_layer_num=LAYERS, **common)
    return MHATokenToKVPoolHost(info, **common)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout,io", [("page_first", "kernel"), ("page_first_direct", "direct")])
def test_host_pool_round_trip_through_the_cpu_ops(kind: str, layout: str, io: str) -> None:
    dev, buffers = device_pool(kind)
    host = host_pool(dev, layout)
    assert host.pin_memory is False  # the plugin unpinned it (pin_memory=True was passed)
    src = torch.arange(2 * PAGE, 4 * PAGE)  # two pages of device tokens
    dst = torch.arange(5 * PAGE, 7 * PAGE)  # -> two pages of the host pool
    before = [b[src].clone() for b in buffers]
    host.backup_from_device_all_layer(dev, dst, src, io)
    back = torch.arange(8 * PAGE, 10 * PAGE)  # load into other device slots
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dev, dst, back, layer, io)
    for original, b in zip(before, buffers, strict=True):
        assert torch.equal(b[back].view(torch.uint8), original.view(torch.uint8))


def test_page_first_host_layout_holds_each_token_layer_by_layer() -> None:
    dev, _ = device_pool("mha")
    host = host_pool(dev, "page_first")
    src, dst = torch.arange(0, PAGE), torch.arange(3 * PAGE, 4 * PAGE)
    host.backup_from_device_all_layer(dev, dst, src, "kernel")
    for layer in range(LAYERS):  # host k_buffer is [tokens, layers, heads, dim]
        for h, d in ((host.k_buffer, dev.k_buffer), (host.v_buffer, dev.v_buffer)):
            # bytes, not values: random bf16 bit patterns include NaNs
            assert torch.equal(h[dst, layer].view(torch.uint8), d[layer][src].view(torch.uint8))


def test_sgl_kernel_stand_in_ops_and_unknown_names() -> None:
    import sgl_kernel

    req_to_token = torch.zeros((3, 8), dtype=torch.int32)
    out = torch.arange(10, 15, dtype=torch.int32)
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([1, 4]), torch.tensor([3, 7]), out, 8)
    assert req_to_token[2, 1:3].tolist() == [10, 11]
    assert req_to_token[0, 4:7].tolist() == [12, 13, 14]
    rows = torch.arange(24, dtype=torch.int16).reshape(6, 4)
    sgl_kernel.copy_all_layer_kv_cache_cpu(
        torch.tensor([rows.data_ptr()], dtype=torch.uint64), torch.tensor([8]),
        torch.tensor([5, 0]), torch.tensor([1, 2]))
    assert rows[5].tolist() == [4, 5, 6, 7] and rows[0].tolist() == [8, 9, 10, 11]
    op = sgl_kernel.some_cuda_only_op  # importable, so module-level imports do not break ...
    with pytest.raises(NotImplementedError, match="some_cuda_only_op"):
        op()  # ... but a call fails loudly


def test_the_plugin_does_nothing_outside_cpu_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_cpu_engine import plugin

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")
    assert plugin.cpu_mode() is False
