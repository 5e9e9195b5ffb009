"""Byte counts written the way the errors and logs show them."""

from __future__ import annotations

KIB = 1024
MIB = KIB * 1024
GIB = MIB * 1024
TIB = GIB * 1024

_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def fmt_bytes(n: int) -> str:
    """Exact when a unit divides it into fewer than 10000 (``1600 GiB``, ``3 TiB``), else two
    decimals (truncated) of GiB (``74.79 GiB``) or of the largest unit below a GiB."""
    if n == 0:
        return "0"
    for name, unit in _UNITS:
        if unit <= abs(n) and n % unit == 0 and abs(n) // unit < 10000:
            return f"{n // unit} {name}"
    for name, unit in _UNITS[1:]:
        if abs(n) >= unit:
            # Truncated, not rounded: 1599.998 GiB free must not read as 1600.00 GiB.
            return f"{(n * 100 // unit) / 100:.2f} {name}"
    return f"{n} bytes"


def page_size_name(size: int) -> str:
    """``2 MiB`` / ``1 GiB``: the page size in a human sentence."""
    return fmt_bytes(size)


def k8s_hugepage_resource(size: int) -> str:
    """The Kubernetes resource name: ``hugepages-2Mi``, ``hugepages-1Gi``."""
    return "hugepages-" + fmt_bytes(size).replace(" ", "").replace("iB", "i")


def cgroup_size_name(size: int) -> str:
    """The kernel's hugetlb cgroup file infix: ``2MB``, ``1GB``, ``64KB``."""
    if size >= GIB:
        return f"{size // GIB}GB"
    if size >= MIB:
        return f"{size // MIB}MB"
    return f"{size // KIB}KB"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
