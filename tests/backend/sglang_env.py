"""Real SGLang 0.5.23 objects on CPU for the ``sglang`` tier (imported only by test_*_sglang.py,
:mod:`.sglang_stack` and the engine benchmarks).

What is real: SGLang's ``ServerArgs`` resolution and ``publish`` (process config as a scheduler
sees it), SGLang's plugin loading, device KV pools (``MHATokenToKVPool`` / ``MLATokenToKVPool`` on
CPU), host pools (``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``), the paged allocator, the
``StorageBackendFactory``, SGLang's page-hash chain (``get_storage_hash_str``), and under the
adapter the real amd-mori 1.2.4 client (the engine environment holds SGLang and mori in one
Python, as the engine image does). The scheduler's stack (``HybridCacheController``) is built in
:mod:`.sglang_stack`.

What stands in: the model is a tiny local ``config.json`` (no weights; SGLang only reads the
config here), and SGLang runs in its CPU mode (``SGLANG_USE_CPU_ENGINE=1``, set by
tests/conftest.py for this tier) with the test-support plugin of ``tests/cpu_engine``, which
builds host pools unpinned (``cudaHostRegister`` needs a GPU driver) and supplies pure-torch
device<->host KV copies (never called by these tests: they move pages between host pools and
L3 only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

PAGE = 16
LAYERS = 3
MHA_HEADS = 2
HEAD_DIM = 8
MLA_LORA = 16
MLA_ROPE = 8
DEVICE_TOKENS = 256
# --hicache-size in GB, as production sizes host pools (SGLang: host_size * 1e9 // bytes per
# token). The pool is mapped, not touched: tests write only the pages they use.
HICACHE_SIZE_GB = 1
MODEL_NAME = "tiny-llama"

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}


def tiny_model_dir(root: Path) -> Path:
    d = root / MODEL_NAME
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    return d


def publish_scheduler(
    model_dir: Path,
    extra_config: dict[str, Any] | None,
    backend: str | None = "dynamic",
    *,
    layout: str = "page_first",
    hicache_size_gb: int = HICACHE_SIZE_GB,
    page: int = PAGE,
) -> Any:
    """Resolve real ServerArgs and publish them as a scheduler process would (rank 0 of 1), then
    load SGLang's plugins as every SGLang process does (our host-allocator hook and the CPU
    test-support plugin). ``page_first`` pairs with the ``kernel`` I/O backend and
    ``page_first_direct`` with ``direct``, as SGLang's own resolution insists."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(model_dir),
        served_model_name=MODEL_NAME,
        enable_hierarchical_cache=True,
        hicache_mem_layout=layout,
        hicache_io_backend="direct" if layout == "page_first_direct" else "kernel",
        hicache_write_policy="write_back",
        hicache_size=hicache_size_gb,
        hicache_storage_backend=backend,
        hicache_storage_backend_extra_config=(
            json.dumps(extra_config) if extra_config is not None else None
        ),
        device="cpu",
        page_size=page,
    )
    rc.publish(args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0))
    load_plugins()
    return args


def mha_device_pool(
    dtype: torch.dtype = torch.bfloat16, page: int = PAGE, size: int = DEVICE_TOKENS
) -> Any:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=size, page_size=page, dtype=dtype, head_num=MHA_HEADS,
        head_dim=HEAD_DIM, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )


def mla_device_pool(
    dtype: torch.dtype = torch.bfloat16, page: int = PAGE, size: int = DEVICE_TOKENS
) -> Any:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool(
        size=size, page_size=page, dtype=dtype, kv_lora_rank=MLA_LORA,
        qk_rope_head_dim=MLA_ROPE, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )


def host_pool(
    device_pool: Any,
    layout: str = "page_first",
    allocator_type: str = "default",
    ratio: float = 4.0,
) -> Any:
    """A real host pool for the device pool, built with its constructor (same arguments as
    SGLang's ``build_kv_host_pool``; the page size is the device pool's) and sized by ``ratio``
    so adapter-level tests get small pools. The controller tests take the pool SGLang's own
    assembler sizes from ``--hicache-size`` (:func:`.sglang_stack.scheduler_stack`)."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    info = device_pool.get_device_pool_infos()[0].buffer_info
    common = dict(
        host_to_device_ratio=ratio, host_size=0, page_size=device_pool.page_size, layout=layout,
        pin_memory=False, device="cpu", allocator_type=allocator_type,
        device_capacity_tokens=DEVICE_TOKENS, start_layer=0, end_layer=LAYERS - 1,
    )
    if isinstance(device_pool, MLATokenToKVPool):
        return MLATokenToKVPoolHost(info, target_layer_num=LAYERS, **common)
    return MHATokenToKVPoolHost(info, **common)


def fill_random(host: Any, seed: int) -> None:
    """Random bytes in every KV buffer of the host pool."""
    g = torch.Generator().manual_seed(seed)
    for t in host_tensors(host):
        raw = t.view(torch.uint8).view(-1)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))


def host_tensors(host: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for name in ("kv_buffer", "k_buffer", "v_buffer"):
        v = getattr(host, name, None)
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, torch.Tensor) and all(t.data_ptr() != o.data_ptr() for o in out):
                out.append(t)
    return out


def page_bytes(host: Any, host_indices: torch.Tensor) -> list[bytes]:
    """The bytes of every page, read through SGLang's own flat-page accessor."""
    return [
        host.get_data_page(int(host_indices[i]), flat=True).view(torch.uint8).numpy().tobytes()
        for i in range(0, len(host_indices), host.page_size)
    ]


def wipe(host: Any) -> None:
    for t in host_tensors(host):
        t.view(torch.uint8).zero_()


def fill_pages(host: Any, host_indices: torch.Tensor, seed: int) -> None:
    """Random bytes in the given pages only, through SGLang's own flat-page writer (a host pool
    sized by --hicache-size is mostly never touched)."""
    g = torch.Generator().manual_seed(seed)
    for i in range(0, len(host_indices), host.page_size):
        flat = host.get_data_page(int(host_indices[i]), flat=True)
        raw = torch.randint(0, 256, (flat.numel() * flat.element_size(),), dtype=torch.uint8,
                            generator=g)
        host.set_from_flat_data_page(int(host_indices[i]), raw.view(flat.dtype))


def wipe_pages(host: Any, host_indices: torch.Tensor) -> None:
    """Zero the given pages through SGLang's flat-page writer."""
    for i in range(0, len(host_indices), host.page_size):
        flat = host.get_data_page(int(host_indices[i]), flat=True)
        host.set_from_flat_data_page(int(host_indices[i]), torch.zeros_like(flat))


def page_hashes(tokens: list[int]) -> list[str]:
    """SGLang's own page-hash chain (64-hex SHA-256), as the controller computes it."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
    assert isinstance(hashes, list)
    return hashes


def spawn_probe(model_dir: str) -> dict[str, Any]:
    """Target of a spawned child (test_hook_sglang): report what the child saw first."""
    import sys

    from hicache_umbp.sglang import hook as sglang_hook

    installed_first = sglang_hook.installed()
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type

    publish_scheduler(
        Path(model_dir),
        {"backend_name": "umbp", "module_path": "hicache_umbp.sglang_adapter",
         "class_name": "UMBPHiCacheStorage", "interface_v1": 1,
         "umbp_dram_bytes": 1 << 26, "host_hugepage_bytes": 0},
    )
    pool = host_pool(mha_device_pool(), allocator_type=get_allocator_type())
    record = getattr(pool.allocator, "allocations", [None])[-1]
    main = sys.modules["__main__"]
    return {
        "main_module": getattr(getattr(main, "__spec__", None), "name", None),
        "installed_before_target": installed_first,
        "allocator": type(pool.allocator).__name__,
        "ptr_matches": record is not None and record.ptr == pool.kv_buffer.data_ptr(),
    }
