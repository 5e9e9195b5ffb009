"""Kubernetes quantities ("200Gi", "1.5T", 1073741824) converted to exact byte integers and back.

The CR accepts the Kubernetes int-or-string quantity syntax so users write what they write in pod
specs; the planner always works in plain integers, because mori reads sizes with ``std::stoull``
(``10Gi`` would be 10 bytes). Conversion is exact (``fractions.Fraction``): a quantity that is not
a whole number of bytes is an error, never rounded silently.
"""

from __future__ import annotations

import re
from fractions import Fraction

BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
DECIMAL_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}

# The Kubernetes quantity grammar (apimachinery resource.Quantity), milli ("m") excluded: a byte
# count is never fractional. The same pattern goes into the CRD so the API server rejects typos.
QUANTITY_PATTERN = (
    r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[kMGTPE]|([eE](\+)?[0-9]+))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


#: The largest byte count a quantity may denote: Kubernetes stores quantities' values as int64
#: (``resource.Quantity.Value()``), and every size here ends up in a pod or a byte-exact env
#: variable. Larger values (``1e400`` passes the quantity grammar) are refused, not overflowed.
MAX_BYTES = 2**63 - 1


class QuantityError(ValueError):
    """A quantity that is not a valid, whole, non-negative number of bytes."""


def parse_bytes(value: int | str, *, field: str = "quantity") -> int:
    """Exact bytes of a Kubernetes quantity; ``field`` names the value in errors.

    >>> parse_bytes("200Gi")
    214748364800
    >>> parse_bytes("1.5Ki")
    1536
    """
    if isinstance(value, bool):
        raise QuantityError(f"{field}: {value!r} is a boolean, not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"{field}: {value} is negative")
        if value > MAX_BYTES:
            raise QuantityError(f"{field}: {value} is more than {MAX_BYTES} bytes (8 EiB)")
        return value
    if not isinstance(value, str):
        raise QuantityError(f"{field}: {value!r} is not a quantity (int or string like '200Gi')")
    text = value.strip()
    match = _QUANTITY_RE.match(text)
    if not match:
        raise QuantityError(
            f"{field}: {value!r} is not a Kubernetes quantity; write e.g. 200Gi, 3Ti, 500G or a "
            f"plain byte count (binary suffixes Ki Mi Gi Ti Pi Ei, decimal k M G T P E)"
        )
    number = Fraction(match.group(2))
    suffix = match.group(6) or ""
    if suffix in BINARY_SUFFIXES:
        scaled = number * BINARY_SUFFIXES[suffix]
    elif suffix in DECIMAL_SUFFIXES:
        scaled = number * DECIMAL_SUFFIXES[suffix]
    else:  # exponent form, e.g. 1e9
        scaled = number * Fraction(10) ** int(suffix[1:].lstrip("+"))
    if scaled > MAX_BYTES:
        raise QuantityError(
            f"{field}: {value!r} is more than {MAX_BYTES} bytes (8 EiB), the largest quantity "
            f"Kubernetes can hold"
        )
    if scaled.denominator != 1:
        raise QuantityError(f"{field}: {value!r} is {float(scaled)} bytes, not a whole number")
    return int(scaled)


def format_bytes(n: int) -> str:
    """The shortest exact Kubernetes quantity for ``n`` bytes (binary suffix when it divides).

    >>> format_bytes(214748364800)
    '200Gi'
    >>> format_bytes(1000)
    '1000'
    """
    if n < 0:
        raise QuantityError(f"{n} is negative")
    if n == 0:
        return "0"
    for suffix, factor in reversed(BINARY_SUFFIXES.items()):
        if n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)
