"""Standalone mode: wait until the ``umbp_standalone_server`` sidecars accept connections, then
release what a previous engine process of this pod left registered with them
(:mod:`hicache_umbp.clients.reaper`: mori keeps a dead client's host pool mapped, and with
it the pod's hugepages, until the sidecar exits).

Each sidecar serves one medium at ``unix:<socket_dir>/<medium>.sock`` (``dram``, plus ``ssd``
when the SSD tier is on). mori 1.2.4's server listens on two sockets for that address: the gRPC
socket ``<medium>.sock`` and the memfd-passing socket ``<medium>.sock.fd.sock``. The socket
directory is an ``emptyDir`` shared with the sidecars, so a socket *file* may be left over from a
sidecar that has since died: only a successful ``connect()`` counts as ready (a stale file answers
``ECONNREFUSED``). A connect-and-close is harmless to the server (measured against the real
binary: it logs nothing and keeps serving).
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..clients import reaper
from ..contract.media import Medium, l3_media
from ..contract.paths import standalone_socket_path
from ..contract.settings import BY_KEY, StoreConfig
from .errors import LaunchError
from .noderoot import NodeRoot

FD_SOCKET_SUFFIX = ".fd.sock"
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 1.0


def media(store: StoreConfig) -> tuple[Medium, ...]:
    """The media the sidecars serve: DRAM always, SSD when the SSD tier is enabled on the mori
    engine (:func:`hicache_umbp.contract.media.l3_media`); the hicache engine's SSD tier is in
    the engine process, so then only the DRAM sidecar's socket is waited for."""
    return l3_media("standalone", dram=True,
                    ssd=store.umbp_ssd_enabled and store.umbp_ssd_engine == "mori")


def socket_paths(store: StoreConfig) -> tuple[str, ...]:
    """Every node path that must accept a connection before SGLang starts: the path the store
    connects to (:func:`hicache_umbp.clients.factories.standalone_socket_path`) and its fd
    socket."""
    out: list[str] = []
    for m in media(store):
        base = standalone_socket_path(store.umbp_socket_dir, m)
        out += [base, base + FD_SOCKET_SUFFIX]
    return tuple(out)


def _state(host_path: str) -> str | None:
    """``None`` when a UNIX socket at ``host_path`` accepts a connection, else why not."""
    if not os.path.exists(host_path):
        return "no socket file"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(host_path)
    except OSError as e:
        name = errno.errorcode.get(e.errno or 0, str(e.errno))
        if e.errno == errno.ECONNREFUSED:
            return "socket file present but nobody listens (ECONNREFUSED: stale socket)"
        return f"connect failed ({name}: {e.strerror})"
    finally:
        s.close()
    return None


@dataclass(frozen=True)
class StandaloneResult:
    sockets: tuple[str, ...]
    waited_s: float
    polls: int

    def as_dict(self) -> dict[str, object]:
        return {"sockets": list(self.sockets), "waited_s": round(self.waited_s, 3),
                "polls": self.polls}


def wait_for_sidecars(
    root: NodeRoot,
    store: StoreConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StandaloneResult:
    """Block until every sidecar socket accepts a connection, or raise after the timeout."""
    paths = socket_paths(store)
    timeout = store.umbp_standalone_wait_s
    start = clock()
    delay = _POLL_FIRST_S
    polls = 0
    while True:
        polls += 1
        pending = {p: why for p in paths if (why := _state(str(root.path(p)))) is not None}
        if not pending:
            return StandaloneResult(paths, clock() - start, polls)
        elapsed = clock() - start
        if elapsed >= timeout:
            lines = "; ".join(f"{p}: {why}" for p, why in pending.items())
            raise LaunchError(
                "StandaloneServerUnavailable",
                f"umbp_standalone_server sidecar not ready after {elapsed:.1f} s "
                f"({BY_KEY['umbp_standalone_wait_s'].env}={timeout:g}) in "
                f"{BY_KEY['umbp_socket_dir'].env}={store.umbp_socket_dir!r}: {lines}. "
                f"Check the sidecar containers' logs and that they share the socket volume",
            )
        sleep(min(delay, max(timeout - elapsed, 0.0)))
        delay = min(delay * 2, _POLL_MAX_S)


def release_dead_registrations(
    root: NodeRoot, store: StoreConfig, *, dry_run: bool = False
) -> list[dict[str, object]]:
    """Deregister every client a previous engine process left in the sidecars' ledger.

    Runs before the hugepage check: the memory it frees is what this engine's pool needs. With
    ``dry_run`` it only reports what it would release.
    """
    out: list[dict[str, object]] = []
    for m in media(store):
        path = str(root.path(standalone_socket_path(store.umbp_socket_dir, m)))
        if dry_run:
            out += [{"medium": m, "pid": pid, "clients": opened, "released": False}
                    for _, pid, opened in reaper.pending(path)]
            continue
        try:
            reaped = reaper.reap(path)
        except reaper.ReapError as e:
            raise LaunchError(
                "StandaloneServerUnavailable",
                f"the umbp-{m} sidecar did not release the host pool a previous engine "
                f"process registered ({e}); restart the pod to free its memory") from e
        out += [{"medium": m, "pid": r.pid, "clients": len(r.client_ids), "released": True}
                for r in reaped]
    return out
