"""Strict value parsers of the env contract (:mod:`hicache_umbp.contract.settings`).

Each parser takes the name to blame (an extra-config key or an environment variable) and raises a
``ValueError`` naming it; nothing is ever guessed: ``"false"`` is not true, ``"10Gi"`` is not a
byte count (mori's ``std::stoull`` would read it as 10 bytes).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(name: str, value: Any) -> bool:
    """Strict boolean: true/false, 1/0, yes/no, on/off (any case) or a real bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    raise ValueError(
        f"{name}={value!r} is not a boolean; use one of true/false, 1/0, yes/no, on/off"
    )


def parse_int(name: str, value: Any, *, unit: str = "") -> int:
    """A plain base-10 integer (``bytes`` units reject suffixes such as Gi that mori misreads)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is a boolean, not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        v = value.strip()
        # One optional minus, then ASCII digits ("--1" or "+1" are not plain integers).
        if v.removeprefix("-").isdigit() and v.isascii():
            return int(v)
        if unit == "bytes":
            raise ValueError(
                f"{name}={value!r} is not a plain byte count; write the number of bytes "
                f"(e.g. 10737418240 for 10Gi): mori parses sizes with std::stoull, which "
                + (
                    f"would read {value!r} as {_stoull_prefix(v)} bytes"
                    if v[:1].isdigit()
                    else f"cannot parse {value!r} at all"
                )
            )
    raise ValueError(f"{name}={value!r} is not an integer")


def _stoull_prefix(v: str) -> int:
    digits = ""
    for ch in v:
        if ch not in "0123456789":  # std::stoull reads ASCII digits only
            break
        digits += ch
    return int(digits) if digits else 0


def parse_float(name: str, value: Any) -> float:
    """A finite number. ``json.loads`` accepts the literals ``Infinity`` and ``NaN`` (SGLang's
    extra-config is JSON), so non-finite floats are refused here, not later in arithmetic."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is a boolean, not a number")
    f: float | None = None
    if isinstance(value, (int, float)):
        try:
            f = float(value)
        except OverflowError:
            f = math.inf
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            f = None
    if f is None:
        raise ValueError(f"{name}={value!r} is not a number")
    if not math.isfinite(f):
        raise ValueError(f"{name}={value!r} is not a finite number")
    return f


def _split_list(value: Any) -> list[Any] | None:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str) and "," in value:
        return [p.strip() for p in value.split(",")]
    return None


def parse_per_rank(
    name: str, value: Any, ranks: int, *, unit: str = "", increment: bool = False
) -> tuple[int, ...]:
    """One integer per rank: a list, a comma-separated string, or a scalar for every rank.

    A scalar port auto-increments: ``18500`` for 4 ranks means 18500, 18501, 18502, 18503.
    """
    items = _split_list(value)
    if items is None:
        base = parse_int(name, value, unit=unit)
        return tuple(base + i if increment else base for i in range(ranks))
    if len(items) != ranks:
        which = "shorter" if len(items) < ranks else "longer"
        raise ValueError(
            f"{name} has {len(items)} entries, {which} than the {ranks} local ranks "
            f"(umbp_local_ranks): give exactly one value per rank or a single value"
        )
    return tuple(parse_int(f"{name}[{i}]", v, unit=unit) for i, v in enumerate(items))


def closest(name: str, candidates: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""
