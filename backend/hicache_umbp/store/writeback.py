"""The write-back ring of :class:`~hicache_umbp.store.tiers.TieredClient`: copies of pages on their
way to SSD, and the thread that writes them there.

A put that chooses write-back reserves ring slots (:meth:`WriteBackRing.reserve`, waiting up to
``queue_wait_s`` for room), copies the page bytes into them (:meth:`WriteBackRing.copy_in`), and
hands them to the writer (:meth:`WriteBackRing.commit`) or gives them back
(:meth:`WriteBackRing.cancel`). Until the writer has written a key to SSD, the key is *pending*:
reads are served from the ring (:meth:`WriteBackRing.read_pending`) and the tiered client treats
it as present on the SSD side. The writer writes at most ``ssd_max_batch_keys`` keys per SSD call
(mori's SSD staging slots).

The staging memory is ours (memfd, or mori shm for standalone servers): the caller's buffer is
free again when the put returns (SGLang reuses host slots at once).
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .protocol import UMBPClientLike
from .ratelimit import RateLimitedLog
from .ring import Ring, Slot, StagingBuffer

BatchCall = Callable[[Sequence[str], Sequence[int], Sequence[int]], list[bool]]
WRITER_THREAD = "hicache-tier-writeback"


@dataclass
class WriteBackStats:
    queued: int = 0  # keys handed to the writer
    waits: int = 0  # puts that waited for ring room
    wait_timeouts: int = 0  # ... and gave up (the caller writes that batch synchronously)
    done: int = 0  # keys the writer wrote to SSD
    failed: int = 0  # queued keys SSD refused


class WriteBackRing:
    """Ring slots, the pending map and the writer thread (see the module docstring).

    ``write_ssd(keys, ptrs, sizes)`` writes to SSD in batches the SSD accepts (the tiered
    client's chunking); the staging buffer is registered with every client in ``register``.
    """

    def __init__(
        self,
        write_ssd: BatchCall,
        *,
        queue_bytes: int,
        queue_keys: int,
        queue_wait_s: float,
        ssd_step: int,
        staging: Callable[[int], StagingBuffer],
        register: Sequence[UMBPClientLike],
        warn: RateLimitedLog,
    ) -> None:
        self._write_ssd = write_ssd
        self._queue_keys = queue_keys
        self._queue_wait_s = queue_wait_s
        self._step = ssd_step
        self._warn = warn
        self._clients = tuple(register)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # signalled when slots are freed
        self._closed = False
        self._inflight = 0  # puts holding slots not yet committed or cancelled
        self._pending: dict[str, Slot] = {}  # committed keys, readable until written
        self._queue: queue.Queue[Slot | None] = queue.Queue()
        self.stats = WriteBackStats()
        self._ring = Ring(queue_bytes)
        self._staging: StagingBuffer | None = staging(queue_bytes)
        for client in self._clients:
            self._register(client)
        self._writer = threading.Thread(target=self._loop, name=WRITER_THREAD, daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ the put side

    def reserve(self, keys: Sequence[str], sizes: Sequence[int]) -> list[Slot] | None:
        """Slots for every key of a batch (all or none), waiting up to ``queue_wait_s``; None:
        the caller writes the batch to SSD synchronously. Success counts as in flight until
        :meth:`commit` or :meth:`cancel`."""
        ring, n = self._ring, len(keys)
        if n > self._queue_keys or sum(int(s) for s in sizes) > ring.size:
            return None

        def take() -> list[Slot] | None:
            if len(ring.slots) + n > self._queue_keys:
                return None
            got: list[Slot] = []
            for key, size in zip(keys, sizes, strict=True):
                slot = ring.alloc(key, int(size))
                if slot is None:
                    ring.undo(len(got))
                    return None
                got.append(slot)
            return got

        with self._room:
            if self._closed:
                return None
            slots = take()
            if slots is None:
                self.stats.waits += 1
                taken: list[list[Slot]] = []

                def ready() -> bool:
                    if self._closed:
                        return True
                    got = take()
                    if got is not None:
                        taken.append(got)
                    return got is not None

                self._room.wait_for(ready, self._queue_wait_s)
                if not taken:
                    if not self._closed:
                        self.stats.wait_timeouts += 1
                    return None
                slots = taken[0]
            self._inflight += 1
            return slots

    def copy_in(self, slots: Sequence[Slot], ptrs: Sequence[int]) -> None:
        """Copy the caller's bytes into reserved slots (the ring stays mapped while in flight)."""
        staging = self._staging
        assert staging is not None
        for slot, src in zip(slots, ptrs, strict=True):
            ctypes.memmove(staging.ptr + slot.offset, src, slot.size)

    def commit(self, slots: Sequence[Slot]) -> None:
        """Make the slots pending and hand them to the writer."""
        try:
            with self._lock:
                for slot in slots:
                    self._pending[slot.key] = slot
                self.stats.queued += len(slots)
            for slot in slots:
                self._queue.put(slot)
        finally:
            self._done_in_flight()

    def cancel(self, slots: Sequence[Slot]) -> None:
        """Give reserved slots back unused."""
        with self._room:
            for slot in slots:
                self._ring.release(slot)
            self._room.notify_all()
        self._done_in_flight()

    def _done_in_flight(self) -> None:
        with self._room:
            self._inflight -= 1
            self._room.notify_all()

    # ------------------------------------------------------------------ the read side

    def pending(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            return [k in self._pending for k in keys]

    def read_pending(
        self, idx: Sequence[int], keys: Sequence[str], ptrs: Sequence[int],
        sizes: Sequence[int], found: list[bool],
    ) -> int:
        """Serve keys ``idx`` still in the ring (copied under the lock: the writer cannot
        release a slot while it is read); returns how many were served."""
        hits = 0
        with self._lock:
            if not self._pending or self._staging is None:
                return 0
            base = self._staging.ptr
            for i in idx:
                slot = self._pending.get(keys[i])
                if slot is not None and slot.size == int(sizes[i]):
                    ctypes.memmove(ptrs[i], base + slot.offset, slot.size)
                    found[i] = True
                    hits += 1
        return hits

    # ------------------------------------------------------------------ lifecycle

    def snapshot(self) -> WriteBackStats:
        with self._lock:
            return replace(self.stats)

    def flush(self) -> None:
        """Wait until every committed key was written (or refused)."""
        if self._writer.is_alive():
            self._queue.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wait for puts holding slots, drain the queue, stop the writer, free the ring."""
        with self._room:
            if self._closed:
                return
            self._closed = True  # later reservations fail: those puts write through
            self._room.notify_all()
            self._room.wait_for(lambda: self._inflight == 0)
        self._queue.put(None)
        self._writer.join()
        self._drain_leftovers()  # a put that committed after the stop marker
        with self._lock:  # a concurrent read_pending sees None, never a freed ring
            staging, self._staging = self._staging, None
        if staging is not None:
            for client in self._clients:
                try:
                    client.deregister_memory(staging.ptr)
                except Exception as e:
                    self._warn.warn("staging_deregister", "deregister_memory raised %r", e)
            staging.close()

    # ------------------------------------------------------------------ the writer

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            batch: list[Slot] = []
            taken = 1
            if first is None:
                stop = True
            else:
                batch.append(first)
            while not stop and len(batch) < self._step:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                taken += 1
                if nxt is None:
                    stop = True
                else:
                    batch.append(nxt)
            try:
                if batch:
                    self._write(batch)
            except Exception as e:  # the thread must outlive any one failure
                self._warn.warn("writeback_exception", "write-back of %d keys raised %r",
                                len(batch), e)
            finally:
                for _ in range(taken):
                    self._queue.task_done()

    def _write(self, batch: list[Slot]) -> None:
        assert self._staging is not None
        base = self._staging.ptr
        ok = [False] * len(batch)
        try:
            ok = self._write_ssd(
                [s.key for s in batch],
                [base + s.offset for s in batch],
                [s.size for s in batch],
            )
        finally:
            written = sum(ok)
            with self._room:
                for slot in batch:
                    if self._pending.get(slot.key) is slot:
                        del self._pending[slot.key]
                    self._ring.release(slot)
                self.stats.done += written
                self.stats.failed += len(batch) - written
                self._room.notify_all()
        if written != len(batch):
            self._warn.warn("writeback_failed", "SSD refused %d of %d write-back keys",
                            len(batch) - written, len(batch))

    def _drain_leftovers(self) -> None:
        leftover: list[Slot] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
            if item is not None:
                leftover.append(item)
        for start in range(0, len(leftover), self._step):
            self._write(leftover[start : start + self._step])

    def _register(self, client: UMBPClientLike) -> None:
        assert self._staging is not None
        try:
            ok: Any = client.register_memory(self._staging.ptr, self._staging.size)
        except Exception as e:
            ok = e
        if ok is not True:
            self._warn.warn("staging_register", "register_memory of the %d B staging ring "
                            "returned %r", self._staging.size, ok)
