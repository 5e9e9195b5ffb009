"""The real UMBP clients: mori's ``UMBPClient`` opened for one rank and one medium as the
configuration asks, with what the store must respect when calling it (:class:`OpenedClient`).

Every client satisfies the store's :class:`~hicache_umbp.store.protocol.UMBPClientLike`; mori is
imported lazily (:mod:`.runtime`), so this package imports without it.

What amd-mori 1.2.4 really does (measured on CPU in the engine environment, make engine-env;
pinned by tests/backend/test_client_contract_mori.py):

* **Embedded DRAM** is ``UMBPConfig()`` with ``dram.capacity_bytes`` and ``ssd.enabled=False``.
  ``get_deployment_mode()`` reports ``Distributed`` even so (1.2.4 runs its local path through
  the pool client). Eviction: after a put call, when used >= 0.9 x capacity, LRU keys are
  evicted down to 0.7 x capacity; inside one batch nothing is evicted, so a batch larger than
  the free space partly fails. Recently read keys are protected by a read lease.
* **Embedded SSD.** ``UMBPConfig()`` with only ``ssd.*`` set keeps pages in DRAM and never
  writes the SSD directory (the "local mode ignores SSD" trap). What works is the *SSD node*
  configuration: ``config.distributed = UMBPDistributedConfig()`` with ``medium = SSD`` and no
  master address; pages then land in ``<storage_dir>/segment_<n>.log`` and are read back from
  there. A put batch goes through ``ssd_staging_buffer_slots`` staging slots (16 by default)
  of ``dram_page_size`` bytes each (64 KiB by default!): one batch stores at most
  ``slots x dram_page_size`` bytes, the rest fail. We set ``dram_page_size`` to the largest
  value size and keep batches <= ``slots`` keys.
* **Standalone**: ``umbp_standalone_server unix:<path>`` (started under the trixie loader, see
  :func:`.runtime.mori_loader_prefix`) serves one medium configured by ``UMBP_*`` env
  (:func:`hicache_umbp.contract.mori_env.standalone_server_env`); a client sets
  ``standalone_process.address``. Only registered, memfd-backed buffers work
  (``UMBPHostBufferBacking.AnonymousShm``): a put from unregistered memory returns False.
  An SSD server refuses to start with ``UMBP_DRAM_CAPACITY`` 0 and stages puts in that DRAM,
  so it gets ``slots x value_bytes`` of it.
* **Distributed** needs ``umbp_master`` and an RDMA NIC: refused with a clear error when
  ``/sys/class/infiniband`` is empty, and not implemented by this backend otherwise.
* Everywhere: gets need the exact stored size; keys are write-once (a re-put returns True and
  keeps the old bytes); a key repeated inside one batch fails the second time; mismatched list
  lengths fail every entry; ``clear()`` makes later puts fail.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract.media import Medium
from ..contract.mori_env import SSD_READ_LEASE_ENV, SSD_READ_LEASE_MS
from ..contract.paths import standalone_socket_path
from ..contract.settings import BY_KEY, ConfigError
from ..contract.staging import SSD_STAGING_SLOTS, SSD_VALUE_BYTES_DEFAULT, ssd_keys_per_call
from ..store.protocol import UMBPClientLike
from . import reaper
from .guards import ReconnectingClient, SerializedClient
from .runtime import MoriUnavailableError, import_umbp, require_distributed

if TYPE_CHECKING:
    from ..contract.settings import RankConfig

log = logging.getLogger(__name__)

class StandaloneServerUnavailableError(RuntimeError):
    """The standalone server's socket did not appear, or the client could not connect."""


@dataclass
class OpenedClient:
    """A client plus what the store must respect when calling it."""

    client: UMBPClientLike
    medium: Medium
    mode: str
    #: Most keys one batch call may carry (None: no limit); the SSD path has 16 staging slots.
    max_batch_keys: int | None
    #: Largest single value in bytes (None: no limit below capacity).
    max_value_bytes: int | None
    description: str
    _on_close: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Flush and run the close hooks once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.flush()
        finally:
            for hook in self._on_close:
                hook()


def make_client(
    rank: RankConfig, medium: Medium, *, ssd_value_bytes: int = SSD_VALUE_BYTES_DEFAULT
) -> OpenedClient:
    """The real mori client for one rank and one medium, as the configuration asks.

    ``ssd_value_bytes`` is the largest value the SSD path must take (one page part); it sizes
    the SSD staging slots (embedded SSD only; a standalone SSD server is sized by its env).
    """
    cfg = rank.config
    if medium not in ("dram", "ssd"):
        raise ValueError(f"medium must be 'dram' or 'ssd', got {medium!r}")
    if cfg.umbp_mode == "distributed":
        require_distributed()
    if cfg.umbp_mode == "standalone":
        return make_standalone_client(
            standalone_socket_path(cfg.umbp_socket_dir, medium),
            medium,
            wait_s=cfg.umbp_standalone_wait_s,
            value_bytes=ssd_value_bytes,
            slot_bytes=cfg.umbp_ssd_slot_bytes,
        )
    if medium == "dram":
        if rank.dram_bytes <= 0:
            raise ConfigError([f"rank {rank.local_rank}: embedded DRAM tier needs "
                               f"umbp_dram_bytes > 0, got {rank.dram_bytes}"])
        try:
            return make_embedded_dram_client(
                rank.dram_bytes,
                numa_node=rank.dram_numa,
                hugepage_bytes=cfg.umbp_dram_hugepage_bytes,
                prefault=cfg.umbp_dram_prefault,
            )
        except (RuntimeError, OSError, MemoryError) as e:
            if isinstance(e, MoriUnavailableError):
                raise
            raise _refused("umbp_dram_bytes", rank, rank.dram_bytes,
                           "mori could not create the embedded DRAM tier", e) from e
    problems = []
    if not cfg.umbp_ssd_enabled:
        problems.append("umbp_ssd_enabled is false")
    if not rank.ssd_dir:
        problems.append("umbp_ssd_dir is empty")
    if rank.ssd_bytes <= 0:
        problems.append(f"umbp_ssd_bytes must be > 0, got {rank.ssd_bytes}")
    if problems:
        raise ConfigError([f"rank {rank.local_rank}: embedded SSD tier: {p}" for p in problems])
    try:
        return make_embedded_ssd_client(
            rank.ssd_dir,
            rank.ssd_bytes,
            io_backend=cfg.umbp_ssd_io_backend,
            durability=cfg.umbp_ssd_durability,
            max_value_bytes=ssd_value_bytes,
        )
    except (RuntimeError, OSError, MemoryError) as e:
        if isinstance(e, MoriUnavailableError):
            raise
        raise _refused("umbp_ssd_bytes", rank, rank.ssd_bytes,
                       f"mori could not create the embedded SSD tier in {rank.ssd_dir} "
                       f"(16 staging slots of {ssd_value_bytes} bytes in memory)", e) from e


def _refused(key: str, rank: RankConfig, value: int, what: str, e: BaseException
             ) -> ConfigError:
    """A tier this node could not create, as a configuration error naming the setting."""
    s = BY_KEY[key]
    return ConfigError([f"{key} ({s.env}) of rank {rank.local_rank} = {value} bytes: {what}: "
                        f"{e!r}; the container (its memory limit, the node) cannot hold it"])


def make_embedded_dram_client(
    capacity_bytes: int,
    *,
    numa_node: int = -1,
    hugepage_bytes: int = 0,
    prefault: bool = True,
) -> OpenedClient:
    """An in-process mori DRAM pool of ``capacity_bytes`` (SSD explicitly off)."""
    if capacity_bytes <= 0:
        raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
    umbp = import_umbp()
    config = umbp.UMBPConfig()
    config.dram.capacity_bytes = int(capacity_bytes)
    config.dram.prefault = bool(prefault)
    config.dram.use_hugepages = hugepage_bytes > 0
    if hugepage_bytes > 0:
        config.dram.hugepage_size = int(hugepage_bytes)
    if numa_node >= 0:
        config.dram.numa_nodes = [int(numa_node)]
    config.ssd.enabled = False
    return OpenedClient(
        client=umbp.UMBPClient(config),
        medium="dram",
        mode="embedded",
        max_batch_keys=None,
        max_value_bytes=None,
        description=f"embedded mori DRAM {capacity_bytes} B (numa {numa_node}, "
        f"hugepage {hugepage_bytes or '4 KiB'})",
    )


def make_embedded_ssd_client(
    ssd_dir: str,
    capacity_bytes: int,
    *,
    io_backend: str = "io_uring",
    durability: str = "relaxed",
    staging_slots: int = SSD_STAGING_SLOTS,
    max_value_bytes: int = SSD_VALUE_BYTES_DEFAULT,
) -> OpenedClient:
    """An in-process mori SSD node writing segment logs under ``ssd_dir`` (no DRAM tier).

    Uses the SSD node configuration (``distributed.medium = SSD``, no master): the only
    embedded configuration of 1.2.4 that really writes pages to the SSD directory.
    """
    if capacity_bytes <= 0:
        raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
    if io_backend not in ("io_uring", "posix"):
        raise ValueError(f"io_backend must be 'io_uring' or 'posix', got {io_backend!r}")
    if durability not in ("relaxed", "strict"):
        raise ValueError(f"durability must be 'relaxed' or 'strict', got {durability!r}")
    if staging_slots < 1 or max_value_bytes < 1:
        raise ValueError("staging_slots and max_value_bytes must be >= 1")
    # An operator-set value wins; otherwise the short lease (see SSD_READ_LEASE_MS).
    os.environ.setdefault(SSD_READ_LEASE_ENV, str(SSD_READ_LEASE_MS))
    umbp = import_umbp()
    os.makedirs(ssd_dir, exist_ok=True)
    leftover = _segment_bytes(ssd_dir)
    if leftover:
        log.warning(
            "%d bytes of SSD cache from an earlier process are in %s: amd-mori 1.2.4 discards "
            "them now (its SSD tier keeps no index on disk), so the SSD tier starts cold "
            "(docs/operations.md, 'Warm cache across restarts')", leftover, ssd_dir,
        )
    config = umbp.UMBPConfig()
    config.dram.capacity_bytes = 0
    config.ssd.enabled = True
    config.ssd.storage_dir = ssd_dir
    config.ssd.capacity_bytes = int(capacity_bytes)
    config.ssd.io.backend = (
        umbp.UMBPIoBackend.IoUring if io_backend == "io_uring" else umbp.UMBPIoBackend.Posix
    )
    modes = umbp.UMBPDurabilityMode
    config.ssd.durability.mode = modes.Strict if durability == "strict" else modes.Relaxed
    node = umbp.UMBPDistributedConfig()
    node.medium = umbp.UMBPMedium.SSD
    node.dram_page_size = int(max_value_bytes)
    node.ssd_staging_buffer_slots = int(staging_slots)
    node.ssd_staging_buffer_size = int(staging_slots) * int(max_value_bytes)
    config.distributed = node
    return OpenedClient(
        client=SerializedClient(umbp.UMBPClient(config)),
        medium="ssd",
        mode="embedded",
        max_batch_keys=staging_slots,
        max_value_bytes=max_value_bytes,
        description=f"embedded mori SSD node {capacity_bytes} B at {ssd_dir} ({io_backend}, "
        f"{durability}, {staging_slots} x {max_value_bytes} B staging)",
    )


def _segment_bytes(ssd_dir: str) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(ssd_dir)
                   if e.name.startswith("segment_") and e.is_file())
    except OSError:
        return 0


_clients_lock = threading.Lock()
_clients_opened = 0


def _count_standalone_client() -> None:
    global _clients_opened
    with _clients_lock:
        _clients_opened += 1


def standalone_clients_opened() -> int:
    """mori standalone clients this process created (mori numbers them ``umbp-<pid>-<n>``)."""
    with _clients_lock:
        return _clients_opened


def make_standalone_client(
    socket_path: str,
    medium: Medium,
    *,
    wait_s: float = 120.0,
    poll_s: float = 0.05,
    max_batch_keys: int | None = None,
    value_bytes: int = SSD_VALUE_BYTES_DEFAULT,
    slot_bytes: int = SSD_VALUE_BYTES_DEFAULT,
) -> OpenedClient:
    """A client of the ``umbp_standalone_server`` listening on ``unix:<socket_path>``.

    Waits up to ``wait_s`` for the socket to appear (the sidecar may start after the engine).
    Buffers given to it must be registered and memfd-backed (see
    :mod:`hicache_umbp.hostmem.allocator`). The client reconnects (and registers its buffers again)
    when the server is restarted (:class:`~hicache_umbp.clients.guards.ReconnectingClient`). For
    ``medium == "ssd"`` the server was started with ``slot_bytes`` staging slots
    (``umbp_ssd_slot_bytes``): a batch holds at most
    :func:`~hicache_umbp.contract.staging.ssd_keys_per_call` values of ``value_bytes``
    (``max_batch_keys`` overrides it), and calls are serialized.
    """
    deadline = time.monotonic() + max(0.0, wait_s)
    while not os.path.exists(socket_path):
        if time.monotonic() >= deadline:
            raise StandaloneServerUnavailableError(
                f"standalone UMBP {medium} server socket {socket_path} did not appear within "
                f"{wait_s:g} s (umbp_standalone_wait_s); is the umbp-{medium} sidecar running "
                "and is umbp_socket_dir shared with it?"
            )
        time.sleep(poll_s)
    umbp = import_umbp()

    def connect(timeout_ms: int = 1000) -> Any:
        _count_standalone_client()
        config = umbp.UMBPConfig()
        proc = umbp.UMBPStandaloneProcessConfig()
        proc.address = f"unix:{socket_path}"
        proc.auto_start = False
        proc.startup_timeout_ms = timeout_ms
        config.standalone_process = proc
        return umbp.UMBPClient(config)

    first_timeout_ms = max(1000, int(max(0.0, deadline - time.monotonic()) * 1000))
    description = f"standalone mori {medium} server at unix:{socket_path}"
    try:
        first = connect(first_timeout_ms)
    except Exception as exc:
        raise StandaloneServerUnavailableError(
            f"cannot connect to the standalone UMBP {medium} server at unix:{socket_path}: {exc}"
        ) from exc
    def ledger(registered: bool) -> None:
        pid = os.getpid()
        if registered:
            reaper.record(socket_path, pid, standalone_clients_opened())
        else:
            reaper.forget(socket_path, pid)

    reconnecting = ReconnectingClient(
        socket_path, connect, first_client=first, description=description, ledger=ledger
    )
    client: UMBPClientLike = reconnecting
    max_value_bytes = None
    if medium == "ssd":
        if max_batch_keys is None:
            max_batch_keys = ssd_keys_per_call(value_bytes, slot_bytes)
        max_value_bytes = SSD_STAGING_SLOTS * slot_bytes
        client = SerializedClient(client)
    return OpenedClient(
        client=client,
        medium=medium,
        mode="standalone",
        max_batch_keys=max_batch_keys,
        max_value_bytes=max_value_bytes,
        description=description,
        _on_close=[reconnecting.close],
    )
