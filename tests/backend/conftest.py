"""Shared fixtures for backend tests.

``standalone_servers``: starts real ``umbp_standalone_server`` processes (engine environment only),
each under the loader prefix from ``$MORI_CPU_LOADER`` (set by the engine environment's
engine-python), waits for its socket, kills (SIGKILL) and restarts them on demand like a crashed
sidecar container, and always kills every process it started, by PID, at teardown -- also when the
test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from support.hugepages import HugepageReservation

SERVER_START_TIMEOUT_S = 60.0


@dataclass
class StandaloneServer:
    medium: str
    socket_path: str
    log_path: Path
    process: subprocess.Popen[bytes]
    cmd: list[str]
    env: dict[str, str]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; only this server's own PID."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


class StandaloneServers:
    """Starts servers on demand; :meth:`stop_all` kills every one it started."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[StandaloneServer] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    def start(self, medium: str, umbp_env: dict[str, str], name: str = "") -> StandaloneServer:
        from hicache_umbp.clients.runtime import mori_loader_prefix, standalone_server_binary

        name = name or f"{medium}-{len(self.started)}"
        sock = str(self.workdir / f"{name}.sock")
        log_path = self.workdir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("UMBP_")}
        env.update(umbp_env)
        cmd = [*mori_loader_prefix(), standalone_server_binary(), f"unix:{sock}"]
        server = StandaloneServer(medium, sock, log_path, self._spawn(cmd, env, log_path),
                                  cmd, env)
        self.started.append(server)
        self._wait_listening(server, None)
        return server

    def kill(self, server: StandaloneServer) -> None:
        """SIGKILL the server's own PID (a crashed sidecar): its socket file stays behind."""
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)

    def restart(self, server: StandaloneServer) -> float:
        """Start the server again on the same socket with the same env (as Kubernetes restarts
        a crashed sidecar container); returns the seconds until the new process listens (its
        socket file replaced the stale one)."""
        from hicache_umbp.clients.guards import socket_identity

        if server.process.poll() is None:
            self.kill(server)
        before = socket_identity(server.socket_path)
        start = time.monotonic()
        server.process = self._spawn(server.cmd, server.env, server.log_path)
        self._processes.append(server.process)
        self._wait_listening(server, before)
        return time.monotonic() - start

    @staticmethod
    def _spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    @staticmethod
    def _wait_listening(server: StandaloneServer, stale: object) -> None:
        from hicache_umbp.clients.guards import socket_identity

        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while socket_identity(server.socket_path) in (None, stale):
            proc = server.process
            if proc.poll() is not None:
                raise RuntimeError(
                    f"umbp_standalone_server ({server.medium}) exited with "
                    f"{proc.returncode}:\n{server.log()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"umbp_standalone_server socket {server.socket_path} did "
                                   "not appear")
            time.sleep(0.02)

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()
        for proc in self._processes:  # earlier processes of restarted servers
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def hugepages_2m() -> Iterator[Callable[[int], HugepageReservation]]:
    """Reserve ``n`` 2 MiB hugepages for this test (root; skipped with the machine's reason when
    it refuses); every reservation is given back at teardown, also when the test fails."""
    from support.hugepages import HugepageReservation, HugepagesRefused

    held: list[HugepageReservation] = []

    def reserve(n: int) -> HugepageReservation:
        r = HugepageReservation(n)
        try:
            r.__enter__()
        except HugepagesRefused as e:
            pytest.skip(f"hugepages unavailable here: {e}")
        held.append(r)
        return r

    try:
        yield reserve
    finally:
        for r in reversed(held):
            r.__exit__(None, None, None)


@pytest.fixture
def standalone_servers(tmp_path: Path) -> Iterator[StandaloneServers]:
    servers = StandaloneServers(tmp_path)
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture
def stacks() -> Iterator[list[Any]]:
    """Scheduler stacks (tests/backend/sglang_stack.py) a test builds; closed at teardown."""
    built: list[Any] = []
    try:
        yield built
    finally:
        for stack in built:
            stack.close()
