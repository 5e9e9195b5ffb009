"""The write-back ring of :class:`~hicache_umbp.store.tiers.TieredClient`: copies of pages on their
way to SSD, and the thread that writes them there.

A put that chooses write-back reserves ring slots (:meth:`WriteBackRing.reserve`, waiting up to
``queue_wait_s`` for room), copies the page bytes into them (:meth:`WriteBackRing.copy_in`), and
hands them to the writer (:meth:`WriteBackRing.commit`) or gives them back
(:meth:`WriteBackRing.cancel`). Until the SSD holds a key, the key is *pending*: reads are
served from the ring (:meth:`WriteBackRing.read_pending`) and the tiered client treats it as
present on the SSD side. The writer writes at most ``ssd_max_batch_keys`` keys per SSD call
(mori's SSD staging slots).

Refused writes. A committed key was acknowledged to the caller, and DRAM may evict it at any
time, so the ring keeps it until the SSD has it -- it is never dropped because the SSD said no
once. mori 1.2.4's SSD node refuses puts for ~50-150 ms after a read batch (the read leases its
staging slots, whatever ``UMBP_SSD_READ_LEASE_MS`` says); a standalone SSD sidecar refuses
while it restarts. The writer retries refused keys in a *fair window*
(:mod:`hicache_umbp.store.refusals`): for up to ``retry_window_s`` it holds the tiered client's
SSD read gate, so this process's SSD reads cannot renew the lease. Keys still refused after the
window leave the ring *stalled* (a visible failure: ``stalls``, a rate-limited warning, the
store's metrics): the writer pauses ``retry_pause_s`` and opens another window, until the SSD
takes them; meanwhile puts do not wait for ring room (they write synchronously, and a page the
SSD refuses then is reported not stored) and :meth:`flush` returns False at once. Only
:meth:`close` gives up: keys still refused after one last window are dropped and counted
(``failed``), with a warning.

The staging memory is ours (memfd, or mori shm for standalone servers): the caller's buffer is
free again when the put returns (SGLang reuses host slots at once).
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .protocol import UMBPClientLike
from .ratelimit import RateLimitedLog
from .refusals import RETRY_PAUSE_S, RETRY_WINDOW_S, BatchCall, retry_refused
from .ring import Ring, Slot, StagingBuffer

WRITER_THREAD = "hicache-tier-writeback"


@dataclass
class WriteBackStats:
    queued: int = 0  # keys handed to the writer
    waits: int = 0  # puts that waited for ring room
    wait_timeouts: int = 0  # ... and gave up (the caller writes that batch synchronously)
    done: int = 0  # keys the writer wrote to SSD
    retries: int = 0  # key writes repeated after the SSD refused them
    stalls: int = 0  # times keys were still refused after a whole fair window
    failed: int = 0  # acknowledged keys dropped unwritten (only at close, after retrying)
    pending: int = 0  # keys committed and not yet on SSD (a gauge)
    stalled: bool = False  # keys are waiting for the SSD beyond a fair window now


class WriteBackRing:
    """Ring slots, the pending map and the writer thread (see the module docstring).

    ``write_ssd(keys, ptrs, sizes)`` writes to SSD in batches the SSD accepts (the tiered
    client's chunking); ``gate`` is the tiered client's SSD read gate; the staging buffer is
    registered with every client in ``register``.
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
        gate: threading.Lock | None = None,
        retry_window_s: float = RETRY_WINDOW_S,
        retry_pause_s: float = RETRY_PAUSE_S,
    ) -> None:
        self._write_ssd = write_ssd
        self._queue_keys = queue_keys
        self._queue_wait_s = queue_wait_s
        self._step = ssd_step
        self._warn = warn
        self._gate = gate if gate is not None else threading.Lock()
        self._retry_window_s = retry_window_s
        self._retry_pause_s = retry_pause_s
        self._clients = tuple(register)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # signalled when slots are freed
        self._changed = threading.Condition(self._lock)  # work, stop, progress, stalls
        self._closed = False  # no more reservations
        self._stop = False  # the writer exits once the work queue is empty
        self._inflight = 0  # puts holding slots not yet committed or cancelled
        self._pending: dict[str, Slot] = {}  # committed keys, readable until on SSD
        self._work: deque[Slot] = deque()  # committed keys the writer has not tried yet
        self.stats = WriteBackStats()
        self._ring = Ring(queue_bytes)
        self._staging: StagingBuffer | None = staging(queue_bytes)
        for client in self._clients:
            self._register(client)
        self._writer = threading.Thread(target=self._loop, name=WRITER_THREAD, daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ the put side

    def reserve(self, keys: Sequence[str], sizes: Sequence[int]) -> list[Slot] | None:
        """Slots for every key of a batch (all or none), waiting up to ``queue_wait_s`` (not at
        all while the ring is stalled); None: the caller writes the batch to SSD synchronously.
        Success counts as in flight until :meth:`commit` or :meth:`cancel`."""
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
                    if self._closed or self.stats.stalled:
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
        with self._lock:
            for slot in slots:
                self._pending[slot.key] = slot
            self._work.extend(slots)
            self.stats.queued += len(slots)
            self.stats.pending += len(slots)
            self._inflight -= 1
            self._room.notify_all()
            self._changed.notify_all()

    def cancel(self, slots: Sequence[Slot]) -> None:
        """Give reserved slots back unused."""
        with self._room:
            for slot in slots:
                self._ring.release(slot)
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

    @property
    def stalled(self) -> bool:
        return self.stats.stalled

    def flush(self) -> bool:
        """Wait until every committed key is on SSD; False at once while the ring is stalled
        (keys the SSD keeps refusing stay pending, readable from the ring)."""
        with self._lock:
            self._changed.wait_for(lambda: self.stats.pending == 0 or self.stats.stalled
                                   or not self._writer.is_alive())
            return self.stats.pending == 0

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wait for puts holding slots, let the writer finish (refused keys get one last fair
        window, then are dropped and counted), free the ring."""
        with self._room:
            if self._closed:
                return
            self._closed = True  # later reservations fail: those puts write through
            self._room.notify_all()
            self._room.wait_for(lambda: self._inflight == 0)
            self._stop = True
            self._changed.notify_all()
        self._writer.join()
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
        while True:
            with self._lock:
                self._changed.wait_for(lambda: bool(self._work) or self._stop)
                if not self._work:
                    return  # stopped and drained
                batch = [self._work.popleft() for _ in range(min(self._step, len(self._work)))]
            try:
                self._store(batch)
            except Exception as e:  # the thread must outlive any one failure
                self._warn.warn("writeback_exception", "write-back of %d keys raised %r",
                                len(batch), e)
                self._drop([s for s in batch if not s.released])

    def _store(self, batch: list[Slot]) -> None:
        """Write ``batch`` to SSD; refused keys stay pending and are retried until the SSD takes
        them (or the ring closes)."""
        todo = self._attempt(batch)
        rounds = 0
        stalled = False
        while todo:
            if rounds:
                with self._lock:  # pause, SSD reads go on; close() cuts it short
                    self._changed.wait_for(lambda: self._stop, self._retry_pause_s)
            todo = self._fair_window(todo)
            rounds += 1
            if todo and not stalled:
                stalled = True
                with self._lock:
                    self.stats.stalls += 1
                    self.stats.stalled = True
                    self._room.notify_all()  # puts waiting for room stop waiting
                    self._changed.notify_all()
                self._warn.warn(
                    "writeback_stalled", "the SSD tier keeps refusing %d acknowledged write-back "
                    "keys after a %g s fair window; they stay in the write-back ring "
                    "(readable) and are retried every %g s; meanwhile pages the SSD refuses "
                    "are reported not stored", len(todo), self._retry_window_s,
                    self._retry_pause_s)
            if todo and self._stop:
                self._drop(todo)
                break
        if stalled:  # one batch is retried at a time: nothing else is known refused
            with self._lock:
                self.stats.stalled = False
                self._changed.notify_all()

    def _fair_window(self, slots: list[Slot]) -> list[Slot]:
        base = self._base()
        keys = [s.key for s in slots]
        ptrs = [base + s.offset for s in slots]
        sizes = [s.size for s in slots]
        ok = [False] * len(slots)
        retried = retry_refused(self._write_ssd, keys, ptrs, sizes, ok, gate=self._gate,
                                window_s=self._retry_window_s)
        return self._settle(slots, ok, retried)

    def _attempt(self, slots: list[Slot]) -> list[Slot]:
        base = self._base()
        ok = self._write_ssd([s.key for s in slots], [base + s.offset for s in slots],
                             [s.size for s in slots])
        return self._settle(slots, [r is True for r in ok], 0)

    def _settle(self, slots: list[Slot], ok: list[bool], retried: int) -> list[Slot]:
        """Release the slots the SSD took; the refused ones stay pending."""
        refused = [s for s, good in zip(slots, ok, strict=True) if not good]
        with self._room:
            for slot, good in zip(slots, ok, strict=True):
                if good:
                    self._finish(slot)
            written = len(slots) - len(refused)
            self.stats.done += written
            self.stats.retries += retried
            self._room.notify_all()
            self._changed.notify_all()
        return refused

    def _drop(self, slots: list[Slot]) -> None:
        if not slots:
            return
        with self._room:
            for slot in slots:
                self._finish(slot)
            self.stats.failed += len(slots)
            self._room.notify_all()
            self._changed.notify_all()
        self._warn.warn("writeback_failed", "dropped %d acknowledged write-back keys the SSD "
                        "tier still refused at close; DRAM may hold them until it evicts them",
                        len(slots))

    def _finish(self, slot: Slot) -> None:
        """Under the lock: the key leaves the ring (written or dropped)."""
        if self._pending.get(slot.key) is slot:
            del self._pending[slot.key]
        self._ring.release(slot)
        self.stats.pending -= 1

    def _base(self) -> int:
        assert self._staging is not None
        return self._staging.ptr

    def _register(self, client: UMBPClientLike) -> None:
        assert self._staging is not None
        try:
            ok: Any = client.register_memory(self._staging.ptr, self._staging.size)
        except Exception as e:
            ok = e
        if ok is not True:
            self._warn.warn("staging_register", "register_memory of the %d B staging ring "
                            "returned %r", self._staging.size, ok)
