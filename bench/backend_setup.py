"""What the backend benchmarks share: the page geometry, the tier sizes, the device pools and
each backend's configuration (``bench/backends.py``, ``bench/backends_v1.py``,
``bench/sglang_backend.py``). Imported after the benchmark put ``tests/`` on ``sys.path`` and set
SGLang's CPU mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hicache_umbp.contract.names import dynamic_extra_config

MIB = 1 << 20
PAGE = 64
PAGES = 128  # one SGLang storage batch
DRAM = 1 << 30
SSD_DRAM = 32 * MIB
SSD_BYTES = 512 * MIB


def device_pool(kind: str, mla_layers: int = 14) -> Any:
    """SGLang's device KV pool on CPU: ``mla`` pages of ``mla_layers`` layers (61: one
    DeepSeek-R1 page part of 4,497,408 B), else MHA (two 512 KiB parts a page)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    common = dict(size=16 * PAGE, page_size=PAGE, dtype=torch.bfloat16, device="cpu",
                  enable_memory_saver=False)
    if kind == "mla":
        return MLATokenToKVPool(kv_lora_rank=512, qk_rope_head_dim=64, layer_num=mla_layers,
                                **common)
    return MHATokenToKVPool(head_num=8, head_dim=128, layer_num=4, **common)


def per_kind_summary(kinds: dict[str, dict[str, Any]], median: str,
                     drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """Each page kind's results for the last JSON line: floats to 3 places, the medians per
    backend likewise, ``drop`` left out."""
    return {kind: {k: (round(x, 3) if isinstance(x, float) else x)
                   for k, x in v.items() if k != median and k not in drop}
            | {median: {b: {m: round(x, 3) for m, x in d.items()} for b, d in v[median].items()}}
            for kind, v in kinds.items()}


def backend_config(name: str, workdir: Path, ssd: bool) -> tuple[str, dict[str, Any]]:
    """(--hicache-storage-backend, extra-config) for one backend."""
    if name == "ours":
        tiers: dict[str, Any] = dict(umbp_dram_bytes=SSD_DRAM if ssd else DRAM)
        if ssd:
            tiers.update(umbp_ssd_enabled=True, umbp_ssd_dir=str(workdir / "ssd"),
                         umbp_ssd_bytes=SSD_BYTES, umbp_tier_queue_bytes=256 * MIB)
        return "dynamic", dynamic_extra_config(umbp_namespace="bench", host_hugepage_bytes=0,
                                               **tiers)
    if name == "builtin":
        cfg: dict[str, Any] = dict(dram_capacity_bytes=SSD_DRAM if ssd else DRAM,
                                   ssd_enabled=ssd)
        if ssd:
            cfg.update(ssd_storage_dir=str(workdir / "ssd"), ssd_capacity_bytes=SSD_BYTES)
        return "mori", cfg
    return "file", {"file_storage_path": str(workdir / "ssd")}
