"""One drive's slot index: a memory-mapped file every rank of the pod shares.

Where a key lives: its SHA-256 picks a set of :data:`~.layout.WAYS` slots; the key may be in any
of them. A put *claims* a slot of the set (a free one, a dead writer's, else the set's least
recently used committed one: eviction), writes the data, then *commits* the entry. A get finds
the committed entry, reads the data, then checks the entry again: same key, still committed,
same generation. Every claim and every free bumps the generation, so a reader whose slot was
evicted and rewritten while it read sees another generation and reports a miss. That is how a
torn or overwritten page is never served, across threads and processes, without a lock on the
read path:

* writer: entry -> writing (generation + 1), pwrite data, entry -> committed;
* reader: entry committed (generation g), pread data, entry still committed with g.

A writer killed between the two steps leaves the entry *writing*; it is never read, and it is
free again once its writer is gone (pid no longer alive in the pod's PID namespace, which all
ranks share) or when the first process to open the drive recovers it (:meth:`recover`).

Mutations of a set take a ``lockf`` byte-range lock on the set's entries (ranks are processes)
under a per-index thread lock (``lockf`` locks belong to the process, not the thread).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Literal

from .layout import COMMITTED, ENTRY, ENTRY_BYTES, FREE, SUPERBLOCK_BYTES, WRITING

Claim = Literal["present", "busy"]
#: The state field's offset in an entry (little endian: its low byte comes first).
_STATE_OFFSET = 32


@dataclass(frozen=True)
class Slot:
    """A slot as one lookup saw it; ``gen`` is what a later :meth:`SlotIndex.still` checks."""

    slot: int
    gen: int
    size: int


def set_hash(digest: bytes) -> int:
    """The 64 bits of a key's digest that pick its set (modulo the sets; the first 8 bytes pick
    the drive): the trace model's served check maps pages to sets with it."""
    return int.from_bytes(digest[8:16], "little")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SlotIndex:
    """The entries of one drive's ``index.hcx`` (``fd`` open read-write, already sized)."""

    def __init__(self, fd: int, nslots: int, ways: int) -> None:
        if nslots < 1 or ways < 1 or nslots % ways:
            raise ValueError(f"nslots={nslots} must be a positive multiple of ways={ways}")
        self._fd = fd
        self.nslots = nslots
        self.ways = ways
        self.nsets = nslots // ways
        self._mm = mmap.mmap(fd, SUPERBLOCK_BYTES + nslots * ENTRY_BYTES, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self._lock = threading.Lock()

    # -------------------------------------------------------------------------- lookups

    def set_of(self, digest: bytes) -> int:
        return set_hash(digest) % self.nsets

    def _off(self, slot: int) -> int:
        return SUPERBLOCK_BYTES + slot * ENTRY_BYTES

    def _entry(self, slot: int) -> tuple[bytes, int, int, int, int, int, int]:
        return ENTRY.unpack_from(self._mm, self._off(slot))

    def find(self, digest: bytes) -> Slot | None:
        """The committed slot holding ``digest``, or None."""
        base = self.set_of(digest) * self.ways
        for slot in range(base, base + self.ways):
            d, state, gen, size, _stamp, _pid, _r = self._entry(slot)
            if state == COMMITTED and d == digest:
                return Slot(slot, gen, size)
        return None

    def still(self, found: Slot, digest: bytes) -> bool:
        """True when ``found`` still holds ``digest``, committed, in the same generation."""
        d, state, gen, size, _stamp, _pid, _r = self._entry(found.slot)
        return state == COMMITTED and gen == found.gen and d == digest and size == found.size

    def touch(self, slot: int) -> None:
        """Mark a slot used now (LRU); a plain store, racing writers only reorder the LRU."""
        self._mm[self._off(slot) + 48 : self._off(slot) + 56] = time.time_ns().to_bytes(8, "little")

    # -------------------------------------------------------------------------- mutations

    def _locked_set(self, set_no: int) -> _SetLock:
        return _SetLock(self, set_no)

    def claim(self, digest: bytes, size: int) -> tuple[Slot | Claim | None, bool]:
        """Claim a slot for ``digest``: (the slot, whether a committed page was evicted for it),
        ``"present"`` when the key is committed already (write-once), ``"busy"`` when another
        live writer is writing it, None when every way is being written."""
        set_no = self.set_of(digest)
        base = set_no * self.ways
        with self._locked_set(set_no):
            free = dead = lru = -1
            lru_stamp = 1 << 64
            for slot in range(base, base + self.ways):
                d, state, _gen, _size, stamp, pid, _r = self._entry(slot)
                if d == digest and state != FREE:
                    if state == COMMITTED:
                        return "present", False
                    if _alive(pid):
                        return "busy", False
                    dead = slot
                    break
                if state == FREE:
                    if free < 0:
                        free = slot
                elif state == WRITING:
                    if dead < 0 and not _alive(pid):
                        dead = slot
                elif stamp < lru_stamp:
                    lru, lru_stamp = slot, stamp
            victim = free if free >= 0 else dead if dead >= 0 else lru
            if victim < 0:
                return None, False
            evicted = victim == lru and free < 0 and dead < 0
            _d, _state, gen, _size, _stamp, _pid, _r = self._entry(victim)
            gen = (gen + 1) & 0xFFFFFFFF
            ENTRY.pack_into(self._mm, self._off(victim), digest, WRITING, gen, size,
                            time.time_ns(), os.getpid(), 0)
            return Slot(victim, gen, size), evicted

    def commit(self, claimed: Slot, digest: bytes) -> bool:
        """Writing -> committed, unless the slot changed hands meanwhile."""
        with self._locked_set(claimed.slot // self.ways):
            d, state, gen, size, _stamp, _pid, _r = self._entry(claimed.slot)
            if state != WRITING or gen != claimed.gen or d != digest:
                return False
            ENTRY.pack_into(self._mm, self._off(claimed.slot), digest, COMMITTED, gen, size,
                            time.time_ns(), 0, 0)
            return True

    def release(self, claimed: Slot) -> None:
        """Free a claimed slot whose write failed (a new generation)."""
        with self._locked_set(claimed.slot // self.ways):
            _d, state, gen, _size, _stamp, _pid, _r = self._entry(claimed.slot)
            if state == WRITING and gen == claimed.gen:
                self._free(claimed.slot, gen)

    def remove(self, digest: bytes) -> bool:
        """Free the committed slot holding ``digest`` (a reader of it sees a new generation: a
        miss); False when none holds it."""
        set_no = self.set_of(digest)
        with self._locked_set(set_no):
            for slot in range(set_no * self.ways, (set_no + 1) * self.ways):
                d, state, gen, _s, _t, _p, _r = self._entry(slot)
                if state == COMMITTED and d == digest:
                    self._free(slot, gen)
                    return True
        return False

    def _free(self, slot: int, gen: int) -> None:
        ENTRY.pack_into(self._mm, self._off(slot), b"\0" * 32, FREE, (gen + 1) & 0xFFFFFFFF,
                        0, 0, 0, 0)

    def clear(self) -> int:
        """Free every committed slot; returns how many."""
        n = 0
        for set_no in range(self.nsets):
            with self._locked_set(set_no):
                for slot in range(set_no * self.ways, (set_no + 1) * self.ways):
                    _d, state, gen, _s, _t, _p, _r = self._entry(slot)
                    if state == COMMITTED:
                        self._free(slot, gen)
                        n += 1
        return n

    def _states(self) -> bytes:
        """The low byte of every entry's state, one byte per slot (a strided slice of one copy of
        the index: C speed, ~1 ms for 262,144 slots instead of a Python loop over them)."""
        end = SUPERBLOCK_BYTES + self.nslots * ENTRY_BYTES
        return self._mm[SUPERBLOCK_BYTES + _STATE_OFFSET : end : ENTRY_BYTES]

    def recover(self) -> int:
        """Free every slot left *writing* (its writer died mid-write): only the process that
        opened the drive exclusively may call this. Returns how many."""
        states = self._states()
        n = 0
        slot = states.find(WRITING)
        while slot >= 0:
            _d, state, gen, _s, _t, _p, _r = self._entry(slot)
            if state == WRITING:
                self._free(slot, gen)
                n += 1
            slot = states.find(WRITING, slot + 1)
        return n

    def counts(self) -> tuple[int, int]:
        """(committed, writing) slots now."""
        states = self._states()
        return states.count(COMMITTED), states.count(WRITING)

    def sync(self) -> None:
        """msync: the index on disk (strict durability)."""
        self._mm.flush()

    def sync_entry(self, slot: int) -> None:
        """msync the index page holding one entry: a claim durable before its data is written
        (strict durability: after a node crash the old page's entry never points at new data)."""
        page = self._off(slot) & ~(mmap.PAGESIZE - 1)
        self._mm.flush(page, mmap.PAGESIZE)

    def close(self) -> None:
        # A lookup's view still alive in another thread: the map is left to the GC.
        with contextlib.suppress(BufferError):
            self._mm.close()


class _SetLock:
    """The thread lock plus a ``lockf`` on one set's entries (other processes)."""

    def __init__(self, index: SlotIndex, set_no: int) -> None:
        self._index = index
        self._start = SUPERBLOCK_BYTES + set_no * index.ways * ENTRY_BYTES
        self._len = index.ways * ENTRY_BYTES

    def __enter__(self) -> None:
        self._index._lock.acquire()
        try:
            fcntl.lockf(self._index._fd, fcntl.LOCK_EX, self._len, self._start, os.SEEK_SET)
        except BaseException:
            self._index._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.lockf(self._index._fd, fcntl.LOCK_UN, self._len, self._start, os.SEEK_SET)
        finally:
            self._index._lock.release()
