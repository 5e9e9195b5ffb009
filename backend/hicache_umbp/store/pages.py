"""Validation of the pages a caller hands the store: a hash that is a string and exactly the
key scheme's number of integer (ptr, size) parts. Malformed pages are refused one by one (the
store reports them ``False``), never raised into SGLang's threads.
"""

from __future__ import annotations

import operator


def is_int(value: object) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def page_pointers(
    page_hash: object, page: object, nparts: int
) -> tuple[list[int], list[int]] | None:
    """The page's pointers and sizes, or None when the page is malformed."""
    if type(page_hash) is not str:
        return None
    try:
        if len(page) != nparts:  # type: ignore[arg-type]
            return None
        ptrs: list[int] = []
        sizes: list[int] = []
        for ptr, size in page:  # type: ignore[attr-defined]
            if isinstance(ptr, bool) or isinstance(size, bool):
                return None
            ptrs.append(operator.index(ptr))
            sizes.append(operator.index(size))
    except (TypeError, ValueError):
        return None
    return ptrs, sizes


def flatten_pages(
    hashes: object, parts: object, nparts: int
) -> tuple[list[int], list[int]] | None:
    """Every page's pointers and sizes, flat and page-major, when *every* page is well formed
    (a ``str`` hash, exactly ``nparts`` pairs of plain ``int``); None otherwise, and the caller
    checks page by page with :func:`page_pointers`.

    The fast path for what SGLang's adapter hands the store (the pointer plan makes plain
    ints): a few list passes per batch instead of a Python call per page.
    """
    try:
        if not all(type(h) is str for h in hashes):  # type: ignore[attr-defined]
            return None
        pairs = [pair for page in parts for pair in page]  # type: ignore[attr-defined]
        if len(pairs) != nparts * len(hashes) or not all(  # type: ignore[arg-type]
            len(page) == nparts for page in parts  # type: ignore[attr-defined]
        ):
            return None
        ptrs = [p for p, _ in pairs]
        sizes = [s for _, s in pairs]
    except (TypeError, ValueError):
        return None
    if all(type(p) is int for p in ptrs) and all(type(s) is int for s in sizes):
        return ptrs, sizes
    return None
