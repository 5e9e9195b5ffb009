"""The SSD tier as a UMBP client: pages striped over drives by key, each batch in parallel.

:class:`DiskStore` satisfies :class:`~hicache_umbp.store.protocol.UMBPClientLike` with mori's
semantics where the store relies on them (write-once keys; a get needs the exact size; a key
repeated in one batch fails the second time; mismatched lists fail every entry) and with what
mori's SSD node lacks:

* every rank of the pod opens the same drives (the index is shared), so a page is stored once
  per pod: MLA pages, the same on every rank, once instead of TP times;
* a full tier evicts its least recently used pages (per set of slots) instead of refusing, and a
  failing disk makes a put *not stored* (False, counted, logged at a bounded rate) -- never
  acknowledged then lost; a read error or a page overwritten while it was read is a miss;
* it survives restarts: the index and the data are files, opened again as they are.

Each drive runs its own I/O threads; a batch is split by drive and the drives work at once.
Nothing here raises into the caller on the data path: errors become ``False`` entries.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import TypeVar

from ..contract.settings import BY_KEY, ConfigError
from ..store.ratelimit import RateLimitedLog
from .drive import Drive, DriveGeometry, geometry
from .index import Slot
from .layout import identity_of, key_digest, slot_bytes_for

__all__ = ["DiskStats", "DiskStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class DiskStats:
    """Counters of one process's use of the tier (``pages``/``capacity`` are the pod's)."""

    hits: int = 0  # keys read back
    misses: int = 0  # keys asked for and not served (absent, wrong size, error, overwritten)
    read_bytes: int = 0
    read_ns: int = 0  # wall time of the read batches that moved bytes
    written_keys: int = 0
    written_bytes: int = 0
    write_ns: int = 0
    evictions: int = 0  # committed pages whose slot a put reused
    write_errors: int = 0  # keys not stored: the disk failed the write
    write_busy: int = 0  # keys not stored: every way of the set was being written
    read_errors: int = 0  # keys missed because the disk failed the read
    overwritten: int = 0  # keys missed because their slot was reused while being read
    pages: int = 0  # committed slots on the drives (counted every 10 s, this process's puts
    #                 and evictions in between)
    capacity: int = 0  # slots on the drives
    direct_ios: int = 0  # page transfers straight between the caller's memory and the disk
    buffered_ios: int = 0  # ... through the page cache (unaligned page, or no O_DIRECT)


_Item = tuple[int, bytes, int, int]  # position in the batch, digest, pointer, size


class DiskStore:
    """The tier over ``drives`` (see the module docstring)."""

    def __init__(self, drives: Sequence[Drive], *, log_interval_s: float = 30.0) -> None:
        if not drives:
            raise ValueError("a disk store needs at least one drive")
        self.drives = list(drives)
        self._warn = RateLimitedLog(log, log_interval_s)
        self._lock = threading.Lock()
        self._stats = DiskStats(capacity=sum(d.geo.nslots for d in self.drives))
        self._counted_at = 0.0
        self._closed = False

    @classmethod
    def open(
        cls,
        directories: Sequence[str],
        *,
        capacity_bytes: int,
        value_bytes: int,
        identity: str,
        io_threads: int = 8,
        direct_io: bool = True,
        durable: bool = False,
        log_interval_s: float = 30.0,
    ) -> DiskStore:
        """Open (create, or find again) the tier on ``directories``, one per drive, each holding
        ``capacity_bytes / len(directories)`` of slots for values up to ``value_bytes``.
        ``identity`` names what the pages are (the key fields common to the pod)."""
        if not directories:
            s = BY_KEY["umbp_ssd_dir"]
            raise ConfigError([f"{s.key} ({s.env}) names no directory for the SSD tier"])
        slot = slot_bytes_for(value_bytes)
        geo = geometry(slot, capacity_bytes // len(directories))
        full = identity_of("hicache/v2", identity, geo.slot_bytes, geo.nslots)
        opened: list[Drive] = []
        try:
            for i, d in enumerate(directories):
                opened.append(Drive(d, geo, f"{full};drive={i}/{len(directories)}",
                                    io_threads=io_threads, direct_io=direct_io, durable=durable))
        except BaseException:
            for drive in opened:
                drive.close()
            raise
        store = cls(opened, log_interval_s=log_interval_s)
        store._count(force=True)
        log.info("SSD tier: %d drive(s) %s, %d slots of %d bytes each (%d pages held)%s",
                 len(opened), ", ".join(directories), geo.nslots, geo.slot_bytes,
                 store._stats.pages, "" if all(d.direct for d in opened) else
                 "; page cache (no O_DIRECT) on some drive")
        return store

    @property
    def geometry(self) -> DriveGeometry:
        return self.drives[0].geo

    # -------------------------------------------------------------------------- UMBPClientLike

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        """Claim a slot per key and hand its write to the drive's threads at once (claims of
        later keys overlap the writes of earlier ones); relaxed durability commits each page
        in its thread as soon as it is on the drive, strict after one fdatasync + msync per
        drive."""
        n = len(keys)
        if n == 0 or len(ptrs) != n or len(sizes) != n or self._closed:
            return [False] * n
        t0 = time.perf_counter_ns()
        out = [False] * n
        claimed: list[tuple[int, Drive, Slot, bytes, int]] = []
        seen: set[bytes] = set()
        evicted = busy = 0
        for i, key in enumerate(keys):
            size = int(sizes[i])
            if not 0 < size <= self.geometry.slot_bytes:
                self._warn.warn("put_size", "a value of %d bytes does not fit the SSD tier's "
                                "%d-byte slots", size, self.geometry.slot_bytes)
                continue
            digest = key_digest(key)
            if digest in seen:  # mori's rule: a key repeated in one batch fails the 2nd time
                continue
            seen.add(digest)
            drive = self._drive_of(digest)
            try:
                got, ev = drive.index.claim(digest, size)
            except OSError as e:
                self._warn.warn("claim", "SSD index lock failed: %r", e)
                continue
            if got == "present":
                out[i] = True
            elif got == "busy" or got is None:
                busy += 1
            else:
                assert isinstance(got, Slot)
                evicted += ev
                claimed.append((i, drive, got, digest, int(ptrs[i])))
        results = _in_drive_threads([
            (drive, functools.partial(self._write_one, drive, slot, digest, ptr))
            for _i, drive, slot, digest, ptr in claimed])
        errors = committed = stored_bytes = 0
        to_commit: dict[Drive, list[tuple[int, Slot, bytes]]] = {}
        for (i, drive, slot, digest, _ptr), res in zip(claimed, results, strict=True):
            err = res if not isinstance(res, BaseException) else repr(res)
            if err == "committed":
                out[i] = True
                committed += 1
                stored_bytes += slot.size
            elif err == "written":
                to_commit.setdefault(drive, []).append((i, slot, digest))
            elif err is not None:
                errors += 1
                self._warn.warn("write", "SSD tier %s: a page write failed (%s); the page is "
                                "not stored", drive.directory, err)
        for drive, items in to_commit.items():  # strict durability
            try:
                drive.sync()
            except OSError as e:
                self._warn.warn("sync", "SSD tier %s: fdatasync failed: %r", drive.directory, e)
                for _i, slot, _d in items:
                    drive.index.release(slot)
                errors += len(items)
                continue
            for i, slot, digest in items:
                if drive.index.commit(slot, digest):
                    out[i] = True
                    committed += 1
                    stored_bytes += slot.size
            try:
                drive.index.sync()
            except OSError as e:
                self._warn.warn("sync", "SSD tier %s: msync failed: %r", drive.directory, e)
        with self._lock:
            s = self._stats
            s.written_keys += committed
            s.written_bytes += stored_bytes
            s.write_ns += time.perf_counter_ns() - t0 if claimed else 0
            s.evictions += evicted
            s.pages += committed - evicted
            s.write_errors += errors
            s.write_busy += busy
        return out

    @staticmethod
    def _write_one(drive: Drive, slot: Slot, digest: bytes, ptr: int) -> str | None:
        """In a drive thread: "committed" (relaxed), "written" (strict: the caller commits after
        syncing), None when the slot changed hands meanwhile, else why the write failed (the
        slot is freed again)."""
        try:
            if drive.durable:
                drive.index.sync_entry(slot.slot)
            drive.pwrite(slot, ptr)
        except Exception as e:
            drive.index.release(slot)
            return os.strerror(e.errno) if isinstance(e, OSError) and e.errno else repr(e)
        if drive.durable:
            return "written"
        return "committed" if drive.index.commit(slot, digest) else None

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        n = len(keys)
        if n == 0 or len(ptrs) != n or len(sizes) != n or self._closed:
            return [False] * n
        t0 = time.perf_counter_ns()
        out = [False] * n
        reads: list[tuple[int, Drive, Slot, bytes, int]] = []
        for i, key in enumerate(keys):  # every lookup before any I/O: no GIL contention
            digest = key_digest(key)
            drive = self._drive_of(digest)
            found = drive.index.find(digest)
            if found is not None and found.size == int(sizes[i]):
                reads.append((i, drive, found, digest, int(ptrs[i])))
        results = _in_drive_threads([
            (drive, functools.partial(self._read_one, drive, found, digest, ptr))
            for _i, drive, found, digest, ptr in reads])
        got_bytes = errors = overwritten = 0
        for (i, drive, found, _digest, _ptr), res in zip(reads, results, strict=True):
            if isinstance(res, BaseException):
                errors += 1
                err = os.strerror(res.errno) if isinstance(res, OSError) and res.errno else res
                self._warn.warn("read", "SSD tier %s: a page read failed (%s); served as a "
                                "miss", drive.directory, err)
            elif res:
                out[i] = True
                got_bytes += found.size
            else:
                overwritten += 1
        with self._lock:
            s = self._stats
            s.hits += sum(out)
            s.misses += n - sum(out)
            s.read_bytes += got_bytes
            s.read_ns += time.perf_counter_ns() - t0 if reads else 0
            s.read_errors += errors
            s.overwritten += overwritten
        return out

    @staticmethod
    def _read_one(drive: Drive, found: Slot, digest: bytes, ptr: int) -> bool:
        """In a drive thread: read, then True when the slot still held the page afterwards."""
        drive.pread(found, ptr)
        if not drive.index.still(found, digest):
            return False
        drive.index.touch(found.slot)
        return True

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        out = []
        for key in keys:
            digest = key_digest(key)
            out.append(self._drive_of(digest).index.find(digest) is not None)
        return out

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        for i, key in enumerate(keys):
            digest = key_digest(key)
            if self._drive_of(digest).index.find(digest) is None:
                return i
        return len(keys)

    def batch_remove(self, keys: Sequence[str]) -> list[bool]:
        """Free the pages of ``keys`` (True where one was stored): the tier in front removes
        the parts left of a page that lost one, to write it whole again."""
        out = []
        for key in keys:
            digest = key_digest(key)
            out.append(not self._closed and self._drive_of(digest).index.remove(digest))
        with self._lock:
            self._stats.pages -= sum(out)
        return out

    def touch_later(self, keys: Sequence[str]) -> None:
        """Mark ``keys`` used now, in a drive thread (never waits): a tier in front that served
        them keeps their SSD copies from looking cold, so the SSD's LRU follows real use."""
        if keys and not self._closed:
            with contextlib.suppress(RuntimeError):  # the pool is shutting down
                self.drives[0].submit(self._touch, list(keys))

    def _touch(self, keys: list[str]) -> None:
        for key in keys:
            digest = key_digest(key)
            index = self._drive_of(digest).index
            found = index.find(digest)
            if found is not None:
                index.touch(found.slot)

    def register_memory(self, ptr: int, size: int) -> bool:
        return True  # reads and writes go straight to the caller's pointers

    def deregister_memory(self, ptr: int) -> None:
        return None

    def flush(self) -> bool:
        """Strict durability: fdatasync and msync every drive. Relaxed: nothing to do (pages
        are on the device when a put returns, with O_DIRECT, and the index is in the page
        cache, which a process or pod restart keeps)."""
        ok = True
        for drive in self.drives:
            if not drive.durable:
                continue
            try:
                drive.sync()
            except OSError as e:
                self._warn.warn("flush", "SSD tier %s: flush failed: %r", drive.directory, e)
                ok = False
        return ok

    def clear(self) -> bool:
        for drive in self.drives:
            drive.index.clear()
        return True

    # -------------------------------------------------------------------------- lifecycle

    def disk_stats(self) -> DiskStats:
        self._count()
        with self._lock:
            out = DiskStats(**{f.name: getattr(self._stats, f.name) for f in fields(DiskStats)})
        out.direct_ios = sum(d.direct_ios for d in self.drives)
        out.buffered_ios = sum(d.buffered_ios for d in self.drives)
        return out

    def _count(self, force: bool = False) -> None:
        """Refresh the committed-page count (a scan of the index: at most every 10 s)."""
        now = time.monotonic()
        if not force and now - self._counted_at < 10.0:
            return
        self._counted_at = now
        pages = sum(d.index.counts()[0] for d in self.drives)
        with self._lock:
            self._stats.pages = pages

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for drive in self.drives:
            drive.close()

    def _drive_of(self, digest: bytes) -> Drive:
        return self.drives[int.from_bytes(digest[:8], "little") % len(self.drives)]


def _in_drive_threads(jobs: Sequence[tuple[Drive, Callable[[], T]]]) -> list[T | Exception]:
    """Run each job in its drive's threads: one task per I/O thread of the drive, each pulling
    the drive's next job until none is left (a future and a GIL hand-over per thread, not per
    page: per-page tasks made the threads fight the caller for the GIL; pulling, unlike a fixed
    share per thread, keeps one slow transfer from holding up a whole share). Results (or the
    exception a job raised) in the jobs' order."""
    out: list[T | Exception | None] = [None] * len(jobs)

    def run(idx: list[int], cursor: Iterator[int]) -> None:
        for k in cursor:  # itertools.count is atomic under the GIL: each k taken once
            if k >= len(idx):
                return
            j = idx[k]
            try:
                out[j] = jobs[j][1]()
            except Exception as e:  # reported per job, never into the caller
                out[j] = e

    by_drive: dict[Drive, list[int]] = {}
    for j, (drive, _job) in enumerate(jobs):
        by_drive.setdefault(drive, []).append(j)
    futures: list[Future[None]] = []
    for drive, idx in by_drive.items():
        cursor = itertools.count()
        futures += [drive.submit(run, idx, cursor)
                    for _ in range(min(drive.io_threads, len(idx)))]
    for fut in futures:
        fut.result()
    return out  # type: ignore[return-value]

