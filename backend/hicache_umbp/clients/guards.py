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
    reconnects, even after a new server listens on the same socket; a *new* client connects
    once the new server is ready, but that server knows none of the buffers the old one had
    mapped. So when a call fails and the socket file is a different one than the one we
    connected to (the restarted server re-creates it: device, inode and ctime differ), we open
    a new client, register every buffer again, and retry the call once -- or, while the new
    server is not answering yet, leave that to a background thread and fail fast. The check
    costs one ``stat`` per failing call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..store.ratelimit import RateLimitedLog

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

    ``connect(timeout_ms)`` opens a new raw mori client of the server at ``socket_path`` (it
    raises when the server does not answer within ``timeout_ms``); ``first_client`` is the one
    already open (default: one ``connect``). A restarted server answers about 1 s after its
    socket appears (a small DRAM sidecar, measured), a large DRAM sidecar only once it has
    prefaulted its pool, so the data path never waits for it: the failing call tries once with
    :data:`INLINE_CONNECT_MS`; if the server is not ready, a background thread keeps trying
    every :data:`RETRY_S` and swaps the new client in, with every buffer registered again,
    while calls keep failing fast. ``close()`` stops that thread.
    """

    INLINE_CONNECT_MS = 50
    BACKGROUND_CONNECT_MS = 1000
    RETRY_S = 0.25

    def __init__(
        self,
        socket_path: str,
        connect: Callable[[int], Any],
        *,
        first_client: Any = None,
        description: str = "",
        log_interval_s: float = 30.0,
        ledger: Callable[[bool], None] | None = None,
    ) -> None:
        self.socket_path = socket_path
        # ledger(True) after a registration the server holds, ledger(False) once none is left
        # (hicache_umbp.clients.reaper: what a crashed process leaves mapped is released).
        self._ledger = ledger
        self._connect = connect
        self._identity = socket_identity(socket_path)
        self._client: Any = (
            connect(self.BACKGROUND_CONNECT_MS) if first_client is None else first_client
        )
        self._description = description or f"standalone server at unix:{socket_path}"
        self._registered: dict[int, int] = {}
        self._generation = 0  # bumped by every swap: a call knows whether it saw the last
        self._lock = threading.Lock()  # the registrations and the swap
        self._attempt = threading.Lock()  # one inline attempt / thread start at a time
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._warn = RateLimitedLog(log, log_interval_s)
        self.reconnects = 0
        self.last_reconnect_s: float | None = None  # failure seen -> new client in place
        self.last_connect_s: float | None = None  # ... of which the successful connect call

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
        with self._lock:  # recorded and forwarded together: a swap replays it or sees it
            self._registered[ptr] = size
            generation, client = self._generation, self._client
        try:
            ok: Any = client.register_memory(ptr, size)
        except Exception:
            del client
            if not self._reconnect(generation):
                raise
            ok = None
        else:
            del client
        if ok is not True and self._generation != generation:
            ok = self._client.register_memory(ptr, size)  # the swap may have run
        if ok is True:
            self._note(True)
        return ok is True

    def deregister_memory(self, ptr: int) -> None:
        with self._lock:
            self._registered.pop(ptr, None)
            empty = not self._registered
        self._client.deregister_memory(ptr)
        if empty:
            self._note(False)

    def _note(self, registered: bool) -> None:
        if self._ledger is None:
            return
        try:
            self._ledger(registered)
        except OSError as e:  # bookkeeping must never fail the data path
            self._warn.warn("ledger", "%s: registration ledger not updated: %r",
                            self._description, e)

    def flush(self) -> bool:
        return self._client.flush() is True

    def close(self) -> None:
        """Stop a running reconnect thread (the mori client closes when it is collected)."""
        self._closed.set()
        thread = self._thread
        if thread is not None:
            thread.join()

    # ------------------------------------------------------------------ reconnection

    def _run(self, name: str, failed: Callable[[Any, tuple[Any, ...]], bool], *args: Any) -> Any:
        generation, client = self._generation, self._client
        error: Exception | None = None
        result: Any = None
        try:
            result = getattr(client, name)(*args)
        except Exception as e:  # a dead server: re-raised below unless we reconnect
            error = e
        del client  # no reference may keep a dead server's client alive (see _reconnect)
        if error is None and not failed(result, args):
            return result
        if self._reconnect(generation):
            return getattr(self._client, name)(*args)
        if error is not None:
            raise error
        return result

    def _reconnect(self, failed_generation: int) -> bool:
        """True when a new client is in place (now or by an earlier call): the caller retries
        once. Otherwise a restarted server gets a background reconnect thread."""
        if self._generation != failed_generation:
            return True
        ident = socket_identity(self.socket_path)
        if ident is None or ident == self._identity or self._closed.is_set():
            return False  # the same server (a plain miss or refusal), or none yet
        if self._reconnecting() or not self._attempt.acquire(blocking=False):
            return False  # another thread is on it; fail fast
        try:
            if self._generation != failed_generation:
                return True
            if self._reconnecting():
                return False
            started = time.monotonic()
            # Let go of the dead server's client first: gRPC shares one subchannel per target
            # in the process, and the dead one's reconnect backoff (1 s, growing to 120 s
            # while calls keep failing) would hold up the new client too. Measured on 1.2.4:
            # with the old client kept, a new one needed 2.8 s after 6 s of downtime and 8.8 s
            # after 20 s; with it dropped, 0.001 s.
            with self._lock:
                if not isinstance(self._client, _Disconnected):
                    self._client = _Disconnected(self._description)
            if self._swap_in(ident, self.INLINE_CONNECT_MS, started):
                return True
            self._thread = threading.Thread(
                target=self._reconnect_loop, args=(started,), daemon=True,
                name="hicache-umbp-reconnect",
            )
            self._thread.start()
            return False
        finally:
            self._attempt.release()

    def _reconnecting(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _reconnect_loop(self, started: float) -> None:
        while not self._closed.wait(self.RETRY_S):
            ident = socket_identity(self.socket_path)
            if ident is None or ident == self._identity:
                continue
            if self._swap_in(ident, self.BACKGROUND_CONNECT_MS, started):
                return

    def _swap_in(self, ident: SocketIdentity, timeout_ms: int, started: float) -> bool:
        """Connect (without holding a lock), register every buffer, swap."""
        t0 = time.monotonic()
        try:
            client = self._connect(timeout_ms)
        except Exception as e:
            self._warn.warn("reconnect_pending", "%s restarted and is not answering yet (%r); "
                            "retrying in the background", self._description, e)
            return False
        connect_s = time.monotonic() - t0
        with self._lock:  # a registration now is replayed here or lands on the new client
            refused = []
            for ptr, size in list(self._registered.items()):
                try:
                    ok: Any = client.register_memory(ptr, size)
                except Exception as e:
                    ok = e
                if ok is not True:
                    refused.append((ptr, ok))
            self._client, self._identity = client, ident
            self._generation += 1
            self.reconnects += 1
            self.last_connect_s = connect_s
            self.last_reconnect_s = time.monotonic() - started
        if self._registered:
            self._note(True)  # the new client's id must be in the ledger too
        log.warning(
            "%s was restarted: new client in place %.3f s after the first failure (connect "
            "%.3f s), %d buffer(s) registered again%s", self._description,
            self.last_reconnect_s, connect_s, len(self._registered) - len(refused),
            f"; refused: {refused}" if refused else "",
        )
        return True


class _Disconnected:
    """Stands in for the client while a restarted server is reconnected: fails fast."""

    def __init__(self, description: str) -> None:
        self._description = description

    def batch_put_from_ptr(self, keys: Sequence[str], *_: Any) -> list[bool]:
        return [False] * len(keys)

    batch_get_into_ptr = batch_put_from_ptr

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return [False] * len(keys)

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        return 0

    def register_memory(self, ptr: int, size: int) -> bool:
        raise RuntimeError(f"{self._description}: reconnecting after a restart")

    def deregister_memory(self, ptr: int) -> None:
        return None

    def flush(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{name}: {self._description} is reconnecting after a restart")


def _any_false(result: Any, args: tuple[Any, ...]) -> bool:
    return not isinstance(result, list) or not all(r is True for r in result)
