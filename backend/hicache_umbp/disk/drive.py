"""One drive of the SSD tier: its data file, its slot index and its I/O threads.

Opening (:func:`open_drive`): every process takes a shared ``flock`` on ``owner.lock``; the first
one (the exclusive lock is free: no other process has the drive open) checks the superblock,
re-initialises a drive written for another identity or geometry, recovers slots a killed writer
left *writing*, and preallocates the data file (``posix_fallocate``: the space is really the
tier's, and a full filesystem fails here, at start, not on the data path). The free space is
checked first: a capacity the filesystem cannot hold is refused naming the setting and what is
free.

I/O: ``os.preadv``/``os.pwritev`` on a thread pool (they release the GIL; no io_uring, which
containerd's RuntimeDefault seccomp refuses), with ``O_DIRECT`` straight between the caller's
page and the disk when the page is 4 KiB-aligned in address and length (host pools are), through
the page cache (a second descriptor without ``O_DIRECT``) when it is not or when the filesystem
has no ``O_DIRECT`` (tmpfs). No staging buffer is ever allocated.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ..contract.settings import BY_KEY, ConfigError
from ..contract.units import fmt_bytes
from .index import Slot, SlotIndex
from .layout import (
    ALIGN,
    DATA_FILE,
    DIR_NAME,
    INDEX_FILE,
    LOCK_FILE,
    SUPERBLOCK_BYTES,
    WAYS,
    index_bytes_for,
    pack_superblock,
    unpack_identity,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class DriveGeometry:
    """What one drive holds: ``nslots`` slots of ``slot_bytes``, ``ways`` per set."""

    slot_bytes: int
    nslots: int
    ways: int

    @property
    def data_bytes(self) -> int:
        return self.slot_bytes * self.nslots

    @property
    def index_bytes(self) -> int:
        return index_bytes_for(self.nslots)


def geometry(slot_bytes: int, capacity_bytes: int) -> DriveGeometry:
    """Whole sets of :data:`WAYS` slots within ``capacity_bytes`` (one smaller set below)."""
    n = capacity_bytes // slot_bytes
    ways = WAYS if n >= WAYS else max(n, 1)
    return DriveGeometry(slot_bytes, n - n % ways if n else 0, ways)


def _allocated(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def check_free_space(directory: str, geo: DriveGeometry, base: str) -> None:
    """Refuse a capacity the filesystem cannot hold (what the tier's files already hold counts
    as free: a restarted pod keeps them)."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    have = _allocated(os.path.join(base, DATA_FILE)) + _allocated(os.path.join(base, INDEX_FILE))
    need = geo.data_bytes + geo.index_bytes
    if need > free + have:
        s = BY_KEY["umbp_ssd_bytes"]
        raise ConfigError([
            f"{s.key} ({s.env}): the SSD tier needs {fmt_bytes(need)} on {directory}, but the "
            f"volume has {fmt_bytes(free)} free (+ {fmt_bytes(have)} the tier already holds); "
            "lower the SSD capacity (spec.l3.ssd.capacity) or give the pod a larger volume"])


class Drive:
    """An opened drive (see the module docstring); thread-safe."""

    def __init__(self, directory: str, geo: DriveGeometry, identity: str, *,
                 io_threads: int, direct_io: bool, durable: bool) -> None:
        self.directory = directory
        self.geo = geo
        self.durable = durable
        self._direct_wanted = direct_io
        #: transfers straight between the caller's page and the disk / through the page cache
        self.direct_ios = self.buffered_ios = 0
        self._count_lock = threading.Lock()
        if geo.nslots < 1:
            s = BY_KEY["umbp_ssd_bytes"]
            raise ConfigError([f"{s.key} ({s.env}): {directory} would hold no page: its share "
                               f"of the capacity is below one slot of {fmt_bytes(geo.slot_bytes)}"])
        base = os.path.join(directory, DIR_NAME)
        os.makedirs(base, exist_ok=True)
        check_free_space(directory, geo, base)
        self._lock_fd = os.open(os.path.join(base, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o660)
        self._index_fd = self._data_fd = self._direct_fd = -1
        try:
            self.recovered, self.reinitialised = self._open(base, identity)
        except BaseException:
            self.close()
            raise
        self.index = SlotIndex(self._index_fd, geo.nslots, geo.ways)
        self.io_threads = io_threads
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="hicache-disk")

    # -------------------------------------------------------------------------- opening

    def _open(self, base: str, identity: str) -> tuple[int, str]:
        exclusive = True
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            exclusive = False
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)  # waits for the initialising process
        index_path = os.path.join(base, INDEX_FILE)
        data_path = os.path.join(base, DATA_FILE)
        self._index_fd = os.open(index_path, os.O_RDWR | os.O_CREAT, 0o660)
        self._data_fd = os.open(data_path, os.O_RDWR | os.O_CREAT, 0o660)
        geo = self.geo
        want = pack_superblock(identity, geo.slot_bytes, geo.nslots, geo.ways)
        have = os.pread(self._index_fd, SUPERBLOCK_BYTES, 0)
        seen = unpack_identity(have)
        same = have == want and os.fstat(self._index_fd).st_size >= geo.index_bytes
        reason = ""
        recovered = 0
        if not exclusive:
            if not same:
                raise ConfigError([
                    f"SSD tier {self.directory}: another process has this drive open for "
                    f"another store ({seen[1] if seen else 'unknown'}); this one is "
                    f"{identity}: give each deployment its own volume"])
        elif not same:
            if seen is None and not have.strip(b"\0"):
                reason = "new drive"
                log.info("SSD tier %s: new drive for %s", self.directory, identity)
            else:
                reason = f"written for {seen[1] if seen else 'an unknown format'}"
                log.warning("SSD tier %s: re-initialising (%s; now %s): its pages are "
                            "discarded", self.directory, reason, identity)
            os.ftruncate(self._index_fd, 0)
            os.ftruncate(self._index_fd, geo.index_bytes)
            os.pwrite(self._index_fd, want, 0)
            os.fsync(self._index_fd)
        if exclusive:
            self._preallocate(data_path)
            if same:
                scan = SlotIndex(self._index_fd, geo.nslots, geo.ways)
                recovered = scan.recover()
                scan.close()
                if recovered:
                    log.warning("SSD tier %s: %d slots a killed writer left half-written are "
                                "free again (never served)", self.directory, recovered)
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)  # others may open it now
        self._direct_fd = self._open_direct(data_path) if self._direct_wanted else -1
        return recovered, reason

    def _preallocate(self, data_path: str) -> None:
        size = os.fstat(self._data_fd).st_size
        if size > self.geo.data_bytes:
            os.ftruncate(self._data_fd, self.geo.data_bytes)
        try:
            os.posix_fallocate(self._data_fd, 0, self.geo.data_bytes)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                s = BY_KEY["umbp_ssd_bytes"]
                raise ConfigError([f"{s.key} ({s.env}): could not reserve "
                                   f"{fmt_bytes(self.geo.data_bytes)} in {data_path}: "
                                   f"{os.strerror(e.errno or 0)}"]) from e
            os.ftruncate(self._data_fd, self.geo.data_bytes)  # no fallocate: sparse

    def _open_direct(self, data_path: str) -> int:
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return -1
        try:
            return os.open(data_path, os.O_RDWR | flag)
        except OSError as e:
            log.warning("SSD tier %s: no O_DIRECT on this filesystem (%s); pages go through "
                        "the page cache", self.directory, os.strerror(e.errno or 0))
            return -1

    @property
    def direct(self) -> bool:
        return self._direct_fd >= 0

    # -------------------------------------------------------------------------- I/O

    def _fd_for(self, ptr: int, size: int) -> int:
        direct = self._direct_fd >= 0 and ptr % ALIGN == 0 and size % ALIGN == 0
        with self._count_lock:
            if direct:
                self.direct_ios += 1
            else:
                self.buffered_ios += 1
        return self._direct_fd if direct else self._data_fd

    def pread(self, slot: Slot, ptr: int) -> None:
        """Read ``slot`` into ``ptr`` (``slot.size`` bytes); raises OSError."""
        self._io(os.preadv, slot.slot, ptr, slot.size)

    def pwrite(self, slot: Slot, ptr: int) -> None:
        self._io(os.pwritev, slot.slot, ptr, slot.size)

    def _io(self, call: Callable[[int, list[memoryview], int], int], slot: int, ptr: int,
            size: int) -> None:
        fd = self._fd_for(ptr, size)
        offset = slot * self.geo.slot_bytes
        done = 0
        while done < size:
            view = memoryview((ctypes.c_char * (size - done)).from_address(ptr + done)).cast("B")
            n = call(fd, [view], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, f"short transfer at {done} of {size} bytes")
            done += n

    def sync(self) -> None:
        os.fdatasync(self._data_fd)
        self.index.sync()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
        index = getattr(self, "index", None)
        if index is not None:
            index.close()
        for fd in (self._direct_fd, self._data_fd, self._index_fd, self._lock_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._direct_fd = self._data_fd = self._index_fd = self._lock_fd = -1
