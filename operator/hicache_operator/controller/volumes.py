"""Growing the SSD tier's per-pod claims: expand them, or refuse the change and say why.

A StatefulSet's ``volumeClaimTemplates`` only shape claims it has not made yet, so a larger
``claimTemplate.size`` leaves every existing claim at the old size, and the launcher's
free-space check then fails in each pod (CrashLoopBackOff). The operator therefore expands the
existing claims itself (a PATCH of ``spec.resources.requests.storage``, which the API server
accepts only when the claim's StorageClass has ``allowVolumeExpansion: true``), and otherwise
refuses the whole spec change (``SpecValid=False``, reason ``VolumeExpansionRefused``) so
nothing of it is applied until the size is reverted or the claims are dealt with. Shrinking is
never needed: a larger existing claim serves a smaller tier.

Pure: the controller reads the claims and StorageClasses and applies the patches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.quantity import QuantityError, format_bytes, parse_bytes

SIZE_FIELD = "spec.l3.ssd.volume.claimTemplate.size"
#: The field the refusal names when the tier spans several drives.
SIZES_FIELD = "spec.l3.ssd.volumes"


DELETE_VOLUMES_FIELD = "deleteWithResource"


def delete_volumes_with_cr(body: Mapping[str, Any]) -> bool:
    """The CR asks for its SSD claims to go with it: ``deleteWithResource`` on the claim
    template of the one ``volume`` or of any drive in ``volumes`` (one policy covers the
    StatefulSet's claims, as the builder renders it)."""
    ssd = ((body.get("spec") or {}).get("l3") or {}).get("ssd") or {}
    drives = [ssd.get("volume") or {}, *(ssd.get("volumes") or [])]
    return any(bool(((d or {}).get("claimTemplate") or {}).get(DELETE_VOLUMES_FIELD, False))
               for d in drives)


def claim_request(pvc: Mapping[str, Any]) -> int | None:
    """Requested storage of a claim in bytes (None when absent or unparsable)."""
    value = (((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(
        "storage")
    if value is None:
        return None
    try:
        return parse_bytes(value, field="storage")
    except QuantityError:
        return None


def template_of(claim: str, statefulset: str, templates: Sequence[str]) -> str | None:
    """The claim template a StatefulSet's claim was made from: ``<template>-<sts>-<ordinal>``
    (``umbp-ssd-x-0`` is drive 0's, ``umbp-ssd-1-x-0`` drive 1's)."""
    for t in templates:
        if re.fullmatch(rf"{re.escape(t)}-{re.escape(statefulset)}-\d+", claim):
            return t
    return None


def claims_to_grow(sizes: Mapping[str, int], statefulset: str,
                   pvcs: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int]]:
    """The SSD claims smaller than their template's planned size (``sizes``: template name ->
    bytes), each with that size."""
    out = []
    for pvc in pvcs:
        name = str((pvc.get("metadata") or {}).get("name", ""))
        template = template_of(name, statefulset, list(sizes))
        size = claim_request(pvc)
        if template is not None and size is not None and size < sizes[template]:
            out.append((pvc, sizes[template]))
    return out


def storage_class_of(pvc: Mapping[str, Any]) -> str:
    return str((pvc.get("spec") or {}).get("storageClassName") or "")


@dataclass(frozen=True)
class Expansion:
    patches: dict[str, dict[str, Any]] = field(default_factory=dict)  # claim -> merge patch
    refusal: str | None = None  # why the size change cannot be applied


def plan_expansion(small: Sequence[tuple[Mapping[str, Any], int]],
                   classes: Mapping[str, Mapping[str, Any] | None]) -> Expansion:
    """Patches growing ``small`` claims to their planned size, or a refusal naming the claims
    whose StorageClass (``classes``: name -> object, None when it does not exist) cannot."""
    blocked = []
    for pvc, _size in small:
        name = (pvc.get("metadata") or {}).get("name", "?")
        class_name = storage_class_of(pvc)
        sc = classes.get(class_name) if class_name else None
        if sc is None or sc.get("allowVolumeExpansion") is not True:
            why = ("has no StorageClass" if not class_name else
                   f"StorageClass {class_name} does not exist" if sc is None else
                   f"StorageClass {class_name} does not allow volume expansion "
                   f"(allowVolumeExpansion is not true)")
            blocked.append(f"claim {name} ({format_bytes(claim_request(pvc) or 0)}) {why}")
    if blocked:
        sizes = " / ".join(sorted({format_bytes(size) for _pvc, size in small}))
        return Expansion(refusal=(
            f"{sizes} cannot be applied: the existing SSD claims cannot "
            f"grow: {'; '.join(blocked)}. Nothing of this spec change was applied (the pods' "
            f"free-space check would fail on the old volumes). Revert the size, use a "
            f"StorageClass that allows expansion, or delete the claims (their cache is lost) "
            f"so the StatefulSet makes new ones"))
    return Expansion(patches={
        (pvc.get("metadata") or {})["name"]: {"spec": {"resources": {"requests": {
            "storage": format_bytes(size)}}}} for pvc, size in small})
