"""Waiting for the standalone sidecars, against real UNIX sockets (the sidecar is played by a
listening socket of this test; the real umbp_standalone_server is in test_launch_mori.py).

Time is a fake clock advanced by the fake sleep, so the timeout path counts polls instead of
waiting on the wall clock.
"""

from __future__ import annotations

import socket

import pytest
from hicache_umbp.contract.load import load_store_config, render_env
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch
from hicache_umbp.launch.standalone import socket_paths, wait_for_sidecars

from .conftest import io_uring_ok, launch_env, listen_on
from .fakenode import FakeNode


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: list[object] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s
        if self.on_sleep:
            action = self.on_sleep.pop(0)
            if callable(action):
                action()


def _stale(node: FakeNode, path: str) -> None:
    """A socket file nobody listens on: what a dead sidecar leaves in the shared emptyDir."""
    host = node.p(path)
    host.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(host))
    s.close()


def _store(wait_s: float = 5.0, ssd: bool = False):
    return load_store_config({}, render_env({
        "umbp_mode": "standalone", "umbp_socket_dir": "/run/umbp",
        "umbp_standalone_wait_s": wait_s, "umbp_ssd_enabled": ssd}))


def test_socket_paths_follow_the_media() -> None:
    assert socket_paths(_store()) == ("/run/umbp/dram.sock", "/run/umbp/dram.sock.fd.sock")
    assert socket_paths(_store(ssd=True)) == (
        "/run/umbp/dram.sock", "/run/umbp/dram.sock.fd.sock",
        "/run/umbp/ssd.sock", "/run/umbp/ssd.sock.fd.sock")


def test_ready_sidecars_pass_on_the_first_poll(
    node: FakeNode, listeners: list[socket.socket]
) -> None:
    for p in socket_paths(_store(ssd=True)):
        listen_on(node, p, listeners)
    t = FakeTime()
    result = wait_for_sidecars(NodeRoot(node.root), _store(ssd=True), clock=t.clock, sleep=t.sleep)
    assert result.polls == 1 and t.sleeps == []


def test_wait_polls_until_the_sidecar_listens(
    node: FakeNode, listeners: list[socket.socket]
) -> None:
    _stale(node, "/run/umbp/dram.sock")  # left over from the previous engine container
    t = FakeTime()

    def sidecar_starts() -> None:
        node.p("/run/umbp/dram.sock").unlink()
        for p in socket_paths(_store()):
            listen_on(node, p, listeners)

    t.on_sleep = [None, None, sidecar_starts]
    result = wait_for_sidecars(NodeRoot(node.root), _store(), clock=t.clock, sleep=t.sleep)
    assert result.polls == 4
    assert t.sleeps == [0.05, 0.1, 0.2]


def test_timeout_names_each_socket_and_why(node: FakeNode) -> None:
    _stale(node, "/run/umbp/dram.sock")
    t = FakeTime()
    with pytest.raises(LaunchError) as e:
        wait_for_sidecars(NodeRoot(node.root), _store(wait_s=2.0), clock=t.clock, sleep=t.sleep)
    assert e.value.reason == "StandaloneServerUnavailable"
    assert str(e.value) == (
        "umbp_standalone_server sidecar not ready after 2.0 s (HICACHE_UMBP_STANDALONE_WAIT_S=2) "
        "in HICACHE_UMBP_SOCKET_DIR='/run/umbp': /run/umbp/dram.sock: socket file present but "
        "nobody listens (ECONNREFUSED: stale socket); /run/umbp/dram.sock.fd.sock: no socket "
        "file. Check the sidecar containers' logs and that they share the socket volume")
    assert sum(t.sleeps) == pytest.approx(2.0)
    assert t.sleeps == [0.05, 0.1, 0.2, 0.4, 0.8, pytest.approx(0.45)]


def test_standalone_launch_renders_no_embedded_keys(
    mi355x: FakeNode, listeners: list[socket.socket]
) -> None:
    for p in socket_paths(_store()):
        listen_on(mi355x, p, listeners)
    env = launch_env(umbp_mode="standalone", umbp_dram_bytes=None, umbp_socket_dir="/run/umbp")
    plan = plan_launch(env, NodeRoot(mi355x.root), io_uring_probe=io_uring_ok)
    assert plan.report["standalone"]["sockets"] == list(socket_paths(_store()))
    extra = plan.command.extra_config
    assert extra["umbp_mode"] == "standalone" and extra["umbp_socket_dir"] == "/run/umbp"
    assert "umbp_dram_numa" not in extra  # the DRAM sidecar binds its own NUMA node
    assert extra["host_numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
