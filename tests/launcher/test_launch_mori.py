"""The launcher's standalone wait against a real ``umbp_standalone_server`` (engine environment,
``make test-mori``).

Real: amd-mori 1.2.4's server binary (started by PID under the loader prefix from
``engine-python``, always killed at teardown), its two UNIX sockets, the stale socket
files it leaves behind when killed, and the launcher's wait. Faked: the GPUs and hugepage tree
of the node (a fake sysfs under the same node root as the sockets).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch
from hicache_umbp.launch.standalone import socket_paths

from .conftest import io_uring_ok, launch_env
from .fakenode import MIB, FakeNode

pytestmark = pytest.mark.mori

SOCKET_DIR = "/run/umbp"


class Sidecar:
    """One real DRAM server; :meth:`stop` signals only the PID this test started."""

    def __init__(self, node: FakeNode, log: Path) -> None:
        sock = node.p(f"{SOCKET_DIR}/dram.sock")
        sock.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("UMBP_")}
        env.update(standalone_server_env("dram", capacity_bytes=64 * MIB))
        cmd = [*mori_loader_prefix(), standalone_server_binary(), f"unix:{sock}"]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def sidecar(mi355x: FakeNode, tmp_path: Path) -> Iterator[Sidecar]:
    server = Sidecar(mi355x, tmp_path / "dram.log")
    try:
        yield server
    finally:
        server.stop()


def _env(wait_s: float) -> dict[str, str]:
    return launch_env(umbp_mode="standalone", umbp_dram_bytes=None, umbp_socket_dir=SOCKET_DIR,
                      umbp_standalone_wait_s=wait_s)


def test_wait_succeeds_on_the_real_server_then_times_out_once_it_is_killed(
    mi355x: FakeNode, sidecar: Sidecar
) -> None:
    root = NodeRoot(mi355x.root)
    plan = plan_launch(_env(60), root, io_uring_probe=io_uring_ok)
    assert plan.report["standalone"]["sockets"] == [
        f"{SOCKET_DIR}/dram.sock", f"{SOCKET_DIR}/dram.sock.fd.sock"]
    assert sidecar.proc.poll() is None, sidecar.log.read_text(errors="replace")

    sidecar.stop()
    # The killed server leaves both socket files behind: only a refused connect tells.
    assert all(mi355x.p(p).exists() for p in socket_paths(plan.config.store))
    with pytest.raises(LaunchError) as e:
        plan_launch(_env(0.5), root, io_uring_probe=io_uring_ok)
    assert e.value.reason == "StandaloneServerUnavailable"
    message = str(e.value)
    assert message.startswith("umbp_standalone_server sidecar not ready after ")
    assert "(HICACHE_UMBP_STANDALONE_WAIT_S=0.5) in HICACHE_UMBP_SOCKET_DIR='/run/umbp'" in message
    assert ("/run/umbp/dram.sock: socket file present but nobody listens (ECONNREFUSED: stale "
            "socket); /run/umbp/dram.sock.fd.sock: socket file present but nobody listens"
            in message)
