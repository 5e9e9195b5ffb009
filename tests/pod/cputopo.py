"""The CPUs of a MI355X host as software in a container reads them, and the static CPU manager.

A MI355X node has 2 EPYC sockets of 64 cores with SMT: 256 logical CPUs, Linux numbering the
first thread of every core 0..127 (socket 0: 0..63) and their siblings 128..255. A container
reads that host everywhere, not its cpuset: ``/sys/devices/system/cpu`` (glibc's
``get_nprocs`` and so ``os.cpu_count()`` read ``online``; psutil counts physical cores from
each ``cpuN/topology/core_cpus_list``), ``/proc/cpuinfo`` and ``/proc/stat`` (psutil's per-CPU
list). Only ``sched_getaffinity``/``sched_setaffinity`` see the container's cgroup cpuset.

:class:`HostCpus` writes that view (files the shim bind-mounts over the machine's own in the
container's mount namespace); :func:`static_cpus` is the kubelet's ``static`` policy choosing
a Guaranteed container's exclusive CPUs on it. This machine has 2 CPUs (0 and 1): the real
cpuset a container gets is the first ``min(request, 2)`` of them, which in the host's
numbering are socket 0's cores 0 and 1 (see :meth:`HostCpus.real_cpuset`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


def cpu_list(cpus: list[int] | set[int]) -> str:
    """``0-3,8,10-11``: the kernel's list format."""
    out: list[str] = []
    ids = sorted(cpus)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def machine_cpus() -> list[int]:
    """The CPUs this process may run on (its real cpuset)."""
    return sorted(os.sched_getaffinity(0))


@dataclass(frozen=True)
class HostCpus:
    sockets: int = 2
    cores_per_socket: int = 64
    threads_per_core: int = 2
    model_name: str = "AMD EPYC 9575F 64-Core Processor"

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def logical(self) -> int:
        return self.cores * self.threads_per_core

    def socket_of(self, cpu: int) -> int:
        return (cpu % self.cores) // self.cores_per_socket

    def core_of(self, cpu: int) -> int:
        return cpu % self.cores

    def siblings(self, cpu: int) -> list[int]:
        core = self.core_of(cpu)
        return [core + t * self.cores for t in range(self.threads_per_core)]

    def socket_cpus(self, socket: int) -> list[int]:
        return sorted(c for c in range(self.logical) if self.socket_of(c) == socket)

    # -- what a container reads ---------------------------------------------------------------
    def write_sysfs(self, target: Path) -> Path:
        """``target`` becomes a ``/sys/devices/system/cpu`` of this host."""
        every = cpu_list(list(range(self.logical)))
        files = {"online": every, "possible": every, "present": every, "offline": "",
                 "isolated": "", "kernel_max": "8191"}
        for cpu in range(self.logical):
            sock, sib = self.socket_of(cpu), self.siblings(cpu)
            topo = f"cpu{cpu}/topology"
            files |= {
                f"cpu{cpu}/online": "1",
                f"{topo}/physical_package_id": str(sock),
                f"{topo}/die_id": str(sock),
                f"{topo}/cluster_id": str(self.core_of(cpu)),
                f"{topo}/core_id": str(self.core_of(cpu) % self.cores_per_socket),
                f"{topo}/core_cpus_list": cpu_list(sib),
                f"{topo}/thread_siblings_list": cpu_list(sib),
                f"{topo}/core_siblings_list": cpu_list(self.socket_cpus(sock)),
                f"{topo}/package_cpus_list": cpu_list(self.socket_cpus(sock)),
                f"{topo}/die_cpus_list": cpu_list(self.socket_cpus(sock)),
            }
        for rel, text in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        return target

    def cpuinfo(self, real: str) -> str:
        """``/proc/cpuinfo`` of this host; the ISA ``flags`` stay the machine's own (code that
        picks instructions from them runs on this CPU)."""
        flags = re.search(r"^flags\s*:\s*(.*)$", real, re.M)
        out = []
        for cpu in range(self.logical):
            out.append("\n".join([
                f"processor\t: {cpu}", "vendor_id\t: AuthenticAMD", "cpu family\t: 26",
                f"model name\t: {self.model_name}", f"physical id\t: {self.socket_of(cpu)}",
                f"siblings\t: {self.cores_per_socket * self.threads_per_core}",
                f"core id\t\t: {self.core_of(cpu) % self.cores_per_socket}",
                f"cpu cores\t: {self.cores_per_socket}", f"apicid\t\t: {cpu}",
                f"flags\t\t: {flags.group(1) if flags else ''}", ""]))
        return "\n".join(out) + "\n"

    def proc_stat(self, real: str) -> str:
        """``/proc/stat`` with one ``cpuN`` line per host CPU (the machine's totals, spread),
        every other line (``btime``, ``ctxt``, ...) the machine's own."""
        lines = real.splitlines()
        total = next(line for line in lines if line.startswith("cpu "))
        fields = [int(x) // self.logical for x in total.split()[1:]]
        per_cpu = [f"cpu{c} " + " ".join(map(str, fields)) for c in range(self.logical)]
        rest = [line for line in lines if not re.match(r"cpu\d*\s", line)]
        return "\n".join([total, *per_cpu, *rest]) + "\n"

    def real_cpuset(self, request: int) -> list[int]:
        """The machine's CPUs a container with ``request`` exclusive CPUs runs on here: the
        first ``min(request, machine CPUs)`` of them (every container of a pod shares them, where
        a node gives each Guaranteed container CPUs of its own)."""
        cpus = machine_cpus()
        return cpus[:max(1, min(request, len(cpus)))]


def static_cpus(host: HostCpus, request: int, reserved: tuple[int, ...] = (0, 128),
                taken: frozenset[int] = frozenset()) -> list[int]:
    """The kubelet's ``static`` CPU manager policy for a Guaranteed container requesting
    ``request`` whole CPUs: whole sockets first, then whole cores of the socket with the most
    free CPUs, then single threads (``takeByTopology``, without the topology manager's NUMA
    hint); ``reserved`` (``reservedSystemCPUs``) and ``taken`` are never given out."""
    free = [c for c in range(host.logical) if c not in reserved and c not in taken]
    out: list[int] = []

    def free_of(cpus: list[int]) -> list[int]:
        return [c for c in cpus if c in free and c not in out]

    for sock in range(host.sockets):
        cpus = host.socket_cpus(sock)
        if request - len(out) >= len(cpus) and len(free_of(cpus)) == len(cpus):
            out += cpus
    while request - len(out) >= host.threads_per_core:
        socks = sorted(range(host.sockets), key=lambda s: -len(free_of(host.socket_cpus(s))))
        cores = [host.siblings(c) for c in free_of(host.socket_cpus(socks[0]))
                 if c < host.cores and all(s in free and s not in out for s in host.siblings(c))]
        if not cores:
            break
        out += cores[0]
    for c in free:
        if len(out) >= request:
            break
        if c not in out:
            out.append(c)
    if len(out) < request:
        raise ValueError(f"{request} CPUs requested, {len(free)} allocatable")
    return sorted(out)
