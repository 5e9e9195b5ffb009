"""The API server's rule for Pod updates (core/v1 ``ValidatePodUpdate``): a running pod's spec
is immutable except a few fields, so an in-place update is only what a real cluster allows.

Mutable: ``spec.containers[*].image``, ``spec.initContainers[*].image``,
``spec.activeDeadlineSeconds``, ``spec.tolerations`` (additions only) and
``spec.terminationGracePeriodSeconds``; labels, annotations and owner references are metadata
(always mutable); ``status`` has its own subresource. Anything else (env, args, resources,
volumes, probes, containers added or removed) is refused with 422 and the server's message.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Cause = tuple[str, str]
FORBIDDEN = ("Forbidden: pod updates may not change fields other than "
             "`spec.containers[*].image`,`spec.initContainers[*].image`,"
             "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
             "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it "
             "was previously negative)")


def _masked(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(spec))
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in out.get(key) or []:
            if isinstance(c, dict) and key != "ephemeralContainers":
                c.pop("image", None)
    for key in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        out.pop(key, None)
    return out


def pod_update_causes(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """Why the server refuses turning ``old`` into ``new`` (empty: it accepts)."""
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    causes: list[Cause] = []
    if _masked(new_spec) != _masked(old_spec):
        causes.append(("spec", FORBIDDEN))
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        causes.append(("spec.tolerations", FORBIDDEN))
    for key in ("containers", "initContainers"):
        for i, c in enumerate(new_spec.get(key) or []):
            if isinstance(c, dict) and not c.get("image"):
                causes.append((f"spec.{key}[{i}].image", "Required value"))
    return causes
