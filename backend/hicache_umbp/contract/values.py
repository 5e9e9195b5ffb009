"""Parsing one raw value of a setting (:data:`~.settings.SETTINGS`): type, bounds, choices;
every error names the key or variable it came from."""

from __future__ import annotations

from typing import Any

from .parsing import parse_bool, parse_float, parse_int, parse_per_rank
from .settings import Setting


def _bound(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _check_range(s: Setting, label: str, value: float) -> None:
    if s.minimum is not None and value < s.minimum:
        raise ValueError(f"{label}={value!r} is below the minimum {_bound(s.minimum)}")
    if s.maximum is not None and value > s.maximum:
        why = f" ({s.why_maximum})" if s.why_maximum else ""
        raise ValueError(f"{label}={value!r} is above the maximum {_bound(s.maximum)}{why}")


def parse_value(s: Setting, label: str, raw: Any, ranks: int) -> Any:
    """Parse one raw value of setting ``s``; ``label`` names it in errors (key or env var)."""
    if s.kind == "bool":
        return parse_bool(label, raw)
    if s.kind in ("int", "bytes"):
        v = parse_int(label, raw, unit=s.kind)
        _check_range(s, label, v)
        return v
    if s.kind == "float":
        f = parse_float(label, raw)
        _check_range(s, label, f)
        return f
    if s.kind == "str":
        if not isinstance(raw, str):
            raise ValueError(f"{label}={raw!r} must be a string")
        return raw
    if s.kind == "enum":
        return _parse_enum(s, label, raw)
    unit = "bytes" if s.kind == "rank_bytes" else ""
    values = parse_per_rank(label, raw, ranks, unit=unit, increment=s.kind == "rank_port")
    for i, v in enumerate(values):
        _check_range(s, f"{label}[{i}]", v)
    return values


def _parse_enum(s: Setting, label: str, raw: Any) -> Any:
    allowed = ", ".join(str(c) for c in s.choices)
    if all(isinstance(c, int) for c in s.choices):
        try:
            v: Any = parse_int(label, raw, unit="bytes")
        except ValueError as e:
            raise ValueError(f"{e}; allowed values: {allowed}") from None
    else:
        v = raw.strip() if isinstance(raw, str) else raw
    if v not in s.choices:
        raise ValueError(f"{label}={raw!r} is not allowed; allowed values: {allowed}")
    return v
