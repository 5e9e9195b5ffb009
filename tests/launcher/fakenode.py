"""Build fake node trees (sysfs, procfs, cgroup, /dev/dri, mounts) in a directory.

The layouts copy what a real ROCm node shows: ``/sys/class/drm/renderD*`` links into
``/sys/devices/pci.../<BDF>/drm/``, whose ``device`` link points back at the PCI device;
``/sys/bus/pci/devices/<BDF>`` links to the same device with its ``numa_node``; KFD topology
nodes carry ``gpu_id`` and ``properties`` (``drm_render_minor``, ``domain``, ``location_id``,
``unique_id``); CPU nodes have ``gpu_id`` 0. Links are relative, as in sysfs.
"""

from __future__ import annotations

import os
from pathlib import Path

MIB = 1 << 20
GIB = 1 << 30

# PCI addresses of the 8 GPUs of an MI355X node: four behind each EPYC socket.
MI355X_BDFS = (
    "0000:05:00.0", "0000:15:00.0", "0000:65:00.0", "0000:75:00.0",
    "0000:85:00.0", "0000:95:00.0", "0000:e5:00.0", "0000:f5:00.0",
)


def _location_id(bdf: str) -> tuple[int, int]:
    domain, bus, devfn = bdf.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)


class FakeNode:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._kfd_next = 2  # KFD nodes 0 and 1 are the CPU sockets
        self.write("/proc/self/cgroup", "0::/\n")
        self.mounts: list[tuple[str, str]] = [("/", "rw,relatime")]
        self._write_mountinfo()

    # -- files ---------------------------------------------------------------------------------
    def p(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def write(self, node_path: str, text: str) -> None:
        path = self.p(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def link(self, node_path: str, target: str) -> None:
        path = self.p(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)

    # -- GPUs ----------------------------------------------------------------------------------
    def cpu_kfd_nodes(self, count: int = 2) -> None:
        for n in range(count):
            self.write(f"/sys/class/kfd/kfd/topology/nodes/{n}/gpu_id", "0\n")
            self.write(f"/sys/class/kfd/kfd/topology/nodes/{n}/properties",
                       "cpu_cores_count 96\nsimd_count 0\n")

    def add_gpu(self, bdf: str, numa: int | None, minor: int, *, kfd: bool = True,
                pci_link: bool = True, unique_id: int = 0) -> None:
        """One logical GPU: its render node, sysfs device and (optionally) KFD node.

        ``pci_link=False`` makes the render node's ``device`` link point at a platform device
        (what a secondary compute partition shows) instead of the PCI function.
        """
        dev = f"/sys/devices/pci0000:00/{bdf}"
        self.p(dev).mkdir(parents=True, exist_ok=True)
        if numa is not None:
            self.write(f"{dev}/numa_node", f"{numa}\n")
        if not self.p(f"/sys/bus/pci/devices/{bdf}").is_symlink():
            self.link(f"/sys/bus/pci/devices/{bdf}", f"../../../devices/pci0000:00/{bdf}")
        node = f"renderD{minor}"
        self.write(f"/dev/dri/{node}", "")
        if not self.p("/dev/kfd").exists():
            self.write("/dev/kfd", "")
        if pci_link:
            drm = f"{dev}/drm/{node}"
            self.link(f"{drm}/device", "../../../" + bdf)
            self.link(f"/sys/class/drm/{node}", f"../../devices/pci0000:00/{bdf}/drm/{node}")
        else:
            xcp = f"/sys/devices/platform/amdgpu_xcp_{minor}"
            self.link(f"{xcp}/drm/{node}/device", "../../../amdgpu_xcp_" + str(minor))
            self.link(f"/sys/class/drm/{node}",
                      f"../../devices/platform/amdgpu_xcp_{minor}/drm/{node}")
        if kfd:
            n = self._kfd_next
            self._kfd_next += 1
            domain, loc = _location_id(bdf)
            self.write(f"/sys/class/kfd/kfd/topology/nodes/{n}/gpu_id", f"{1000 + n}\n")
            self.write(
                f"/sys/class/kfd/kfd/topology/nodes/{n}/properties",
                f"cpu_cores_count 0\nsimd_count 1024\ndrm_render_minor {minor}\n"
                f"domain {domain}\nlocation_id {loc}\nunique_id {unique_id}\n",
            )

    def mi355x(self, numa: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 1, 1), kfd: bool = True) -> None:
        if kfd:
            self.cpu_kfd_nodes()
        for i, (bdf, node) in enumerate(zip(MI355X_BDFS, numa, strict=True)):
            self.add_gpu(bdf, node, 128 + 8 * i, kfd=kfd, unique_id=0x1000 + i)

    # -- hugepages -----------------------------------------------------------------------------
    def hugepages(self, size: int, free: int, *, resv: int = 0, total: int | None = None,
                  per_numa: dict[int, int] | None = None) -> None:
        d = f"/sys/kernel/mm/hugepages/hugepages-{size // 1024}kB"
        self.write(f"{d}/free_hugepages", f"{free}\n")
        self.write(f"{d}/resv_hugepages", f"{resv}\n")
        self.write(f"{d}/nr_hugepages", f"{free if total is None else total}\n")
        for node, pages in (per_numa or {}).items():
            self.write(f"/sys/devices/system/node/node{node}/hugepages/"
                       f"hugepages-{size // 1024}kB/free_hugepages", f"{pages}\n")

    def meminfo(self, free: int, size: int = 2 * MIB, resv: int = 0) -> None:
        self.write("/proc/meminfo",
                   f"MemTotal:       2113470784 kB\nHugePages_Total: {free}\n"
                   f"HugePages_Free:  {free}\nHugePages_Rsvd:  {resv}\n"
                   f"Hugepagesize:    {size // 1024} kB\n")

    def cgroup_v2(self, limits: dict[int, int | str], usage: dict[int, int] | None = None,
                  path: str = "/") -> None:
        self.write("/proc/self/cgroup", f"0::{path}\n")
        base = "/sys/fs/cgroup" + ("" if path == "/" else path)
        self.write("/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids\n")
        for size, limit in limits.items():
            name = f"{size // GIB}GB" if size >= GIB else f"{size // MIB}MB"
            self.write(f"{base}/hugetlb.{name}.max", f"{limit}\n")
            self.write(f"{base}/hugetlb.{name}.current", f"{(usage or {}).get(size, 0)}\n")

    def cgroup_v1(self, limits: dict[int, int], usage: dict[int, int] | None = None,
                  path: str = "/kubepods/pod1/c1", mount_subtree: bool = False) -> None:
        """v1 hugetlb controller; ``mount_subtree``: the mount shows only this container's
        cgroup (no cgroup namespace), so the path from /proc/self/cgroup is not under it."""
        self.write("/proc/self/cgroup", f"12:hugetlb:{path}\n11:memory:{path}\n")
        base = "/sys/fs/cgroup/hugetlb" + ("" if mount_subtree else path)
        for size, limit in limits.items():
            name = f"{size // GIB}GB" if size >= GIB else f"{size // MIB}MB"
            self.write(f"{base}/hugetlb.{name}.limit_in_bytes", f"{limit}\n")
            self.write(f"{base}/hugetlb.{name}.usage_in_bytes",
                       f"{(usage or {}).get(size, 0)}\n")

    # -- mounts --------------------------------------------------------------------------------
    def _write_mountinfo(self) -> None:
        lines = [f"{20 + i} 1 0:{i} / {point} {opts} - ext4 /dev/vd{i} rw"
                 for i, (point, opts) in enumerate(self.mounts)]
        self.write("/proc/self/mountinfo", "\n".join(lines) + "\n")

    def ssd_mount(self, point: str, *, read_only: bool = False) -> Path:
        self.p(point).mkdir(parents=True, exist_ok=True)
        self.mounts.append((point, "ro,relatime" if read_only else "rw,noatime"))
        self._write_mountinfo()
        return self.p(point)
