"""``status.cache``: planned capacity per tier, and the engines' figures only when they moved.

Pure. The block is rebuilt from the plan's tiers and the latest observation
(``cache_observer``); a figure replaces the one already in the status only when it moved by at
least ``min_ratio_change`` (or appeared, or disappeared), so steady traffic, and a resync of
200 unchanged CRs, writes nothing. Between scrapes (other triggers than the resync timer) and
when a window saw no prompt token, the previous figures stay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .sglang_metrics import L3_SPLIT, TIERS, CacheFigures

if TYPE_CHECKING:
    from .observer import CacheObservation

Obj = dict[str, Any]
_DIGITS = 3
_LIVE_KEYS = ("hitRatio", "hostUsedRatio", "l3Writes", "ssd")
#: status.cache.ssd figures that are counts of failures: any change is news.
_ERROR_KEYS = ("readErrors", "writeErrors")


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, _DIGITS)


def _moved(old: Any, new: Any, threshold: float) -> bool:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        if set(old) != set(new):
            return True
        return any(_moved(old[k], v, threshold) for k, v in new.items())
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return abs(float(old) - float(new)) >= max(threshold, 10.0**-_DIGITS)
    return bool(old != new)


def _ssd_block(f: CacheFigures) -> Obj | None:
    """``status.cache.ssd`` from the window's figures; None when the store reported no SSD
    tier of its own (no pages, no capacity, no bytes)."""
    if f.ssd_capacity_pages is None and not any(f.ssd.values()):
        return None
    block: dict[str, int | None] = {
        "readBytesPerSecond": _int(f.ssd_bandwidth("read")),
        "writeBytesPerSecond": _int(f.ssd_bandwidth("write")),
        "pages": _int(f.ssd_pages),
        "capacityPages": _int(f.ssd_capacity_pages),
        "evictions": _int(f.ssd.get("ssd_evictions")),
        "readErrors": _int(f.ssd.get("ssd_read_errors")),
        "writeErrors": _int(f.ssd.get("ssd_write_errors")),
    }
    return {k: v for k, v in block.items() if v is not None}


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _ssd_moved(old: Mapping[str, Any], new: Mapping[str, Any], threshold: float) -> bool:
    """Error counts: any change; the other figures: a change of at least ``threshold`` of
    their size (bandwidth and fill are large numbers that move a little on every scrape)."""
    if set(old) != set(new):
        return True
    for k, v in new.items():
        o = old[k]
        if k in _ERROR_KEYS:
            if o != v:
                return True
        elif abs(v - o) > threshold * max(abs(o), abs(v)):
            return True
    return False


def _keep_or_replace(out: Obj, previous: Mapping[str, Any], key: str, new: Any,
                     threshold: float) -> None:
    old = previous.get(key)
    out[key] = old if old is not None and not _moved(old, new, threshold) else new


def cache_block(tiers: Sequence[Mapping[str, Any]] | None, observation: CacheObservation | None,
                previous: Mapping[str, Any] | None, min_ratio_change: float,
                window_seconds: int | None = None) -> Obj | None:
    """The new ``status.cache`` (None when there is nothing to say). ``window_seconds`` (cache
    metrics on) is there from the first status on, with ``pods: 0`` until a scrape read one:
    the first scrape of a CR whose pods are not ready yet then writes nothing."""
    prev = dict(previous or {})
    out: Obj = {}
    if tiers is not None:
        out["tiers"] = [dict(t) for t in tiers]
    elif "tiers" in prev:
        out["tiers"] = prev["tiers"]
    for key in (*_LIVE_KEYS, "windowSeconds", "pods", "message"):
        if key in prev:
            out[key] = prev[key]
    if window_seconds is not None and tiers is not None:
        out.setdefault("windowSeconds", window_seconds)
        out.setdefault("pods", 0)
    if observation is not None:
        out["windowSeconds"] = observation.window_seconds
        out["pods"] = observation.read
        out.pop("message", None)
        if observation.failed:
            out["message"] = ("could not read the SGLang metrics of pod(s) "
                              f"{', '.join(observation.failed)} (is --enable-metrics on, and "
                              "may the operator reach the engine port?)")
        if observation.read == 0 and not observation.failed:
            for key in _LIVE_KEYS:  # no ready pod: no live figure describes the cache now
                out.pop(key, None)
        figures = observation.figures
        if figures is not None and figures.hit_ratio() is not None:
            ratios = {"total": _r(figures.hit_ratio())}
            ratios.update({t: _r(figures.hit_ratio(t)) for t in TIERS})
            ratios.update({t: _r(figures.hit_ratio(t)) for t in L3_SPLIT
                           if figures.hit_ratio(t) is not None})
            _keep_or_replace(out, prev, "hitRatio", ratios, min_ratio_change)
        ssd = _ssd_block(figures) if figures is not None else None
        if ssd:
            old = prev.get("ssd")
            keep = isinstance(old, Mapping) and not _ssd_moved(old, ssd, min_ratio_change)
            out["ssd"] = old if keep else ssd
        if figures is not None and figures.host_used_ratio is not None:
            _keep_or_replace(out, prev, "hostUsedRatio", _r(figures.host_used_ratio),
                             min_ratio_change)
        if figures is not None and figures.l3_writes in ("Ok", "Failing"):
            out["l3Writes"] = figures.l3_writes
    return out or None
