"""The store's check of the caller's pages (``hicache_umbp.store.pages``): the flat fast path for
well-formed batches and the page-by-page checks agree.

Real: the store, the key scheme, the bytes (ctypes buffers). Faked: mori, replaced by the
in-process double that passes the same contract suite as real mori (``support.memory_client``).
"""

from __future__ import annotations

import enum

import numpy as np
from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.store.pages import flatten_pages

from .test_store import PAGE, Pages, hashes, make


def test_well_formed_batches_take_the_flat_path_and_others_are_checked_per_page() -> None:
    """The fast path (one flatten of a well-formed batch) and the per-page checks agree: index
    types that are not plain ints (numpy's, Python's IntEnum) are still accepted, bools and
    wrong shapes refused page by page, and nothing is reported malformed when nothing is."""
    src = Pages(4, 2)
    plain = src.ptrs()
    assert flatten_pages(hashes(4), plain, 2) == (
        [p for page in plain for p, _ in page], [s for page in plain for _, s in page])
    numpyish = [[(np.int64(p), np.int64(sz)) for p, sz in page] for page in plain]
    assert flatten_pages(hashes(4), numpyish, 2) is None  # -> checked page by page
    store, client = make(MHA_PARTS)
    assert store.batch_set(hashes(4), numpyish) == [True] * 4
    assert store.stats().errors == {}
    dst = Pages(4, 2)
    assert store.batch_get(hashes(4), dst.ptrs()) == [True] * 4
    assert all(dst.page_bytes(i) == src.page_bytes(i) for i in range(4))
    assert client.calls["batch_put_from_ptr"] == client.calls["batch_get_into_ptr"] == 1

    class Size(enum.IntEnum):
        PAGE = PAGE

    odd = [list(page) for page in src.ptrs()]
    odd[0][1] = (odd[0][1][0], Size.PAGE)  # an int subclass: accepted through the checks
    odd[1][0] = (True, PAGE)  # a bool pointer: refused
    odd[2] = [*odd[2], (src.base, PAGE)]  # three parts: refused
    assert store.batch_set(hashes(4, "o"), odd) == [True, False, False, True]
    assert store.stats().errors == {"bad_input": 1}
    s = store.stats()
    assert (s.pages_set, s.bytes_set) == (6, 6 * 2 * PAGE)
