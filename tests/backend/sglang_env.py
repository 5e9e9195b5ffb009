"""Real SGLang 0.5.23 objects on CPU for the ``sglang`` tier (imported only by test_*_sglang.py).

What is real: SGLang's ``ServerArgs`` resolution and ``publish`` (process config as a scheduler
sees it), device KV pools (``MHATokenToKVPool`` / ``MLATokenToKVPool`` on CPU), host pools
(``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``, pin_memory=False), the paged allocator, the
``HiCacheController`` with its prefetch/backup threads, the ``StorageBackendFactory``, SGLang's
page-hash chain (``get_storage_hash_str``). What stands in: the model is a tiny local
``config.json`` (no weights; SGLang only reads the config here), and the UMBP client is the
in-process double (mori has no Python 3.11 wheel), which the ``mori`` tier validates against
the real mori.
"""

from __future__ import annotations

import json
import threading
import time
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
    model_dir: Path, extra_config: dict[str, Any] | None, backend: str | None = "dynamic"
) -> None:
    """Resolve real ServerArgs and publish them as a scheduler process would (rank 0 of 1)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(model_dir),
        served_model_name=MODEL_NAME,
        enable_hierarchical_cache=True,
        hicache_mem_layout="page_first",
        hicache_storage_backend=backend,
        hicache_storage_backend_extra_config=(
            json.dumps(extra_config) if extra_config is not None else None
        ),
        device="cpu",
        page_size=PAGE,
    )
    rc.publish(args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0))


def mha_device_pool(dtype: torch.dtype = torch.bfloat16, page: int = PAGE) -> Any:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=DEVICE_TOKENS, page_size=page, dtype=dtype, head_num=MHA_HEADS,
        head_dim=HEAD_DIM, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )


def mla_device_pool(dtype: torch.dtype = torch.bfloat16, page: int = PAGE) -> Any:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool(
        size=DEVICE_TOKENS, page_size=page, dtype=dtype, kv_lora_rank=MLA_LORA,
        qk_rope_head_dim=MLA_ROPE, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )


def host_pool(
    device_pool: Any,
    layout: str = "page_first",
    allocator_type: str = "default",
    ratio: float = 4.0,
) -> Any:
    """The real host pool SGLang builds for the device pool (same constructor arguments; the
    page size is the device pool's)."""
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
    out = []
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


def page_hashes(tokens: list[int]) -> list[str]:
    """SGLang's own page-hash chain (64-hex SHA-256), as the controller computes it."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
    assert isinstance(hashes, list)
    return hashes


def controller(device_pool: Any, host: Any, extra_config: dict[str, Any]) -> Any:
    """A real HiCacheController attached to the dynamic backend given by extra_config."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    allocator = PagedTokenToKVPoolAllocator(
        DEVICE_TOKENS, PAGE, torch.bfloat16, "cpu", device_pool, need_sort=False
    )
    return HiCacheController(
        token_to_kv_pool_allocator=allocator,
        mem_pool_host=host,
        page_size=PAGE,
        tp_group=None,
        load_cache_event=threading.Event(),
        write_policy="write_back",
        io_backend="direct",
        storage_backend="dynamic",
        model_name=MODEL_NAME,
        storage_backend_extra_config=dict(extra_config),
    )


def wait_for(queue: Any, timeout_s: float = 60.0) -> Any:
    """Next item of a controller queue (a hang fails the test instead of blocking it)."""
    return queue.get(block=True, timeout=timeout_s)


def backup(ctrl: Any, host_indices: torch.Tensor, tokens: list[int], hashes: list[str]) -> int:
    """Drive the controller's backup thread like the radix cache does; tokens backed up."""
    op_id = ctrl.write_storage(host_indices, tokens, hash_value=hashes)
    op = wait_for(ctrl.ack_backup_queue)
    assert op.id == op_id
    return int(op.completed_tokens)


def prefetch(ctrl: Any, rid: str, tokens: list[int]) -> tuple[int, torch.Tensor | None, Any]:
    """Drive hit query + transfer like the scheduler does: (tokens fetched, host indices, op)."""
    op = ctrl.prefetch(rid, tokens)
    hit = wait_for(ctrl.prefetch_hit_queue)
    assert hit is op
    if op.storage_hit_count == 0:
        return 0, None, op
    indices = ctrl.alloc_prefetch_host_buffers(op, op.storage_hit_count)
    assert indices is not None
    op.host_indices = indices
    ctrl.prefetch_buffer.put(op)
    completed = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ack = wait_for(ctrl.ack_prefetch_queue)
        if ack.completed_tokens is not None:
            completed = ack.completed_tokens
        if ack.completed_req:
            return completed, indices, op
    raise AssertionError("prefetch did not complete")


def spawn_probe(model_dir: str) -> dict[str, Any]:
    """Target of a spawned child (test_hook_sglang): report what the child saw first."""
    import sys

    from hicache_umbp import sglang_hook

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
