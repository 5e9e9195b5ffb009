"""CPU stand-in for ``sgl_kernel`` (test support; never installed in the engine image).

SGLang 0.5.23 in CPU mode (``SGLANG_USE_CPU_ENGINE=1``) imports two ops from the CPU build of
sgl-kernel, which is not on PyPI (PyPI's ``sglang-kernel`` is CUDA-only and fails on
``libcuda.so.1``): ``assign_req_to_token_pool_cpu`` (``mem_cache/allocation.py``) and
``copy_all_layer_kv_cache_cpu`` (``kernels/ops/kvcache/cache_move.py``). Both are written here in
plain torch. Any other name resolves to a function that raises when *called* and names itself, so
module-level imports in code paths the tests never run (spec decoding, fused norms on AMX CPUs)
do not break start-up, and a test that reaches one fails loudly instead of computing garbage.
"""

from __future__ import annotations

from typing import Any

import torch
from hicache_cpu_engine.rawmem import rows_at, rows_needed

__version__ = "0.0.0+hicache.cpu.stand.in"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``req_to_token[req, start:end] = out_cache_loc[next end - start entries]`` per request."""
    offset = 0
    for req, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(),
                               end_offset.tolist(), strict=True):
        n = end - start
        req_to_token[req, start:end] = out_cache_loc[offset:offset + n]
        offset += n


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor,
                                tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
    """Per buffer (raw pointer, row stride in bytes): row ``tgt_loc[i]`` = row ``src_loc[i]``."""
    if not tgt_loc.numel():
        return
    n = max(rows_needed(tgt_loc), rows_needed(src_loc))
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        buf = rows_at(int(ptr), n, int(stride))
        buf[tgt_loc] = buf[src_loc].clone()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*_: Any, **__: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available in the CPU test stand-in "
            "(tests/cpu_engine); the code path that called it is not supported on CPU")

    unavailable.__name__ = name
    return unavailable
