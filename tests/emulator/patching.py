"""Patch semantics of the Kubernetes API, on plain JSON-like dicts.

- JSON merge patch (RFC 7386, ``application/merge-patch+json``): dicts merge, ``null`` deletes,
  everything else (lists included) replaces.
- JSON patch (RFC 6902, ``application/json-patch+json``): via the ``jsonpatch`` package; a failed
  ``test`` op or a bad path is a 422, as on a real API server.
- Strategic merge patch (``application/strategic-merge-patch+json``) is approximated by a merge
  patch: lists are replaced, not merged by their patch-merge keys (a documented emulator gap).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class PatchError(ValueError):
    """The patch cannot be applied (maps to HTTP 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """Return ``target`` with the RFC 7386 merge ``patch`` applied (inputs are not mutated)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: Any) -> dict[str, Any]:
    """Apply RFC 6902 ``ops`` to a copy of ``target``."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    try:
        result = jsonpatch.apply_patch(target, ops, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchError(f"the JSON patch cannot be applied: {exc}") from exc
    if not isinstance(result, dict):
        raise PatchError("the JSON patch must leave an object at the root")
    return result


def apply_patch(target: dict[str, Any], content_type: str, patch: Any) -> dict[str, Any]:
    """Dispatch on the request's Content-Type the way the API server does."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == JSON_PATCH:
        return json_patch(target, patch)
    if kind in (MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH):
        if not isinstance(patch, dict):
            raise PatchError(f"a {kind} body must be a JSON object")
        result = merge_patch(target, patch)
        assert isinstance(result, dict)
        return result
    raise PatchError(
        f"unsupported patch Content-Type {content_type!r}; allowed: "
        f"{MERGE_PATCH}, {JSON_PATCH}, {STRATEGIC_MERGE_PATCH}, {APPLY_PATCH}"
    )
