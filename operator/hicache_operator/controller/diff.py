"""Idempotent apply, computed client side: what to send so the live object matches the desired one.

The operator owns the fields it renders and nothing else. A live object *matches* its desired
form when every field the operator renders is present with the same value (``covers``);
fields the API server or other controllers add (defaults, ``status``, ``clusterIP``,
``metadata.uid``, ...) are ignored. So a resync with no change sends nothing.

When something differs, the patch is a JSON merge patch (RFC 7386) with the three-way
semantics ``kubectl apply`` used for years: the desired fields, plus ``null`` for every field
the operator set last time (recorded in the ``LAST_APPLIED`` annotation) and no longer renders.
Lists are sent whole (merge patches replace lists), compared element-wise with ``covers`` so
server-side defaults inside containers do not look like drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LAST_APPLIED = "hicache.sglang.ai/last-applied"

Obj = dict[str, Any]


def covers(live: Any, desired: Any) -> bool:
    """True when ``live`` has every field of ``desired`` with an equal value (recursively)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(key in live and covers(live[key], value) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return False
        return all(covers(a, b) for a, b in zip(live, desired, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return live is desired
    if isinstance(desired, (int, float)) and isinstance(live, (int, float)):
        return float(live) == float(desired)
    return bool(live == desired)


def _removed(last: Any, desired: Any, live: Any) -> Any:
    """Merge-patch nulls for fields in ``last`` but not ``desired`` that ``live`` still has."""
    if not isinstance(last, Mapping) or not isinstance(desired, Mapping):
        return None
    out: Obj = {}
    live_map = live if isinstance(live, Mapping) else {}
    for key, old in last.items():
        if key not in live_map:
            continue
        if key not in desired:
            out[key] = None
        else:
            sub = _removed(old, desired[key], live_map[key])
            if sub:
                out[key] = sub
    return out


def _changed(desired: Any, live: Any) -> Any:
    """The part of ``desired`` that ``live`` does not cover (dicts recurse, the rest is whole)."""
    if isinstance(desired, Mapping) and isinstance(live, Mapping):
        out: Obj = {}
        for key, value in desired.items():
            if key not in live:
                out[key] = value
            elif not covers(live[key], value):
                sub = _changed(value, live[key])
                out[key] = value if sub is None else sub
        return out
    return desired


def _merge(into: Obj, extra: Mapping[str, Any]) -> Obj:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def last_applied(live: Mapping[str, Any]) -> Obj:
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def with_last_applied(desired: Obj) -> Obj:
    """``desired`` carrying its own JSON in the ``LAST_APPLIED`` annotation."""
    record = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    out = json.loads(record)
    out.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = record
    return dict(out)


def without_last_applied(obj: Mapping[str, Any]) -> Obj:
    """``obj`` without its ``LAST_APPLIED`` annotation (shallow copies on the way down)."""
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return {**obj, "metadata": meta}


def apply_patch(desired: Obj, live: Mapping[str, Any]) -> Obj | None:
    """The merge patch turning ``live`` into ``desired`` (``None`` when nothing differs).

    ``desired`` must already carry its ``LAST_APPLIED`` annotation (see ``with_last_applied``).
    """
    patch = _changed(desired, live) or {}
    removed = _removed(last_applied(live), desired, live) or {}
    patch = _merge(patch, removed) if removed else patch
    patch.pop("apiVersion", None)
    patch.pop("kind", None)
    return patch or None


def owner_reference(owner: Mapping[str, Any]) -> Obj:
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)
