"""The SSD tier's volume: per-pod PVC, emptyDir or an admin-allowed hostPath, one mount.

Capacity rule: ``S <= V - V * headroomPercent / 100`` where S is the tier per pod and V the
volume size (claim size, emptyDir sizeLimit or the declared hostPath size). Embedded mode splits
S per rank, ``S_r = floor(S / R)``, each rank under ``<mount>/rank-<i>`` (the store appends the
rank directory); standalone mode runs one SSD server on ``<mount>``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from hicache_umbp.contract.paths import SSD_MOUNT, rank_ssd_dir

from ..api.config import AdminPolicy
from ..api.quantity import format_bytes, parse_bytes
from ..api.spec import SGLangHiCacheSpec
from .errors import Problems

SSD_VOLUME = "umbp-ssd"


@dataclass(frozen=True)
class SsdLayout:
    enabled: bool
    capacity: int = 0
    kind: str = ""
    volume_bytes: int | None = None
    mount_path: str = SSD_MOUNT
    pod_volume: dict[str, Any] | None = None
    claim_template: dict[str, Any] | None = None
    ephemeral_bytes: int = 0
    rank_dirs: tuple[str, ...] = ()
    arithmetic: tuple[str, ...] = ()


def host_path_allowed(path: str, prefixes: list[str]) -> bool:
    """Whether ``path`` (normalised, so ``..`` cannot escape) lies under an allowed prefix."""
    norm = posixpath.normpath(path)
    for prefix in prefixes:
        p = posixpath.normpath(prefix)
        if p == "/" or norm == p or norm.startswith(p.rstrip("/") + "/"):
            return True
    return False


def plan_ssd(
    spec: SGLangHiCacheSpec, ranks: int, policy: AdminPolicy, problems: Problems
) -> SsdLayout:
    ssd = spec.l3.ssd
    if not ssd.enabled:
        return SsdLayout(enabled=False)
    if ssd.capacity is None or ssd.volume is None:
        problems.add("spec.l3.ssd", "an enabled SSD tier needs capacity and volume")
        return SsdLayout(enabled=False)
    capacity = parse_bytes(ssd.capacity, field="l3.ssd.capacity")
    vol = ssd.volume
    kinds = [
        k
        for k, v in (
            ("claimTemplate", vol.claim_template),
            ("emptyDir", vol.empty_dir),
            ("hostPath", vol.host_path),
        )
        if v is not None
    ]
    if len(kinds) != 1:
        problems.add(
            "spec.l3.ssd.volume",
            "set exactly one of claimTemplate, emptyDir or "
            f"hostPath (got {', '.join(kinds) or 'none'})",
        )
        return SsdLayout(enabled=False)
    kind = kinds[0]
    lines: list[str] = []
    pod_volume: dict[str, Any] | None = None
    claim: dict[str, Any] | None = None
    size: int | None = None
    ephemeral = 0
    if vol.claim_template is not None:
        size = parse_bytes(vol.claim_template.size, field="claimTemplate.size")
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": format_bytes(size)}},
        }
        if vol.claim_template.storage_class_name:
            claim_spec["storageClassName"] = vol.claim_template.storage_class_name
        claim = {"metadata": {"name": SSD_VOLUME}, "spec": claim_spec}
    elif vol.empty_dir is not None:
        size = parse_bytes(vol.empty_dir.size_limit, field="emptyDir.sizeLimit")
        ephemeral = size
        pod_volume = {"name": SSD_VOLUME, "emptyDir": {"sizeLimit": format_bytes(size)}}
    elif vol.host_path is not None:
        path = vol.host_path.path
        if not host_path_allowed(path, policy.allowed_host_path_prefixes):
            allowed = ", ".join(policy.allowed_host_path_prefixes) or "none"
            problems.add(
                "spec.l3.ssd.volume.hostPath.path",
                f"{path!r} is not under a hostPath prefix the admin policy allows "
                f"(allowedHostPathPrefixes: {allowed})",
            )
        if vol.host_path.size is not None:
            size = parse_bytes(vol.host_path.size, field="hostPath.size")
        pod_volume = {
            "name": SSD_VOLUME,
            "hostPath": {"path": posixpath.normpath(path), "type": "DirectoryOrCreate"},
        }
    if size is not None:
        headroom = size * ssd.headroom_percent // 100
        usable = size - headroom
        lines.append(
            f"SSD volume {size} B - {ssd.headroom_percent}% headroom {headroom} B = "
            f"{usable} B usable; tier {capacity} B"
        )
        if capacity > usable:
            problems.add(
                "spec.l3.ssd.capacity",
                f"{ssd.capacity} ({capacity} B) does not fit the {kind} volume: "
                f"{size} B - {ssd.headroom_percent}% headroom ({headroom} B) = "
                f"{usable} B",
            )
    standalone = spec.l3.mode == "standalone"
    if not standalone:
        per_rank = capacity // ranks
        if per_rank <= 0:
            problems.add(
                "spec.l3.ssd.capacity", f"{capacity} B / {ranks} ranks leaves 0 B per rank"
            )
        lines.append(f"SSD per rank = {capacity} B / {ranks} ranks = {per_rank} B")
        dirs = tuple(rank_ssd_dir(SSD_MOUNT, r) for r in range(ranks))
    else:
        dirs = (SSD_MOUNT,)
    return SsdLayout(
        enabled=True,
        capacity=capacity,
        kind=kind,
        volume_bytes=size,
        pod_volume=pod_volume,
        claim_template=claim,
        ephemeral_bytes=ephemeral,
        rank_dirs=dirs,
        arithmetic=tuple(lines),
    )
