"""Page pointers over SGLang host pools, without importing torch or sglang.

SGLang's ``get_page_buffer_meta`` returns (ptr, size) pairs for every part of every page of a
batch, but walks every *token* index of the batch in Python (``indices.tolist()`` on 128 pages x
64 tokens) although only each page's first index matters. For page-first layouts the pointers
are affine in the page's first token index; :class:`PointerPlan` derives that map from SGLang's
own function on two probe pages and checks it on pages across the whole pool, so any layout or
SGLang change that breaks the assumption falls back to SGLang's function (the adapter does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..store.keys import PageFormat
from ..store.store import PagePointers


@dataclass(frozen=True)
class PointerPlan:
    """Page pointers as ``base[part] + first_token_index * stride`` for page-first layouts.

    SGLang's ``get_page_buffer_meta`` walks every token index of the batch in Python
    (``indices.tolist()``, 128 pages x 64 tokens); only the first index of each page matters.
    The plan is derived from SGLang's own function on two probe pages and verified against it
    on pages across the whole pool, so a layout that is not linear in the page start (or
    any change of SGLang's pointer math) falls back to calling SGLang per batch.
    """

    page_size: int
    bases: tuple[int, ...]  # pointer of each part of the page starting at token 0
    stride: int  # bytes between consecutive token indices, the same for every part
    sizes: tuple[int, ...]  # bytes of each part

    @classmethod
    def derive(
        cls,
        pool: Any,
        meta: Callable[[Any], tuple[list[int], list[int]]],
        per: int,
        indices: Callable[[list[int]], Any],
    ) -> PointerPlan | None:
        """``meta`` is the pool's page-meta function, ``indices`` builds the index tensor it
        takes (the caller's torch; this module imports none)."""
        ps = int(pool.page_size)
        pages = int(getattr(pool, "size", 0)) // ps
        if pages < 3:
            return None
        try:
            ptrs, sizes = meta(indices(list(range(0, 2 * ps))))
        except Exception:  # a pool without page meta (e.g. a logical anchor) has no plan
            return None
        if len(ptrs) != 2 * per or len(sizes) != 2 * per:
            return None
        deltas = {ptrs[per + j] - ptrs[j] for j in range(per)}
        if len(deltas) != 1 or next(iter(deltas)) % ps:
            return None
        plan = cls(ps, tuple(ptrs[:per]), next(iter(deltas)) // ps, tuple(sizes[:per]))
        sample = sorted({1, pages // 3, pages // 2, pages - 1})
        probe = indices([t for p in sample for t in range(p * ps, (p + 1) * ps)])
        want_ptrs, want_sizes = meta(probe)
        got = [pair for page in plan.pointers(probe, len(sample)) for pair in page]
        if got != list(zip(want_ptrs, want_sizes, strict=True)):
            return None
        return plan

    def pointers(self, host_indices: Any, n_pages: int) -> list[PagePointers]:
        """Pages of ``host_indices`` (a 1-D CPU int64 tensor or array, ``page_size`` indices
        per page; only the first index of each page is read, as SGLang does)."""
        if len(host_indices) != n_pages * self.page_size:
            raise ValueError(
                f"{len(host_indices)} host indices for {n_pages} pages of "
                f"{self.page_size} tokens"
            )
        firsts = host_indices[:: self.page_size].tolist()
        stride, sizes = self.stride, self.sizes
        if len(self.bases) == 2:
            (kb, vb), (ks, vs) = self.bases, sizes
            return [((kb + f * stride, ks), (vb + f * stride, vs)) for f in firsts]
        if len(self.bases) == 1:
            (b,), (sz,) = self.bases, sizes
            return [((b + f * stride, sz),) for f in firsts]
        pairs = tuple(zip(self.bases, sizes, strict=True))
        return [tuple((b + f * stride, sz) for b, sz in pairs) for f in firsts]


def host_buffer_ranges(pool: Any) -> list[tuple[int, int]]:
    """Distinct (ptr, nbytes) ranges of a host pool's KV tensors, for client registration."""
    ranges: list[tuple[int, int]] = []
    for name in ("kv_buffer", "k_buffer", "v_buffer"):
        value: Any = getattr(pool, name, None)
        tensors: list[Any] = list(value) if isinstance(value, (list, tuple)) else [value]
        for t in tensors:
            if t is not None and hasattr(t, "data_ptr") and t.numel() > 0:
                ranges.append((int(t.data_ptr()), int(t.numel() * t.element_size())))
    ranges.sort(key=lambda r: (r[0], -r[1]))  # a buffer before the views that start with it
    merged: list[tuple[int, int]] = []
    for ptr, size in ranges:
        if merged and ptr + size <= merged[-1][0] + merged[-1][1]:
            continue  # a view inside a buffer already listed
        merged.append((ptr, size))
    return merged


def page_format_of(pool: Any, kv_cache_dtype: str | None) -> PageFormat:
    """The key fields a SGLang host pool contributes (:class:`hicache_umbp.store.keys.PageFormat`):
    its layout, page size in tokens, ``storage_format_tag`` and KV dtype.

    SGLang keeps every fp8 KV cache as ``uint8`` in the host pool, so the pool alone cannot
    tell ``fp8_e4m3`` from ``fp8_e5m2``: for a byte pool the server's ``--kv-cache-dtype``
    (``kv_cache_dtype``) completes the dtype, e.g. ``uint8:fp8_e4m3``.
    """
    dtype = str(getattr(pool, "dtype", "")).removeprefix("torch.")
    if dtype == "uint8" and kv_cache_dtype and kv_cache_dtype != "auto":
        dtype = f"{dtype}:{kv_cache_dtype}"
    tag = getattr(pool, "storage_format_tag", None)
    return PageFormat(
        layout=str(getattr(pool, "layout", "")),
        kv_dtype=dtype,
        page_tokens=int(pool.page_size),
        format_tag=str(tag) if tag else "",
    )
