"""The node a test pod runs on: a MI355X's GPU and CPU topology (fake), real limits.

Real: hugepages reserved in the kernel's pool (``/proc/sys/vm/nr_hugepages``, what a node's
admin pre-allocates for pods that request ``hugepages-2Mi``); memory cgroups with a real limit
(cgroup v1 memory hierarchy under this process's own cgroup; SGLang and the kernel read and
enforce it); a cgroup v1 cpuset per container holding its CPUs, as the kubelet's ``static`` CPU
manager gives a Guaranteed container exclusive CPUs (``sched_setaffinity`` outside them fails
with ``EINVAL``, as on a node). Fake: the GPUs and the host's CPU count. The sysfs and ``/dev``
entries of 8 MI355X GPUs (4 per socket, 2 NUMA nodes) are a tree built by
``tests/launcher/fakenode.py``; the device files are owned ``root:<render gid>`` mode 0660 as
the device plugin passes the host's nodes, so only the pod's groups decide access. The host's
CPUs (2 sockets x 64 cores, SMT: :mod:`pod.cputopo`) are what ``/sys/devices/system/cpu``,
``/proc/cpuinfo`` and ``/proc/stat`` say in the container. Each container sees all this at the
real paths through its mount namespace. This machine has no AMD GPU, 2 CPUs and one NUMA node:
ranks are placed on GPUs of NUMA node 0, only node 0 really exists for ``mbind``
(``/sys/devices/system/node`` stays the machine's), and a container's cpuset is the machine's
CPUs (:meth:`pod.cputopo.HostCpus.real_cpuset`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from launcher.fakenode import MI355X_BDFS, FakeNode
from support.hugepages import HugepageReservation, HugepagesRefused

from . import podspec
from .cputopo import HostCpus, cpu_list

MEMORY_CGROUP_ROOT = "/sys/fs/cgroup/memory"
CPUSET_CGROUP_ROOT = "/sys/fs/cgroup/cpuset"
# The render group of the node's OS (Ubuntu 24.04 hosts: 992); the engine image's own render
# group (pod.image.IMAGE_RENDER_GID) differs, as it does between real hosts and images.
NODE_RENDER_GID = 992


class NodeUnavailable(RuntimeError):
    """This machine cannot provide what the pod needs (reported as a skip with the reason)."""


def _own_cgroup(controller: str, root: str, control_file: str, why: str = "") -> Path:
    """This process's cgroup v1 directory of ``controller`` (children are made in it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            d = Path(root + path)
            if (d / control_file).exists():
                return d
    raise NodeUnavailable(f"no cgroup v1 {controller} controller for this process (looked "
                          f"under {root}){why}")


def own_memory_cgroup() -> Path:
    return _own_cgroup("memory", MEMORY_CGROUP_ROOT, "memory.limit_in_bytes")


def preflight() -> list[str]:
    """What this machine lacks to run the tier, each with what to do (empty: it can run).
    Checked once before any pod starts, so a machine that cannot run the tier says so instead
    of crash-looping containers."""
    import subprocess

    problems = []
    if os.geteuid() != 0:
        problems.append("not root: the tier needs mount namespaces, cgroups and hugepages")
    for tool in ("unshare", "nsenter", "setpriv", "mount"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found (Debian: util-linux, mount)")
    r = subprocess.run(["/usr/bin/python3", "-c", "import seccomp"], capture_output=True)
    if r.returncode != 0:
        problems.append("/usr/bin/python3 cannot import seccomp: the tier loads containerd's "
                        "RuntimeDefault profile with it (apt-get install python3-seccomp; "
                        "scripts/pod-node-tools.sh does)")
    for check in (own_memory_cgroup, own_cpuset_cgroup):
        try:
            check()
        except NodeUnavailable as e:
            problems.append(str(e))
    return problems


def own_cpuset_cgroup() -> Path:
    return _own_cgroup("cpuset", CPUSET_CGROUP_ROOT, "cpuset.cpus", ": the static CPU "
                       "manager's exclusive CPUs cannot be imitated")


@dataclass
class Node:
    """One fake MI355X node on this machine. Use as a context manager (releases everything)."""

    workdir: Path
    gpu_numa: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 1, 1)
    render_gid: int = NODE_RENDER_GID
    cpus: HostCpus = field(default_factory=HostCpus)
    hugepages: list[HugepageReservation] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.workdir / "node-root"
        fake = FakeNode(self.root)
        fake.mi355x(self.gpu_numa)
        for bdf in MI355X_BDFS:
            # What every PCI function has; gloo reads the class of every device at start.
            dev = f"/sys/devices/pci0000:00/{bdf}"
            fake.write(f"{dev}/class", "0x120000\n")  # processing accelerator
            fake.write(f"{dev}/vendor", "0x1002\n")
            fake.write(f"{dev}/device", "0x75a3\n")
        self.cgroup_parent = own_memory_cgroup()
        self.cpuset_parent = own_cpuset_cgroup()
        self.cpu_root = self.cpus.write_sysfs(self.workdir / "host-cpu")
        proc = self.workdir / "host-proc"
        proc.mkdir(exist_ok=True)
        (proc / "cpuinfo").write_text(self.cpus.cpuinfo(Path("/proc/cpuinfo").read_text()))
        (proc / "stat").write_text(self.cpus.proc_stat(Path("/proc/stat").read_text()))
        self.proc_files = {"/proc/cpuinfo": str(proc / "cpuinfo"),
                           "/proc/stat": str(proc / "stat")}
        for name in ("kfd", *(f"dri/renderD{128 + 8 * i}" for i in range(len(MI355X_BDFS)))):
            dev_file = self.root / "dev" / name
            dev_file.parent.mkdir(parents=True, exist_ok=True)
            dev_file.touch()
            os.chown(dev_file, 0, self.render_gid)
            os.chmod(dev_file, 0o660)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what a container sees --------------------------------------------------------------
    def sys_merge(self) -> dict[str, str]:
        """Real sysfs directory -> fake directory whose entries are added to it."""
        return {path: str(self.root / path.lstrip("/"))
                for path in ("/sys/class", "/sys/bus/pci/devices", "/sys/devices/pci0000:00")}

    def host_views(self) -> dict[str, str]:
        """Real path -> fake file or directory bound over it: the host's CPUs as a container
        reads them."""
        return {"/sys/devices/system/cpu": str(self.cpu_root), **self.proc_files}

    def gpu_devices(self, first: int, count: int) -> dict[str, str]:
        """/dev entries the AMD device plugin gives a container holding GPUs first..+count."""
        if first + count > len(MI355X_BDFS):
            raise NodeUnavailable(f"{count} GPUs from index {first}: the node has 8")
        out = {"kfd": str(self.root / "dev" / "kfd")}
        for i in range(first, first + count):
            out[f"dri/renderD{128 + 8 * i}"] = str(self.root / f"dev/dri/renderD{128 + 8 * i}")
        return out

    # -- real limits ----------------------------------------------------------------------------
    def reserve_hugepages(self, page_size: int, nbytes: int) -> None:
        """Add the pages to the kernel pool (given back in :meth:`close`, also on failure)."""
        pages = -(-nbytes // page_size)
        if not pages:
            return
        reservation = HugepageReservation(pages, page_size // 1024)
        try:
            reservation.__enter__()
        except HugepagesRefused as e:
            raise NodeUnavailable(f"the pod requests {nbytes} B of {page_size} B hugepages: "
                                  f"{e}") from e
        self.hugepages.append(reservation)

    def reserve_hugepages_for(self, container: dict[str, object]) -> None:
        """What the node's admin pre-allocated for this container's hugepages requests."""
        for page_size, nbytes in podspec.hugepages(container).items():
            self.reserve_hugepages(page_size, nbytes)

    def memory_cgroup(self, name: str, limit: int | None) -> Path:
        d = self.cgroup_parent / name
        with contextlib.suppress(FileExistsError):
            d.mkdir()
        if d not in self.cgroups:
            self.cgroups.append(d)
        if limit is not None:
            (d / "memory.limit_in_bytes").write_text(str(limit))
        return d

    def cpuset_cgroup(self, name: str, request: int) -> tuple[Path, list[int]]:
        """A cpuset cgroup holding the container's CPUs (see :meth:`HostCpus.real_cpuset`)."""
        cpus = self.cpus.real_cpuset(request)
        d = self.cpuset_parent / name
        with contextlib.suppress(FileExistsError):
            d.mkdir()
        if d not in self.cgroups:
            self.cgroups.append(d)
        (d / "cpuset.mems").write_text((self.cpuset_parent / "cpuset.mems").read_text())
        (d / "cpuset.cpus").write_text(cpu_list(cpus))
        return d, cpus

    def close(self) -> None:
        for d in reversed(self.cgroups):
            kill_cgroup(d)
            with contextlib.suppress(OSError):
                d.rmdir()
        self.cgroups.clear()
        for reservation in reversed(self.hugepages):
            reservation.__exit__(None, None, None)
        self.hugepages.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def cgroup_pids(d: Path) -> list[int]:
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def kill_cgroup(d: Path, sig: int = 9) -> None:
    """Signal every process in the cgroup until it is empty (what a runtime does on stop)."""
    import time

    for _ in range(100):
        pids = cgroup_pids(d)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)
