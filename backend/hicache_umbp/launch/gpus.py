"""Which GPUs this container sees, in the order HIP numbers them, and each GPU's NUMA node.

The AMD device plugin gives a container its GPUs as ``/dev/dri/renderD*`` nodes (plus
``/dev/kfd``). ROCr numbers GPU agents in KFD topology order
(``/sys/class/kfd/kfd/topology/nodes/<n>``, GPU nodes have a non-zero ``gpu_id``), keeping those
whose render node the container can open; ``ROCR_VISIBLE_DEVICES`` then filters that list (indices
or ``GPU-<unique_id>`` UUIDs), and ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``, which HIP
also honours) indexes into what is left. Rank *i* uses logical GPU *i*.

Each GPU's PCI address comes from its KFD node (``domain`` and ``location_id`` =
bus << 8 | device << 3 | function) or, without KFD topology, from the render node's sysfs
``device`` link. A partitioned GPU (CPX: several logical devices on one physical GPU) has several
render nodes and KFD nodes with the same PCI address. The NUMA node is
``/sys/bus/pci/devices/<BDF>/numa_node``; ``-1`` means the firmware did not say.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import LaunchError
from .noderoot import NodeRoot

log = logging.getLogger("hicache_umbp.launch")

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
DRI_DIR = "/dev/dri"
_RENDER_RE = re.compile(r"^renderD(\d+)$")
_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Filters applied in this order; HIP reads CUDA_VISIBLE_DEVICES only when its own is unset.
VISIBILITY_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Gpu:
    """One logical GPU as a process in this container sees it."""

    index: int
    render_node: str
    bdf: str
    numa_node: int
    partition: int
    uuid: str

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "render_node": self.render_node,
            "bdf": self.bdf,
            "numa_node": self.numa_node,
            "partition": self.partition,
            "uuid": self.uuid,
        }


@dataclass(frozen=True)
class GpuProbe:
    gpus: tuple[Gpu, ...]
    source: str
    filters: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def physical_count(self) -> int:
        return len({g.bdf for g in self.gpus})


@dataclass(frozen=True)
class _Candidate:
    minor: int
    bdf: str
    uuid: str


def _render_minors(root: NodeRoot) -> list[int]:
    minors = []
    for name in root.listdir(DRI_DIR):
        m = _RENDER_RE.match(name)
        if m:
            minors.append(int(m.group(1)))
    return sorted(minors)


def _properties(text: str) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                props[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return props


def _bdf_from_location(domain: int, location_id: int) -> str:
    bus, dev, fn = location_id >> 8, (location_id >> 3) & 0x1F, location_id & 0x7
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def _kfd_candidates(root: NodeRoot, visible_minors: set[int]) -> list[_Candidate]:
    nodes = sorted((n for n in root.listdir(KFD_NODES) if n.isdigit()), key=int)
    out = []
    for n in nodes:
        if not root.read_int(f"{KFD_NODES}/{n}/gpu_id"):
            continue  # CPU node
        text = root.read_text(f"{KFD_NODES}/{n}/properties") or ""
        props = _properties(text)
        minor = props.get("drm_render_minor")
        if minor is None or minor not in visible_minors:
            continue  # a GPU of the node this container was not given
        bdf = _bdf_from_location(props.get("domain", 0), props.get("location_id", 0))
        uid = props.get("unique_id", 0)
        out.append(_Candidate(minor=minor, bdf=bdf, uuid=f"GPU-{uid:016x}" if uid else ""))
    return out


def _drm_candidates(root: NodeRoot, minors: list[int]) -> list[_Candidate]:
    out = []
    for minor in minors:
        node = f"renderD{minor}"
        target = root.realpath(f"/sys/class/drm/{node}/device")
        bdf = target.rsplit("/", 1)[-1]
        if not _BDF_RE.match(bdf):
            raise LaunchError(
                "GpuDiscoveryFailed",
                f"cannot find the PCI address of /dev/dri/{node}: /sys/class/drm/{node}/device "
                f"resolves to {target!r}, not a PCI device, and there is no KFD topology "
                f"({KFD_NODES}) to read it from",
            )
        out.append(_Candidate(minor=minor, bdf=bdf, uuid=""))
    return out


def _parse_filter(var: str, value: str, current: list[_Candidate]) -> list[_Candidate]:
    chosen: list[_Candidate] = []
    allowed = f"indices 0..{len(current) - 1}" if current else "no devices (none left)"
    for raw in value.split(","):
        item = raw.strip()
        if item.isdigit() and int(item) < len(current):
            pick = current[int(item)]
        elif item.upper().startswith("GPU-") and var == "ROCR_VISIBLE_DEVICES":
            matches = [c for c in current if c.uuid and c.uuid.lower() == item.lower()]
            if not matches:
                uuids = ", ".join(c.uuid for c in current if c.uuid) or "none known"
                raise LaunchError(
                    "GpuDiscoveryFailed",
                    f"{var}={value!r}: no visible GPU has UUID {item!r}; known UUIDs: {uuids}",
                )
            pick = matches[0]
        else:
            raise LaunchError(
                "GpuDiscoveryFailed",
                f"{var}={value!r}: entry {item!r} is not a visible GPU; allowed: {allowed}"
                + (" or GPU-<uuid>" if var == "ROCR_VISIBLE_DEVICES" else ""),
            )
        if pick in chosen:
            raise LaunchError("GpuDiscoveryFailed", f"{var}={value!r} lists {item!r} twice")
        chosen.append(pick)
    return chosen


def probe_gpus(root: NodeRoot, env: Mapping[str, str]) -> GpuProbe:
    """The logical GPUs of this container in HIP order, each with its PCI address and NUMA node."""
    minors = _render_minors(root)
    if not minors:
        raise LaunchError(
            "GpuDiscoveryFailed",
            f"no GPU render nodes in {DRI_DIR} (expected renderD128, ...): the pod has no "
            f"amd.com/gpu resources, or the device plugin did not mount them",
        )
    kfd = _kfd_candidates(root, set(minors))
    if kfd:
        candidates, source = kfd, "KFD topology"
    else:
        candidates, source = _drm_candidates(root, minors), "render nodes"
    filters: list[str] = []
    for var in VISIBILITY_VARS:
        value = env.get(var, "").strip()
        if not value:
            continue
        if var == "CUDA_VISIBLE_DEVICES" and env.get("HIP_VISIBLE_DEVICES", "").strip():
            continue  # HIP prefers its own variable
        candidates = _parse_filter(var, value, candidates)
        filters.append(f"{var}={value}")
    warnings: list[str] = []
    seen: dict[str, int] = {}
    gpus: list[Gpu] = []
    for i, c in enumerate(candidates):
        numa = root.read_int(f"/sys/bus/pci/devices/{c.bdf}/numa_node")
        if numa is None:
            warnings.append(f"GPU {i} ({c.bdf}): no /sys/bus/pci/devices/{c.bdf}/numa_node")
            numa = -1
        partition = seen.get(c.bdf, 0)
        seen[c.bdf] = partition + 1
        gpus.append(Gpu(i, f"renderD{c.minor}", c.bdf, numa, partition, c.uuid))
    return GpuProbe(tuple(gpus), source, tuple(filters), tuple(warnings))


def numa_per_rank(probe: GpuProbe, ranks: int, policy: str) -> tuple[tuple[int, ...], list[str]]:
    """NUMA node per local rank (rank i uses GPU i) and warnings; -1 means no binding."""
    if policy == "none":
        return tuple(-1 for _ in range(ranks)), []
    if policy != "auto":
        raise ValueError(f"numa policy {policy!r}; allowed values: auto, none")
    warnings = []
    nodes = []
    for rank in range(ranks):
        gpu = probe.gpus[rank]
        if gpu.numa_node < 0:
            warnings.append(
                f"rank {rank}: GPU {gpu.index} ({gpu.bdf}) reports numa_node={gpu.numa_node}; "
                f"this rank's host pool and UMBP DRAM are not NUMA-bound"
            )
        nodes.append(max(gpu.numa_node, -1))
    return tuple(nodes), warnings
