"""A pod network for the pod tier, the way a bridge CNI plugin gives one.

Each pod gets its own network namespace with a loopback and an ``eth0`` (one end of a veth
pair whose other end is on a bridge), its own IP on the bridge's subnet and a default route
through the bridge. So several pods serve on the same port, and a process in the node's own
namespace (the router, Prometheus, a benchmark client, the operator) reaches each pod by its pod
IP, as a kubelet's CNI would arrange.

Addresses: 198.18.0.0/15 is reserved for network benchmark tests (RFC 2544) and routed nowhere;
the tier uses one /24 of it per network, the bridge is ``.1``, pods from ``.2``. Traffic never
leaves the machine: the bridge has no uplink and nothing is forwarded or masqueraded.

Names: every network namespace, bridge and veth carries ``PREFIX`` (and the network's index), so
parallel test runs of other work never collide with it, and ``remove_stale`` deletes what a
killed run left. Everything is removed when the network closes. Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import subprocess
from dataclasses import dataclass

PREFIX = "shcrt"  # this tier's kernel objects (network namespaces, bridges, veths)
SUBNET_BASE = ipaddress.IPv4Network("198.18.0.0/15")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Delete network namespaces and links named with ``prefix`` (a killed run's leftovers)."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(prefix):
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix):
                _ip("link", "delete", name, check=False)
                removed.append(name)
    return removed


@dataclass(frozen=True)
class PodInterface:
    pod: str
    netns: str
    ip: str
    host_veth: str

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a process inside the pod's network namespace (only:
        ``ip netns exec`` would also remount /sys, hiding the cgroup hierarchy)."""
        return ["nsenter", f"--net=/var/run/netns/{self.netns}", "--"]


class PodNetwork:
    """``with PodNetwork() as net: iface = net.add_pod("tiny-0")`` (root only)."""

    _indexes = itertools.count(os.getpid() % 200)

    def __init__(self, index: int | None = None) -> None:
        self.index = next(self._indexes) % 256 if index is None else index
        self.subnet = list(SUBNET_BASE.subnets(new_prefix=24))[self.index]
        self.bridge = f"{PREFIX}{self.index}br"
        self.gateway = str(self.subnet.network_address + 1)
        self.pods: dict[str, PodInterface] = {}
        self._next_host = 2
        self._veths = itertools.count()

    def __enter__(self) -> PodNetwork:
        if os.geteuid() != 0:
            raise PermissionError("the pod network needs root (network namespaces, bridges)")
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_pod(self, pod: str) -> PodInterface:
        """A network namespace for ``pod`` with ``eth0`` on the bridge and its own IP."""
        if pod in self.pods:
            return self.pods[pod]
        if self._next_host >= self.subnet.num_addresses - 1:
            raise RuntimeError(f"pod network {self.subnet} is full")
        n = next(self._veths)
        netns = f"{PREFIX}{self.index}-{pod}"[:64]
        host_veth, pod_veth = f"{PREFIX}{self.index}v{n}h", f"{PREFIX}{self.index}v{n}p"
        ip = str(self.subnet.network_address + self._next_host)
        self._next_host += 1
        _ip("netns", "add", netns)
        try:
            _ip("link", "add", host_veth, "type", "veth", "peer", "name", pod_veth)
            _ip("link", "set", host_veth, "master", self.bridge)
            _ip("link", "set", host_veth, "up")
            _ip("link", "set", pod_veth, "netns", netns)
            inside = ("netns", "exec", netns, "ip")
            _ip(*inside, "link", "set", pod_veth, "name", "eth0")
            _ip(*inside, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "route", "add", "default", "via", self.gateway)
        except Exception:
            _ip("netns", "delete", netns, check=False)
            _ip("link", "delete", host_veth, check=False)
            raise
        iface = PodInterface(pod, netns, ip, host_veth)
        self.pods[pod] = iface
        return iface

    def remove_pod(self, pod: str) -> None:
        iface = self.pods.pop(pod, None)
        if iface is not None:
            _ip("netns", "delete", iface.netns, check=False)  # takes its veth end along
            _ip("link", "delete", iface.host_veth, check=False)

    def close(self) -> None:
        for pod in list(self.pods):
            self.remove_pod(pod)
        _ip("link", "delete", self.bridge, check=False)
