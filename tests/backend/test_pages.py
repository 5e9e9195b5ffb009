"""PointerPlan (hicache_umbp.sglang.host_pool) against page-meta functions with SGLang's semantics.

The functions below reproduce SGLang 0.5.23's ``get_page_buffer_meta`` pointer math for MHA
page_first (K then V, one buffer) and a page order that is not affine; the ``sglang`` tier checks
the plan against the real host pools. Index arrays are numpy (the plan never imports torch).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hicache_umbp.sglang.host_pool import PointerPlan, host_buffer_ranges

PAGE, PAGES, LAYERS, HEADS, DIM, ITEM = 4, 10, 2, 2, 8, 2
BASE = 1 << 30
TOKEN = LAYERS * HEADS * DIM * ITEM  # bytes per token per part, page_first
V_OFFSET = PAGE * PAGES * TOKEN


def mha_meta(indices: np.ndarray) -> tuple[list[int], list[int]]:
    ptrs: list[int] = []
    for i in range(0, len(indices), PAGE):
        k = BASE + int(indices[i]) * TOKEN
        ptrs += [k, k + V_OFFSET]
    return ptrs, [TOKEN * PAGE] * len(ptrs)


def as_indices(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def pool() -> SimpleNamespace:
    return SimpleNamespace(page_size=PAGE, size=PAGE * PAGES)


def test_plan_matches_the_meta_function_on_every_page() -> None:
    plan = PointerPlan.derive(pool(), mha_meta, 2, as_indices)
    assert plan is not None and plan.stride == TOKEN and plan.sizes == (TOKEN * PAGE,) * 2
    idx = as_indices([t for p in (7, 0, 9, 3) for t in range(p * PAGE, (p + 1) * PAGE)])
    got = [pair for page in plan.pointers(idx, 4) for pair in page]
    ptrs, sizes = mha_meta(idx)
    assert got == list(zip(ptrs, sizes, strict=True))


def test_non_affine_layouts_get_no_plan() -> None:
    def swapped(indices: np.ndarray) -> tuple[list[int], list[int]]:
        firsts = [int(indices[i]) // PAGE for i in range(0, len(indices), PAGE)]
        pages = [p ^ 1 if p ^ 1 < PAGES else p for p in firsts]
        return mha_meta(as_indices([t for p in pages for t in range(p * PAGE, (p + 1) * PAGE)]))

    assert PointerPlan.derive(pool(), swapped, 2, as_indices) is None


def test_wrong_part_count_and_tiny_pools_get_no_plan() -> None:
    assert PointerPlan.derive(pool(), mha_meta, 1, as_indices) is None
    assert PointerPlan.derive(SimpleNamespace(page_size=PAGE, size=2 * PAGE), mha_meta, 2,
                              as_indices) is None

    def broken(indices: np.ndarray) -> tuple[list[int], list[int]]:
        raise RuntimeError("no physical buffer")

    assert PointerPlan.derive(pool(), broken, 2, as_indices) is None


def test_index_count_must_match_the_pages() -> None:
    plan = PointerPlan.derive(pool(), mha_meta, 2, as_indices)
    assert plan is not None
    with pytest.raises(ValueError, match="host indices for 2 pages"):
        plan.pointers(as_indices(list(range(PAGE))), 2)


def test_host_buffer_ranges_lists_each_buffer_once() -> None:
    whole = np.zeros(64, dtype=np.uint8)

    class T:
        def __init__(self, arr: np.ndarray) -> None:
            self.arr = arr

        def data_ptr(self) -> int:
            return int(self.arr.ctypes.data)

        def numel(self) -> int:
            return int(self.arr.size)

        def element_size(self) -> int:
            return int(self.arr.itemsize)

    host = SimpleNamespace(kv_buffer=T(whole), k_buffer=T(whole[:32]), v_buffer=None)
    assert host_buffer_ranges(host) == [(int(whole.ctypes.data), 64)]
