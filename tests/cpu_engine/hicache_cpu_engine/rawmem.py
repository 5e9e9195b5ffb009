"""Zero-copy byte views of CPU memory given as tensors or raw addresses.

SGLang's KV-transfer ops receive device buffers as tables of raw data pointers (what the CUDA
kernels take). On CPU those are ordinary process memory, so a ``ctypes`` array at the address
wrapped by :func:`torch.frombuffer` is a real view: writes through it land in the buffer.
"""

from __future__ import annotations

import ctypes

import torch


def rows(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """``t``'s bytes as ``[-1, row_bytes]`` uint8 rows (a view; ``t`` must be contiguous)."""
    if not t.is_contiguous():
        raise ValueError("KV buffers must be contiguous")
    return t.view(torch.uint8).view(-1, row_bytes)


def rows_at(ptr: int, nrows: int, row_bytes: int) -> torch.Tensor:
    """``nrows`` rows of ``row_bytes`` at address ``ptr`` as a writable uint8 view."""
    if ptr == 0:
        raise ValueError("null buffer pointer")
    buf = (ctypes.c_uint8 * (nrows * row_bytes)).from_address(ptr)
    return torch.frombuffer(buf, dtype=torch.uint8).view(nrows, row_bytes)


def rows_needed(indices: torch.Tensor) -> int:
    """Rows a view must span to be indexed by ``indices``."""
    return int(indices.max().item()) + 1 if indices.numel() else 0
