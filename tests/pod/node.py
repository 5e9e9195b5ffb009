"""The node a test pod runs on: a MI355X's GPU topology (fake), and real memory limits.

Real: hugepages reserved in the kernel's pool (``/proc/sys/vm/nr_hugepages``, what a node's
admin pre-allocates for pods that request ``hugepages-2Mi``), and memory cgroups with a real
limit (cgroup v1 memory hierarchy under this process's own cgroup; SGLang and the kernel read
and enforce it). Fake: the GPUs. The sysfs and ``/dev`` entries of 8 MI355X GPUs (4 per socket,
2 NUMA nodes) are a tree built by ``tests/launcher/fakenode.py``, which each container sees at
the real paths through its mount namespace; this machine has no AMD GPU and one NUMA node, so
ranks are placed on GPUs of NUMA node 0 and only node 0 really exists for ``mbind``.
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

MEMORY_CGROUP_ROOT = "/sys/fs/cgroup/memory"


class NodeUnavailable(RuntimeError):
    """This machine cannot provide what the pod needs (reported as a skip with the reason)."""


def own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path(MEMORY_CGROUP_ROOT + path)
            if (d / "memory.limit_in_bytes").exists():
                return d
    raise NodeUnavailable("no cgroup v1 memory controller for this process "
                          f"(looked under {MEMORY_CGROUP_ROOT})")


@dataclass
class Node:
    """One fake MI355X node on this machine. Use as a context manager (releases everything)."""

    workdir: Path
    gpu_numa: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 1, 1)
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

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what a container sees --------------------------------------------------------------
    def sys_merge(self) -> dict[str, str]:
        """Real sysfs directory -> fake directory whose entries are added to it."""
        return {path: str(self.root / path.lstrip("/"))
                for path in ("/sys/class", "/sys/bus/pci/devices", "/sys/devices/pci0000:00")}

    def gpu_devices(self, first: int, count: int) -> dict[str, str]:
        """/dev entries the AMD device plugin gives a container holding GPUs first..+count."""
        if first + count > len(MI355X_BDFS):
            raise NodeUnavailable(f"{count} GPUs from index {first}: the node has 8")
        out = {"kfd": str(self._dev_file("kfd"))}
        for i in range(first, first + count):
            out[f"dri/renderD{128 + 8 * i}"] = str(self.root / f"dev/dri/renderD{128 + 8 * i}")
        return out

    def _dev_file(self, name: str) -> Path:
        p = self.root / "dev" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
        return p

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
