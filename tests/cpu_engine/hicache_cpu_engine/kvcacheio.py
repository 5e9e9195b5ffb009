"""Pure-torch versions of ``sgl_kernel.kvcacheio``'s host<->device KV transfer ops (CPU only).

Same names and keyword signatures as the CUDA ops SGLang 0.5.23's host pools call
(``mem_cache/pool_host/mha.py`` and ``mla.py``); semantics read from those call sites:

* layouts: device KV is *layer first* (one ``[tokens, heads, dim]`` buffer per layer); host
  ``page_first`` is ``[tokens, layers, row]`` (``layout_dim = layers * item_size`` bytes per
  token); host ``page_first_direct`` is ``[pages, layers, page_size, row]``; host ``layer_first``
  is one buffer per layer like the device.
* ``*_all_layer_*`` ops take the device layers as a tensor of raw data pointers; ``*_direct_*``
  ops take lists of tensors; indices are per token (int64).

Only what a CPU test can call is provided; ``page_head`` transfers raise and name themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .rawmem import rows, rows_at, rows_needed


def _copy_layer_into_pf(dst_pf: torch.Tensor, layer: int, item: int, dst_idx: torch.Tensor,
                        src_rows: torch.Tensor, src_idx: torch.Tensor) -> None:
    dst_pf[dst_idx, layer * item:(layer + 1) * item] = src_rows[src_idx]


# ----------------------------------------------------------------------------- page_first (MHA)


def transfer_kv_per_layer_pf_lf(*, src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                                dst_v: torch.Tensor, src_indices: torch.Tensor,
                                dst_indices: torch.Tensor, layer_id: int, item_size: int,
                                src_layout_dim: int) -> None:
    """Host page_first -> one device layer (load)."""
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        transfer_kv_per_layer_mla_pf_lf(src=src, dst=dst, src_indices=src_indices,
                                        dst_indices=dst_indices, layer_id=layer_id,
                                        item_size=item_size, src_layout_dim=src_layout_dim)


def transfer_kv_all_layer_lf_pf(*, src_k_layers: torch.Tensor, dst_k: torch.Tensor,
                                src_v_layers: torch.Tensor, dst_v: torch.Tensor,
                                src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                item_size: int, dst_layout_dim: int, num_layers: int) -> None:
    """Every device layer -> host page_first (backup)."""
    for layers, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):
        transfer_kv_all_layer_mla_lf_pf(src_layers=layers, dst=dst, src_indices=src_indices,
                                        dst_indices=dst_indices, item_size=item_size,
                                        dst_layout_dim=dst_layout_dim, num_layers=num_layers)


# ----------------------------------------------------------------------------- page_first (MLA)


def transfer_kv_per_layer_mla_pf_lf(*, src: torch.Tensor, dst: torch.Tensor,
                                    src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                    layer_id: int, item_size: int, src_layout_dim: int) -> None:
    host = rows(src, src_layout_dim)
    dev = rows(dst, item_size)
    dev[dst_indices] = host[src_indices, layer_id * item_size:(layer_id + 1) * item_size]


def transfer_kv_all_layer_mla_lf_pf(*, src_layers: torch.Tensor, dst: torch.Tensor,
                                    src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                    item_size: int, dst_layout_dim: int, num_layers: int) -> None:
    host = rows(dst, dst_layout_dim)
    n = rows_needed(src_indices)
    for layer in range(num_layers):
        dev = rows_at(int(src_layers[layer]), n, item_size)
        _copy_layer_into_pf(host, layer, item_size, dst_indices, dev, src_indices)


# ----------------------------------------------------------------------------- page_first_direct


def _direct_view(host: torch.Tensor) -> torch.Tensor:
    """``[pages, layers, page_size, ...]`` as ``[pages, layers, page_size, row bytes]``."""
    pages, layers, page_size = host.shape[:3]
    return host.view(torch.uint8).view(pages, layers, page_size, -1)


def transfer_kv_per_layer_direct_pf_lf(*, src_ptrs: Sequence[torch.Tensor],
                                       dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       layer_id: int, page_size: int) -> None:
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        host = _direct_view(src)
        dev = rows(dst, host.shape[-1])
        dev[dst_indices] = host[src_indices // page_size, layer_id, src_indices % page_size]


def transfer_kv_all_layer_direct_lf_pf(*, src_ptrs: Sequence[torch.Tensor],
                                       dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       page_size: int) -> None:
    layers_per_dst = len(src_ptrs) // len(dst_ptrs)
    for b, dst in enumerate(dst_ptrs):
        host = _direct_view(dst)
        for layer in range(layers_per_dst):
            dev = rows(src_ptrs[b * layers_per_dst + layer], host.shape[-1])
            host[dst_indices // page_size, layer, dst_indices % page_size] = dev[src_indices]


# ----------------------------------------------------------------------------- layer_first


def transfer_kv_direct(*, src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                       page_size: int) -> None:
    for src, dst in zip(src_layers, dst_layers, strict=True):
        row = src[0].numel() * src.element_size() if src.dim() > 1 else src.element_size()
        rows(dst, row)[dst_indices] = rows(src, row)[src_indices]


def transfer_kv_per_layer_mla(*, src: torch.Tensor, dst: torch.Tensor,
                              src_indices: torch.Tensor, dst_indices: torch.Tensor,
                              item_size: int) -> None:
    rows(dst, item_size)[dst_indices] = rows(src, item_size)[src_indices]


def transfer_kv_per_layer(*, src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                          dst_v: torch.Tensor, src_indices: torch.Tensor,
                          dst_indices: torch.Tensor, item_size: int) -> None:
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        transfer_kv_per_layer_mla(src=src, dst=dst, src_indices=src_indices,
                                  dst_indices=dst_indices, item_size=item_size)


def transfer_kv_all_layer_mla(*, src_layers: torch.Tensor, dst_layers: torch.Tensor,
                              src_indices: torch.Tensor, dst_indices: torch.Tensor,
                              item_size: int, num_layers: int) -> None:
    n_src, n_dst = rows_needed(src_indices), rows_needed(dst_indices)
    for layer in range(num_layers):
        dst = rows_at(int(dst_layers[layer]), n_dst, item_size)
        dst[dst_indices] = rows_at(int(src_layers[layer]), n_src, item_size)[src_indices]


def transfer_kv_all_layer(*, src_k_layers: torch.Tensor, dst_k_layers: torch.Tensor,
                          src_v_layers: torch.Tensor, dst_v_layers: torch.Tensor,
                          src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int,
                          num_layers: int) -> None:
    for src, dst in ((src_k_layers, dst_k_layers), (src_v_layers, dst_v_layers)):
        transfer_kv_all_layer_mla(src_layers=src, dst_layers=dst, src_indices=src_indices,
                                  dst_indices=dst_indices, item_size=item_size,
                                  num_layers=num_layers)


def _page_head_unsupported(name: str):
    def op(**_: object) -> None:
        raise NotImplementedError(f"{name}: page_head transfers have no CPU version in tests")

    op.__name__ = name
    return op


transfer_kv_all_layer_lf_ph = _page_head_unsupported("transfer_kv_all_layer_lf_ph")
transfer_kv_per_layer_ph_lf = _page_head_unsupported("transfer_kv_per_layer_ph_lf")

#: Every op name a host pool module binds (mha.py and mla.py import lists of SGLang 0.5.23).
OPS = (
    "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
)
