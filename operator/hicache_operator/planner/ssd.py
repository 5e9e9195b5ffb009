"""The SSD tier's drives: per-pod PVCs, emptyDirs or admin-allowed hostPaths, one mount each.

Engines (``spec.l3.ssd.engine``):

* ``hicache`` (the backend's ``hicache_umbp.disk``): the engine container mounts every drive,
  drive 0 at ``/mnt/umbp-ssd`` and drive i at ``/mnt/umbp-ssd-<i>`` (volumes and per-pod claims
  ``umbp-ssd``, ``umbp-ssd-<i>``, so a single-drive pod keeps its claim's name). Every rank of
  the pod opens all drives (one copy per pod, pages striped by key), in embedded and standalone
  mode alike: no umbp-ssd sidecar.
* ``mori`` (mori 1.2.4's SSD node): one volume; embedded, rank i under ``<mount>/rank-<i>`` in the
  engine; standalone, the umbp-ssd sidecar on ``<mount>``.

Capacity rule, per drive i of M: ``floor(S / M) <= V_i - floor(V_i * headroomPercent / 100)``
where S is the tier per pod and V_i the drive's volume size (claim size, emptyDir sizeLimit or the
declared hostPath size); the store splits S evenly over the drives. The contract's per-rank
capacity is ``S_r = floor(S / R)`` (the hicache engine holds ``R * S_r`` for the pod; the mori
sidecar holds S and takes no per-rank value).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from hicache_umbp.contract.paths import SSD_MOUNT, rank_ssd_dir

from ..api.config import AdminPolicy
from ..api.l3 import MORI_ONE_VOLUME_MESSAGE, SsdVolume
from ..api.quantity import format_bytes, parse_bytes
from ..api.spec import SGLangHiCacheSpec
from .errors import Problems

SSD_VOLUME = "umbp-ssd"


def drive_volume_name(i: int) -> str:
    """Volume (and claim template) of drive ``i``: ``umbp-ssd``, ``umbp-ssd-1``, ..."""
    return SSD_VOLUME if i == 0 else f"{SSD_VOLUME}-{i}"


def drive_mount(i: int) -> str:
    """Mount path of drive ``i``: ``/mnt/umbp-ssd``, ``/mnt/umbp-ssd-1``, ..."""
    return SSD_MOUNT if i == 0 else f"{SSD_MOUNT}-{i}"


@dataclass(frozen=True)
class SsdDrive:
    """One drive volume of the tier."""

    name: str  # pod volume / claim template name
    mount_path: str
    kind: str  # claimTemplate | emptyDir | hostPath
    volume_bytes: int | None  # None: a hostPath without a declared size
    pod_volume: dict[str, Any] | None = None  # emptyDir / hostPath
    claim_template: dict[str, Any] | None = None  # claimTemplate
    ephemeral_bytes: int = 0


@dataclass(frozen=True)
class SsdLayout:
    enabled: bool
    engine: str = "hicache"
    capacity: int = 0
    drives: tuple[SsdDrive, ...] = ()
    #: the directories the store opens: every drive (hicache), the rank directories (mori,
    #: embedded) or the sidecar's mount (mori, standalone)
    dirs: tuple[str, ...] = ()
    arithmetic: tuple[str, ...] = field(default=())

    @property
    def ours(self) -> bool:
        """The hicache engine: the engine container holds every drive, in either mode."""
        return self.enabled and self.engine == "hicache"

    @property
    def kind(self) -> str:
        return ", ".join(sorted({d.kind for d in self.drives}))

    @property
    def volume_bytes(self) -> int | None:
        """The drives' total size, None when one has no declared size."""
        sizes = [d.volume_bytes for d in self.drives]
        return None if not sizes or None in sizes else sum(s or 0 for s in sizes)

    @property
    def mount_path(self) -> str:
        return self.drives[0].mount_path if self.drives else SSD_MOUNT

    @property
    def ephemeral_bytes(self) -> int:
        return sum(d.ephemeral_bytes for d in self.drives)

    @property
    def pod_volumes(self) -> list[dict[str, Any]]:
        return [dict(d.pod_volume) for d in self.drives if d.pod_volume is not None]

    @property
    def claim_templates(self) -> list[dict[str, Any]]:
        return [dict(d.claim_template) for d in self.drives if d.claim_template is not None]

    @property
    def claim_sizes(self) -> dict[str, int]:
        """Claim template name -> requested bytes, for the claims the StatefulSet makes."""
        return {d.name: d.volume_bytes for d in self.drives
                if d.claim_template is not None and d.volume_bytes is not None}

    def mounts(self) -> list[dict[str, Any]]:
        return [{"name": d.name, "mountPath": d.mount_path} for d in self.drives]


def host_path_allowed(path: str, prefixes: list[str]) -> bool:
    """Whether ``path`` (normalised, so ``..`` cannot escape) lies under an allowed prefix."""
    norm = posixpath.normpath(path)
    for prefix in prefixes:
        p = posixpath.normpath(prefix)
        if p == "/" or norm == p or norm.startswith(p.rstrip("/") + "/"):
            return True
    return False


def _drive(i: int, at: str, vol: SsdVolume, policy: AdminPolicy,
           problems: Problems) -> SsdDrive | None:
    kinds = [k for k, v in (("claimTemplate", vol.claim_template), ("emptyDir", vol.empty_dir),
                            ("hostPath", vol.host_path)) if v is not None]
    if len(kinds) != 1:
        problems.add(at, "set exactly one of claimTemplate, emptyDir or "
                     f"hostPath (got {', '.join(kinds) or 'none'})")
        return None
    name, mount = drive_volume_name(i), drive_mount(i)
    if vol.claim_template is not None:
        size = parse_bytes(vol.claim_template.size, field="claimTemplate.size")
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": format_bytes(size)}},
        }
        if vol.claim_template.storage_class_name:
            claim_spec["storageClassName"] = vol.claim_template.storage_class_name
        return SsdDrive(name, mount, "claimTemplate", size,
                        claim_template={"metadata": {"name": name}, "spec": claim_spec})
    if vol.empty_dir is not None:
        size = parse_bytes(vol.empty_dir.size_limit, field="emptyDir.sizeLimit")
        return SsdDrive(name, mount, "emptyDir", size, ephemeral_bytes=size, pod_volume={
            "name": name, "emptyDir": {"sizeLimit": format_bytes(size)}})
    assert vol.host_path is not None
    path = vol.host_path.path
    if not host_path_allowed(path, policy.allowed_host_path_prefixes):
        allowed = ", ".join(policy.allowed_host_path_prefixes) or "none"
        problems.add(
            f"{at}.hostPath.path",
            f"{path!r} is not under a hostPath prefix the admin policy allows "
            f"(allowedHostPathPrefixes: {allowed})",
        )
    hp_size = (parse_bytes(vol.host_path.size, field="hostPath.size")
               if vol.host_path.size is not None else None)
    return SsdDrive(name, mount, "hostPath", hp_size, pod_volume={
        "name": name,
        "hostPath": {"path": posixpath.normpath(path), "type": "DirectoryOrCreate"}})


def plan_ssd(
    spec: SGLangHiCacheSpec, ranks: int, policy: AdminPolicy, problems: Problems
) -> SsdLayout:
    ssd = spec.l3.ssd
    if not ssd.enabled:
        return SsdLayout(enabled=False, engine=ssd.engine)
    vols = ssd.drive_volumes()
    if ssd.capacity is None or not vols:
        problems.add("spec.l3.ssd", "an enabled SSD tier needs capacity and volume (or volumes)")
        return SsdLayout(enabled=False, engine=ssd.engine)
    if ssd.volume is not None and ssd.volumes is not None:
        problems.add("spec.l3.ssd", "set exactly one of volume or volumes")
        return SsdLayout(enabled=False, engine=ssd.engine)
    if ssd.engine == "mori" and len(vols) > 1:
        problems.add("spec.l3.ssd.volumes", MORI_ONE_VOLUME_MESSAGE)
        return SsdLayout(enabled=False, engine=ssd.engine)
    capacity = parse_bytes(ssd.capacity, field="l3.ssd.capacity")
    drives: list[SsdDrive] = []
    for i, vol in enumerate(vols):
        at = "spec.l3.ssd.volume" if ssd.volume is not None else f"spec.l3.ssd.volumes[{i}]"
        d = _drive(i, at, vol, policy, problems)
        if d is None:
            return SsdLayout(enabled=False, engine=ssd.engine)
        drives.append(d)
    lines: list[str] = []
    share = capacity // len(drives)
    for i, d in enumerate(drives):
        if d.volume_bytes is None:
            continue
        size = d.volume_bytes
        headroom = size * ssd.headroom_percent // 100
        usable = size - headroom
        what = (f"tier {capacity} B" if len(drives) == 1 else
                f"drive {i}: tier {capacity} B / {len(drives)} drives = {share} B")
        lines.append(f"SSD volume {size} B - {ssd.headroom_percent}% headroom {headroom} B = "
                     f"{usable} B usable; {what}")
        if share > usable:
            where = ("the" if len(drives) == 1 else f"drive {i}'s")
            split = "" if len(drives) == 1 else f" / {len(drives)} drives = {share} B"
            problems.add(
                "spec.l3.ssd.capacity",
                f"{ssd.capacity} ({capacity} B){split} does not fit {where} {d.kind} volume: "
                f"{size} B - {ssd.headroom_percent}% headroom ({headroom} B) = {usable} B",
            )
    standalone = spec.l3.mode == "standalone"
    if ssd.engine == "hicache" or not standalone:
        per_rank = capacity // ranks
        if per_rank <= 0:
            problems.add(
                "spec.l3.ssd.capacity", f"{capacity} B / {ranks} ranks leaves 0 B per rank"
            )
        lines.append(f"SSD per rank = {capacity} B / {ranks} ranks = {per_rank} B"
                     + (" (the pod's ranks share one copy: the store holds their sum)"
                        if ssd.engine == "hicache" else ""))
    if ssd.engine == "hicache":
        dirs = tuple(d.mount_path for d in drives)
    elif not standalone:
        dirs = tuple(rank_ssd_dir(SSD_MOUNT, r) for r in range(ranks))
    else:
        dirs = (SSD_MOUNT,)
    return SsdLayout(
        enabled=True,
        engine=ssd.engine,
        capacity=capacity,
        drives=tuple(drives),
        dirs=dirs,
        arithmetic=tuple(lines),
    )
