"""Wrappers around one mori client that make it behave as the store needs.

:class:`SerializedClient`
    one batch call at a time. mori 1.2.4's SSD node stages every batch in 16 shared staging
    slots and leases them after reads; two batches in flight (SGLang's backup and prefetch
    threads, or the write-back thread and a reader) starve each other. Measured on real mori
    (DRAM 8 MiB in front of an SSD node, 3 writers and 2 readers, 150 rounds): 705 hits and
    558 missed keys without the lock, 23,033 hits and 102 missed keys with it.
:class:`ReconnectingClient`
    a client of a standalone server (``umbp_standalone_server`` sidecar) that survives the
    server's restart. Measured on 1.2.4: once a server dies, its client answers every call
    with False (or raises ``failed to connect to all addresses`` for registrations) and never
    reconnects, even after a new server listens on the same socket; a *new* client connects at
    once but the new server knows none of the buffers the old one had mapped. So when a call
    fails and the socket file is a different one than the one we connected to (the restarted
    server re-creates it: device, inode and ctime differ), we open a new client, register
    every buffer again, and retry the call once. The check costs one ``stat`` per failing call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

SocketIdentity = tuple[int, int, int]


class SerializedClient:
    """Forwards every call to ``client``, one batch call at a time (see the module docstring)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    @property
    def inner(self) -> Any:
        return self._client

    def __getattr__(self, name: str) -> Any:  # clear(), exists(), ...: the client's own
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._client, name)

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        with self._lock:
            return self._client.batch_put_from_ptr(keys, ptrs, sizes)  # type: ignore[no-any-return]

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        with self._lock:
            return self._client.batch_get_into_ptr(keys, ptrs, sizes)  # type: ignore[no-any-return]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            return self._client.batch_exists(keys)  # type: ignore[no-any-return]

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        with self._lock:
            return self._client.batch_exists_consecutive(keys)  # type: ignore[no-any-return]

    def register_memory(self, ptr: int, size: int) -> bool:
        return self._client.register_memory(ptr, size)  # type: ignore[no-any-return]

    def deregister_memory(self, ptr: int) -> None:
        self._client.deregister_memory(ptr)

    def flush(self) -> bool:
        with self._lock:
            return self._client.flush()  # type: ignore[no-any-return]


def socket_identity(path: str) -> SocketIdentity | None:
    """(device, inode, ctime) of the socket file, None when it is missing. A restarted server
    re-creates the file: inode numbers may be reused, the ctime is not."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class ReconnectingClient:
    """A standalone server's client that reconnects and re-registers after a server restart.

    ``connect()`` opens a new raw mori client of the server at ``socket_path`` (it may raise
    while the server is not ready); ``first_client`` is the one already open (default: one
    ``connect()``). Thread-safe: one thread reconnects, the others keep getting the failed
    answer until the new client is in place.
    """

    def __init__(
        self,
        socket_path: str,
        connect: Callable[[], Any],
        *,
        first_client: Any = None,
        description: str = "",
        log_interval_s: float = 30.0,
    ) -> None:
        self.socket_path = socket_path
        self._connect = connect
        self._identity = socket_identity(socket_path)
        self._client: Any = connect() if first_client is None else first_client
        self._description = description or f"standalone server at unix:{socket_path}"
        self._registered: dict[int, int] = {}
        self._reconnecting = threading.Lock()
        self._warn = RateLimitedLog(log, log_interval_s)
        self.reconnects = 0
        self.last_reconnect_s: float | None = None  # opening + re-registering, last time

    def __getattr__(self, name: str) -> Any:  # clear(), exists(), ...: the current client's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._client, name)

    # ------------------------------------------------------------------ UMBPClientLike

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        return self._run("batch_put_from_ptr", _any_false, keys, ptrs, sizes)  # type: ignore[no-any-return]

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        return self._run("batch_get_into_ptr", _any_false, keys, ptrs, sizes)  # type: ignore[no-any-return]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return self._run("batch_exists", _any_false, keys)  # type: ignore[no-any-return]

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        def short(result: Any, args: tuple[Any, ...]) -> bool:
            return not isinstance(result, int) or result < len(args[0])

        return self._run("batch_exists_consecutive", short, keys)  # type: ignore[no-any-return]

    def register_memory(self, ptr: int, size: int) -> bool:
        self._registered[ptr] = size
        return self._run("register_memory", lambda r, a: r is not True, ptr, size)  # type: ignore[no-any-return]

    def deregister_memory(self, ptr: int) -> None:
        self._registered.pop(ptr, None)
        self._client.deregister_memory(ptr)

    def flush(self) -> bool:
        return self._client.flush() is True

    # ------------------------------------------------------------------ reconnection

    def _run(self, name: str, failed: Callable[[Any, tuple[Any, ...]], bool], *args: Any) -> Any:
        client = self._client
        error: Exception | None = None
        result: Any = None
        try:
            result = getattr(client, name)(*args)
        except Exception as e:  # a dead server: re-raised below unless we reconnect
            error = e
        if error is None and not failed(result, args):
            return result
        if self._reconnect(client):
            return getattr(self._client, name)(*args)
        if error is not None:
            raise error
        return result

    def _reconnect(self, failed_client: Any) -> bool:
        """Reconnect when the server's socket is a new one; True when a new client is in
        place (by this call or a concurrent one)."""
        if self._client is not failed_client:
            return True  # another thread already reconnected
        ident = socket_identity(self.socket_path)
        if ident is None or ident == self._identity:
            return False  # same server (a plain miss or refusal), or no server yet
        if not self._reconnecting.acquire(blocking=False):
            return False
        try:
            if self._client is not failed_client:
                return True
            start = time.monotonic()
            try:
                client = self._connect()
            except Exception as e:
                self._warn.warn("reconnect_failed", "%s restarted but a new client could not "
                                "connect yet: %r", self._description, e)
                return False
            refused = []
            for ptr, size in list(self._registered.items()):
                try:
                    ok: Any = client.register_memory(ptr, size)
                except Exception as e:
                    ok = e
                if ok is not True:
                    refused.append((ptr, ok))
            self._client, self._identity = client, ident
            self.reconnects += 1
            self.last_reconnect_s = time.monotonic() - start
            log.warning(
                "%s was restarted: reconnected and registered %d buffer(s) again in %.3f s%s",
                self._description, len(self._registered) - len(refused),
                self.last_reconnect_s, f"; refused: {refused}" if refused else "",
            )
            return True
        finally:
            self._reconnecting.release()


def _any_false(result: Any, args: tuple[Any, ...]) -> bool:
    return not isinstance(result, list) or not all(r is True for r in result)
