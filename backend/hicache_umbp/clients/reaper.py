"""Release the host pool a dead engine process left mapped in the standalone UMBP servers.

Why: an engine process registers its host pool (a memfd) with each ``umbp_standalone_server``
sidecar, which maps it for zero-copy puts and gets. mori 1.2.4 unmaps a client's memory only on
``DeregisterMemory`` or when the server exits: it has no crash detection or reaper (mori's own
``src/umbp/doc/design-standalone-process-mode.md``, "Known limitations"). SGLang ends its
scheduler processes with SIGKILL even on a graceful stop, and crashes, OOM kills and kubelet's
SIGKILL after the grace period never deregister either. Measured on mori 1.2.4: after one engine
restart in standalone mode the sidecars still held the whole 2 GB hugepage pool of the dead
engine, so the restarted engine found no free hugepages and crash-looped until the sidecars
were restarted (losing the L3 cache the sidecars exist to keep).

How: the store writes a ledger entry (``<socket dir>/.umbp-clients/<socket>@<pid>.json``: the
process id and how many mori clients it opened) when it registers memory with a sidecar, and
removes it after a clean deregistration. The launcher of the next engine, before it checks the
hugepages, sends ``DeregisterMemory`` for every client id such a process could have had (mori
names them ``umbp-<pid>-<n>``, ``n`` counting the process's clients from 0) and deletes the
entry. Deregistering an unknown id is a no-op on the server; the registration of a live client
is never touched, because the launcher runs before any engine process of this incarnation.

The RPC is made with the standard library (the backend core needs no gRPC package): one gRPC
unary call, HTTP/2 without TLS on the server's UNIX socket, headers as HPACK literals.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract.mori_env import STANDALONE_ADDRESS

log = logging.getLogger(__name__)

LEDGER_DIR = ".umbp-clients"
DEREGISTER_METHOD = "/umbp.UMBPStandalone/DeregisterMemory"
#: Client ids tried beyond the count a process recorded (mori may number lazily created clients).
ID_MARGIN = 2


class ReapError(RuntimeError):
    """The server could not be asked to release a dead client's memory."""


# ----------------------------------------------------------------------------- ledger


def _entry(socket_path: str, pid: int) -> Path:
    sock = Path(socket_path)
    return sock.parent / LEDGER_DIR / f"{sock.name}@{pid}.json"


def record(socket_path: str, pid: int, clients_opened: int) -> None:
    """Note that process ``pid`` has memory registered with the server at ``socket_path``."""
    path = _entry(socket_path, pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "clients_opened": clients_opened,
                               "socket": socket_path, "time": time.time()}))
    tmp.replace(path)


def forget(socket_path: str, pid: int) -> None:
    """The process deregistered everything cleanly: nothing to reap."""
    _entry(socket_path, pid).unlink(missing_ok=True)


@dataclass(frozen=True)
class Reaped:
    socket_path: str
    pid: int
    client_ids: tuple[str, ...]


def pending(socket_path: str) -> list[tuple[Path, int, int]]:
    """(entry, pid, clients opened) of every process that registered and never cleaned up."""
    sock = Path(socket_path)
    out = []
    for path in sorted((sock.parent / LEDGER_DIR).glob(f"{sock.name}@*.json")):
        try:
            data = json.loads(path.read_text())
            out.append((path, int(data["pid"]), int(data["clients_opened"])))
        except (OSError, ValueError, KeyError, TypeError):
            out.append((path, int(path.stem.rsplit("@", 1)[-1] or 0), 1))
    return out


def reap(socket_path: str, *, timeout_s: float = 5.0) -> list[Reaped]:
    """Ask the server to unmap every registration a dead process of the ledger left."""
    out = []
    for path, pid, opened in pending(socket_path):
        ids = tuple(f"umbp-{pid}-{n}" for n in range(max(opened, 1) + ID_MARGIN))
        for client_id in ids:
            deregister_client(socket_path, client_id, timeout_s=timeout_s)
        path.unlink(missing_ok=True)
        out.append(Reaped(socket_path, pid, ids))
    return out


def deregister_client(socket_path: str, client_id: str, *, timeout_s: float = 5.0) -> None:
    """``DeregisterMemory{client_id}``: the server unmaps every region of that client."""
    raw = client_id.encode()
    message = b"\x0a" + _varint(len(raw)) + raw  # field 1 (client_id), length-delimited
    grpc_unary_unix(socket_path, DEREGISTER_METHOD, message, timeout_s=timeout_s)


def around_builtin_registration(original: Callable[..., Any], store: Any, *args: Any,
                                **kwargs: Any) -> Any:
    """Ledger entry for SGLang's built-in ``mori`` backend (an AROUND hook on its
    ``UMBPStore.register_mem_pool_host``, installed by :mod:`hicache_umbp.sglang.hook`).

    That store registers the host pool with the standalone DRAM sidecar the same way and leaks
    it the same way when its process dies (measured in the pod tier); it opens one mori client
    per scheduler process. The address comes from its extra-config or ``UMBP_STANDALONE_ADDRESS``
    as the store itself reads it.
    """
    result = original(store, *args, **kwargs)
    if getattr(store, "_standalone_process_expected", False):
        extra = getattr(getattr(store, "storage_config", None), "extra_config", None) or {}
        address = str(extra.get("standalone_address") or
                      os.environ.get(STANDALONE_ADDRESS, ""))
        if address.startswith("unix:"):
            try:
                record(address[len("unix:"):], os.getpid(), clients_opened=1)
            except OSError as e:  # bookkeeping must never stop the engine
                log.warning("hicache_umbp: registration ledger not written for %s: %r",
                            address, e)
    return result


# ----------------------------------------------------------------------------- gRPC over h2c

_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = bytearray([limit]), value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _literal(name: str, value: str) -> bytes:
    # "Literal Header Field without Indexing -- New Name" (RFC 7541 6.2.2), no Huffman coding.
    n, v = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(n), 7) + n + _hpack_int(len(v), 7) + v


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ReapError("the server closed the connection mid-call")
        buf += chunk
    return bytes(buf)


def grpc_unary_unix(socket_path: str, method: str, message: bytes, *,
                    timeout_s: float = 5.0) -> bytes:
    """One gRPC unary call; returns the response message bytes (raises :class:`ReapError`)."""
    headers = b"".join(_literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", method),
        (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")))
    body = b"\x00" + struct.pack(">I", len(message)) + message
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(socket_path)
            sock.sendall(_PREFACE + _frame(_SETTINGS, 0, 0)
                         + _frame(_HEADERS, _END_HEADERS, 1, headers)
                         + _frame(_DATA, _END_STREAM, 1, body))
            response = bytearray()
            while True:
                head = _read_exact(sock, 9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = _read_exact(sock, length)
                if kind == _SETTINGS and not flags & _ACK:
                    sock.sendall(_frame(_SETTINGS, _ACK, 0))
                elif kind == _PING and not flags & _ACK:
                    sock.sendall(_frame(_PING, _ACK, 0, payload))
                elif kind in (_RST_STREAM, _GOAWAY) and (stream == 1 or kind == _GOAWAY):
                    raise ReapError(f"{method}: the server reset the call (frame {kind})")
                elif stream == 1 and kind == _DATA:
                    response += payload
                if stream == 1 and kind in (_DATA, _HEADERS) and flags & _END_STREAM:
                    break
    except OSError as e:
        raise ReapError(f"{method} on unix:{socket_path}: {e}") from e
    # A gRPC response message (5-byte prefix) means the call succeeded; an error status comes
    # as trailers only, without one.
    if len(response) < 5:
        raise ReapError(f"{method} on unix:{socket_path}: no response message (the server "
                        "answered with an error status)")
    size = struct.unpack(">I", bytes(response[1:5]))[0]
    return bytes(response[5:5 + size])
