"""Byte units and the one human form of a byte count, for the backend and the operator alike.

Sizes cross the pod contract as plain byte integers (mori reads them with ``std::stoull``); these
helpers only name units and print counts for people (errors, logs, plan summaries). A Kubernetes
quantity (``200Gi`` in a manifest) is another format, written by the operator's
``api.quantity.format_bytes``.
"""

from __future__ import annotations

KIB = 1024
MIB = KIB * 1024
GIB = MIB * 1024
TIB = GIB * 1024
#: SGLang's ``--hicache-size`` counts decimal gigabytes (10^9 bytes).
GB = 10**9
#: The base page of the kernel on x86_64 (the 4 KiB backing of a pool without hugepages).
PAGE_4K = 4 * KIB

_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def fmt_bytes(n: int) -> str:
    """Exact when a unit divides it into fewer than 10000 (``1600 GiB``, ``3 TiB``), else two
    decimals (truncated) of GiB (``74.79 GiB``), of the largest unit below a GiB, or of TiB from
    10000 TiB on. Integer arithmetic only: any int prints, however large."""
    if n == 0:
        return "0"
    sign, m = ("-" if n < 0 else ""), abs(n)
    for name, unit in _UNITS:
        if unit <= m and m % unit == 0 and m // unit < 10000:
            return f"{sign}{m // unit} {name}"
    for name, unit in _UNITS:
        if m >= unit and (name != "TiB" or m >= 10000 * TIB):
            # Truncated, not rounded: 1599.998 GiB free must not read as 1600.00 GiB.
            hundredths = m * 100 // unit
            return f"{sign}{hundredths // 100}.{hundredths % 100:02d} {name}"
    return f"{n} bytes"


def page_size_name(size: int) -> str:
    """``2 MiB`` / ``1 GiB``: the page size in a human sentence."""
    return fmt_bytes(size)


def page_label(size: int) -> str:
    """``2MiB`` / ``4KiB``: a page size inside a word (``mmap/2MiB``)."""
    return fmt_bytes(size).replace(" ", "")


def k8s_hugepage_resource(size: int) -> str:
    """The Kubernetes resource name: ``hugepages-2Mi``, ``hugepages-1Gi``."""
    return "hugepages-" + page_label(size).replace("iB", "i")


def cgroup_size_name(size: int) -> str:
    """The kernel's hugetlb cgroup file infix: ``2MB``, ``1GB``, ``64KB``."""
    if size >= GIB:
        return f"{size // GIB}GB"
    if size >= MIB:
        return f"{size // MIB}MB"
    return f"{size // KIB}KB"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (``multiple`` <= 1 returns ``n``)."""
    if multiple <= 1:
        return n
    return ceil_div(n, multiple) * multiple
