"""ReconnectingClient and SerializedClient over in-process doubles.

Real: the wrappers, their threads, a real socket *file* whose identity (device, inode, ctime)
changes when it is re-created, as a restarted server does. Faked: the servers -- each "server
process" is a ``MemoryUMBPClient`` double that requires registered memory (as a standalone
server does), and "dead" means its answers are all False. ``test_sidecar_restart_mori.py``
kills and restarts real ``umbp_standalone_server`` processes.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.clients.guards import ReconnectingClient, SerializedClient, socket_identity
from support.memory_client import MemoryUMBPClient

SIZE = 4096


class Servers:
    """A socket file and the double behind it; ``restart`` re-creates both."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ready = threading.Event()
        self.ready.set()
        self.connects = 0
        self.current = self._new()

    def _new(self) -> MemoryUMBPClient:
        self.path.unlink(missing_ok=True)
        self.path.write_bytes(b"")
        return MemoryUMBPClient(1 << 20, require_registered=True)

    def kill(self) -> None:
        for method in ("batch_put_from_ptr", "batch_get_into_ptr", "batch_exists"):
            self.current.inject(method, "false", times=10**6)
        self.current.inject("register_memory", "raise", times=10**6)

    def restart(self, ready: bool = True) -> None:
        before = socket_identity(str(self.path))
        while socket_identity(str(self.path)) == before:  # ctime granularity
            self.current = self._new()
        if ready:
            self.ready.set()
        else:
            self.ready.clear()

    def connect(self, timeout_ms: int) -> Any:
        if not self.ready.is_set():
            raise RuntimeError("server not answering yet")
        self.connects += 1
        return self.current


@pytest.fixture
def buf() -> Any:
    mem = ctypes.create_string_buffer(b"x" * 4 * SIZE, 4 * SIZE)
    return mem, ctypes.addressof(mem)


def test_a_restarted_server_gets_a_new_client_with_every_buffer_again(
    tmp_path: Path, buf: Any
) -> None:
    servers = Servers(tmp_path / "dram.sock")
    client = ReconnectingClient(str(servers.path), servers.connect)
    _, ptr = buf
    assert client.register_memory(ptr, 4 * SIZE) is True
    assert client.batch_put_from_ptr(["a"], [ptr], [SIZE]) == [True]
    servers.kill()
    assert client.batch_put_from_ptr(["b"], [ptr], [SIZE]) == [False]  # same socket: no retry
    assert client.reconnects == 0
    servers.restart()
    # The first call after the restart reconnects, re-registers and succeeds.
    assert client.batch_put_from_ptr(["c"], [ptr], [SIZE]) == [True]
    assert client.reconnects == 1 and servers.connects == 2
    assert client.batch_exists(["a", "c"]) == [False, True]  # the new server starts empty
    client.close()


def test_calls_fail_fast_while_the_new_server_is_not_ready(tmp_path: Path, buf: Any) -> None:
    servers = Servers(tmp_path / "ssd.sock")
    client = ReconnectingClient(str(servers.path), servers.connect)
    client.RETRY_S = 0.01  # the background retry period
    _, ptr = buf
    try:
        assert client.register_memory(ptr, 4 * SIZE) is True
        servers.kill()
        servers.restart(ready=False)
        for _ in range(20):  # each fails at once; the background thread keeps trying
            assert client.batch_put_from_ptr(["k"], [ptr], [SIZE]) == [False]
        assert client.reconnects == 0
        servers.ready.set()
        thread = client._thread
        assert thread is not None
        thread.join(30)
        assert client.reconnects == 1
        assert client.batch_put_from_ptr(["k"], [ptr], [SIZE]) == [True]  # registered again
    finally:
        client.close()


def test_serialized_client_runs_one_batch_at_a_time() -> None:
    inside = threading.Semaphore(0)
    release = threading.Event()
    seen: list[int] = []

    class Slow:
        active = 0

        def batch_exists(self, keys: list[str]) -> list[bool]:
            Slow.active += 1
            seen.append(Slow.active)
            inside.release()
            release.wait(30)
            Slow.active -= 1
            return [False] * len(keys)

    client = SerializedClient(Slow())
    threads = [threading.Thread(target=client.batch_exists, args=(["k"],)) for _ in range(3)]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=30)
    assert not inside.acquire(timeout=0.2)  # the others wait outside
    release.set()
    for t in threads:
        t.join(30)
    assert seen == [1, 1, 1]
