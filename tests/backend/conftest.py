"""Shared fixtures for backend tests.

``standalone_servers``: starts real ``umbp_standalone_server`` processes (mori venv only), each
under the loader prefix from ``$MORI_CPU_LOADER`` (set by scripts/mori-python), waits for its
socket, and always kills every one it started, by PID, at teardown -- also when the test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_START_TIMEOUT_S = 60.0


@dataclass
class StandaloneServer:
    medium: str
    socket_path: str
    log_path: Path
    process: subprocess.Popen[bytes]

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

    def start(self, medium: str, umbp_env: dict[str, str], name: str = "") -> StandaloneServer:
        from hicache_umbp.client import mori_loader_prefix, standalone_server_binary

        name = name or f"{medium}-{len(self.started)}"
        sock = str(self.workdir / f"{name}.sock")
        log_path = self.workdir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("UMBP_")}
        env.update(umbp_env)
        cmd = [*mori_loader_prefix(), standalone_server_binary(), f"unix:{sock}"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        server = StandaloneServer(medium, sock, log_path, proc)
        self.started.append(server)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not os.path.exists(sock):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"umbp_standalone_server ({medium}) exited with {proc.returncode}:\n"
                    f"{server.log()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"umbp_standalone_server socket {sock} did not appear")
            time.sleep(0.02)
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()


@pytest.fixture
def standalone_servers(tmp_path: Path) -> Iterator[StandaloneServers]:
    servers = StandaloneServers(tmp_path)
    try:
        yield servers
    finally:
        servers.stop_all()
