"""DRAM in front of SSD, composed from two UMBP clients (mori 1.2.4 cannot chain them itself).

mori 1.2.4 puts a DRAM tier in front of an SSD tier only through its RDMA transfer engine, so a
client (embedded) or a standalone server serves exactly one medium. :class:`TieredClient` is itself
a :class:`~hicache_umbp.client.UMBPClientLike` over a DRAM client and an SSD client, so
:class:`~hicache_umbp.store.UMBPStore` is the same for one tier or two. The policy:

Writes
    land in DRAM and reach SSD by the write policy:

    * ``write_back`` (default; measured in ``bench/l3_store.py``): inside the call the page
      bytes are copied into a staging ring of our own (``queue_bytes``, at most ``queue_keys``
      keys) and queued; a background thread writes them from the ring to SSD in batches of at
      most ``ssd_max_batch_keys`` (mori's SSD staging slots). The caller's buffer is free again
      when the call returns (SGLang reuses host slots at once). A put that finds the ring full
      waits up to ``queue_wait_s`` for the writer, then writes that batch to SSD synchronously
      from the caller's buffer (write-through for that batch).
    * ``write_through``: the call returns after both tiers were written.

    A key counts as stored when either tier took it or it is queued.

    Why not copy DRAM -> SSD in the background: measured on real mori 1.2.4, its DRAM tier
    evicts keys that were never read first. Once DRAM is full of keys that were read, a
    fresh put returns True and is evicted within the same call, before any background reader
    could copy it (``tests/backend/test_tiers_mori.py`` fills DRAM four times over). Only a
    copy taken inside the call is safe.
Reads
    try DRAM, then the write-back ring (pages not yet on SSD), then SSD; SSD hits are promoted
    into DRAM (``promote_on_hit``) from the caller's buffer, which the read just filled.
Exists
    consults DRAM, the ring and SSD: a page evicted from DRAM is still served from SSD.

``flush`` waits until the ring is drained; ``close`` drains it and stops the thread.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from .client import UMBPClientLike
from .ratelimit import RateLimitedLog
from .staging import MemfdStaging, MoriShmStaging, Ring, Slot, StagingBuffer

__all__ = ["MemfdStaging", "MoriShmStaging", "StagingBuffer", "TierStats", "TieredClient"]

log = logging.getLogger(__name__)

WritePolicy = Literal["write_back", "write_through"]
WRITE_POLICIES: tuple[str, ...] = ("write_back", "write_through")
SSD_STAGING_SLOTS = 16  # mori 1.2.4 SSD node: keys per batch (ssd_staging_buffer_slots default)
BatchCall = Callable[[Sequence[str], Sequence[int], Sequence[int]], list[bool]]


@dataclass
class TierStats:
    dram_hits: int = 0  # keys read from DRAM
    ring_hits: int = 0  # keys read from the write-back ring (not yet on SSD)
    ssd_hits: int = 0  # keys read from SSD
    misses: int = 0  # keys in no tier
    promotions: int = 0  # SSD hits copied into DRAM
    ssd_direct_writes: int = 0  # keys written to SSD inside the put (write-through, ring full)
    writeback_queued: int = 0
    writeback_waits: int = 0  # puts that waited for ring room
    writeback_wait_timeouts: int = 0  # ... and gave up, writing through instead
    writeback_done: int = 0  # keys the background thread wrote to SSD
    writeback_failed: int = 0  # queued keys SSD refused
    ssd_calls: int = 0


class TieredClient:
    """A DRAM client in front of an SSD client (see the module docstring for the policy)."""

    def __init__(
        self,
        dram: UMBPClientLike,
        ssd: UMBPClientLike,
        *,
        write_policy: str = "write_back",
        queue_bytes: int = 256 << 20,
        queue_keys: int = 4096,
        promote_on_hit: bool = True,
        ssd_max_batch_keys: int | None = SSD_STAGING_SLOTS,
        queue_wait_s: float = 5.0,
        log_interval_s: float = 30.0,
        staging: Callable[[int], StagingBuffer] = MemfdStaging,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"write_policy={write_policy!r} is not allowed; allowed values: "
                + ", ".join(WRITE_POLICIES)
            )
        for name, value in (("queue_bytes", queue_bytes), ("queue_keys", queue_keys)):
            if value < 1:
                raise ValueError(f"{name}={value!r} must be >= 1")
        if ssd_max_batch_keys is not None and ssd_max_batch_keys < 1:
            raise ValueError(f"ssd_max_batch_keys={ssd_max_batch_keys!r} must be >= 1 or None")
        self.dram = dram
        self.ssd = ssd
        self.write_policy = write_policy
        self.promote_on_hit = promote_on_hit
        self._ssd_step = ssd_max_batch_keys
        self._queue_keys = queue_keys
        self._queue_wait_s = queue_wait_s
        self._on_close = on_close
        self._warn = RateLimitedLog(log, log_interval_s)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # signalled when the writer frees slots
        self._stats = TierStats()
        self._closed = False
        self._inflight = 0  # puts holding ring slots not yet queued (close() waits for them)
        self._staging: StagingBuffer | None = None
        self._ring: Ring | None = None
        self._pending: dict[str, Slot] = {}  # queued keys, readable until written
        self._queue: queue.Queue[Slot | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        if write_policy == "write_back":
            self._staging = staging(queue_bytes)
            self._ring = Ring(queue_bytes)
            for client in (dram, ssd):
                self._register_staging(client)
            self._writer = threading.Thread(
                target=self._write_back_loop, name="hicache-tier-writeback", daemon=True
            )
            self._writer.start()

    # ------------------------------------------------------------------ UMBPClientLike

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        n = len(keys)
        if n == 0 or len(ptrs) != n or len(sizes) != n:
            return [False] * n
        slots = self._reserve(keys, sizes) if self.write_policy == "write_back" else None
        if slots is not None:
            # Holding slots counts as in flight: close() keeps the staging ring mapped and the
            # writer's leftovers drain pending until these slots are queued.
            try:
                staging = self._staging
                assert staging is not None
                for slot, src in zip(slots, ptrs, strict=True):
                    ctypes.memmove(staging.ptr + slot.offset, src, slot.size)
                self._checked("dram_put", self.dram.batch_put_from_ptr, keys, ptrs, sizes)
                with self._lock:
                    for slot in slots:
                        self._pending[slot.key] = slot
                    self._stats.writeback_queued += n
                for slot in slots:
                    self._queue.put(slot)
            finally:
                with self._room:
                    self._inflight -= 1
                    self._room.notify_all()
            return [True] * n
        stored = self._checked("dram_put", self.dram.batch_put_from_ptr, keys, ptrs, sizes)
        ok = self._ssd_batches(self.ssd.batch_put_from_ptr, keys, ptrs, sizes)
        with self._lock:
            self._stats.ssd_direct_writes += sum(ok)
        return [a or b for a, b in zip(stored, ok, strict=True)]

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        n = len(keys)
        if n == 0 or len(ptrs) != n or len(sizes) != n:
            return [False] * n
        found = self._checked("dram_get", self.dram.batch_get_into_ptr, keys, ptrs, sizes)
        dram_hits = sum(found)
        miss = [i for i in range(n) if not found[i]]
        ring_hits = self._read_pending(miss, keys, ptrs, sizes, found) if miss else 0
        miss = [i for i in miss if not found[i]]
        ssd_hits = promoted = 0
        if miss:
            m_keys = [keys[i] for i in miss]
            m_ptrs = [ptrs[i] for i in miss]
            m_sizes = [sizes[i] for i in miss]
            ok = self._ssd_batches(self.ssd.batch_get_into_ptr, m_keys, m_ptrs, m_sizes)
            hit = [j for j in range(len(miss)) if ok[j]]
            for j in hit:
                found[miss[j]] = True
            ssd_hits = len(hit)
            if hit and self.promote_on_hit:
                promoted = sum(
                    self._checked(
                        "dram_promote",
                        self.dram.batch_put_from_ptr,
                        [m_keys[j] for j in hit],
                        [m_ptrs[j] for j in hit],
                        [m_sizes[j] for j in hit],
                    )
                )
        with self._lock:
            s = self._stats
            s.dram_hits += dram_hits
            s.ring_hits += ring_hits
            s.ssd_hits += ssd_hits
            s.misses += n - dram_hits - ring_hits - ssd_hits
            s.promotions += promoted
        return found

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        present = self._exists(self.dram, "dram", keys)
        with self._lock:
            for i, key in enumerate(keys):
                if not present[i] and key in self._pending:
                    present[i] = True
        miss = [i for i in range(len(keys)) if not present[i]]
        if miss:
            on_ssd = self._exists(self.ssd, "ssd", [keys[i] for i in miss])
            for j, i in enumerate(miss):
                present[i] = on_ssd[j]
        return present

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        count = 0
        for ok in self.batch_exists(keys):
            if not ok:
                break
            count += 1
        return count

    def register_memory(self, ptr: int, size: int) -> bool:
        d = self.dram.register_memory(ptr, size)
        s = self.ssd.register_memory(ptr, size)
        return d is True and s is True

    def deregister_memory(self, ptr: int) -> None:
        try:
            self.dram.deregister_memory(ptr)
        finally:
            self.ssd.deregister_memory(ptr)

    def flush(self) -> bool:
        """Wait until every queued key was written to SSD, then flush both tiers."""
        if self._writer is not None and self._writer.is_alive():
            self._queue.join()
        d = self.dram.flush()
        s = self.ssd.flush()
        return d is True and s is True

    # ------------------------------------------------------------------ lifecycle

    def tier_stats(self) -> TierStats:
        with self._lock:
            return replace(self._stats)

    def close(self) -> None:
        """Drain the ring, stop the thread, free the staging buffer; idempotent."""
        with self._room:
            if self._closed:
                return
            self._closed = True  # later puts write through
            self._room.notify_all()
            # Puts that reserved ring slots before this point queue them before we drain.
            self._room.wait_for(lambda: self._inflight == 0)
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            # A put that reserved slots before close() may have queued them behind the stop.
            self._drain_leftovers()
        with self._lock:  # a concurrent ring read (_read_pending) sees None, never a freed ring
            staging, self._staging = self._staging, None
        if staging is not None:
            for client in (self.dram, self.ssd):
                try:
                    client.deregister_memory(staging.ptr)
                except Exception as e:
                    self._warn.warn("staging_deregister", "deregister_memory raised %r", e)
            staging.close()
        if self._on_close is not None:
            self._on_close()

    # ------------------------------------------------------------------ write-back

    def _reserve(self, keys: Sequence[str], sizes: Sequence[int]) -> list[Slot] | None:
        """Ring slots for a batch, waiting up to ``queue_wait_s``; None: write through."""
        ring = self._ring
        assert ring is not None
        n = len(keys)
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
            if slots is not None:
                self._inflight += 1
                return slots
            self._stats.writeback_waits += 1
            taken: list[list[Slot]] = []

            def ready() -> bool:
                if self._closed:
                    return True
                got = take()
                if got is not None:
                    taken.append(got)
                return got is not None

            self._room.wait_for(ready, self._queue_wait_s)
            if taken:
                self._inflight += 1
                return taken[0]
            if not self._closed:
                self._stats.writeback_wait_timeouts += 1
            return None

    def _write_back_loop(self) -> None:
        step = self._ssd_step or 64
        stop = False
        while not stop:
            first = self._queue.get()
            batch: list[Slot] = []
            taken = 1
            if first is None:
                stop = True
            else:
                batch.append(first)
            while not stop and len(batch) < step:
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
                    self._write_back(batch)
            except Exception as e:  # the thread must outlive any one failure
                self._warn.warn("writeback_exception", "write-back of %d keys raised %r",
                                len(batch), e)
            finally:
                for _ in range(taken):
                    self._queue.task_done()

    def _write_back(self, batch: list[Slot]) -> None:
        assert self._staging is not None
        base = self._staging.ptr
        ok = [False] * len(batch)
        try:
            ok = self._ssd_batches(
                self.ssd.batch_put_from_ptr,
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
                    assert self._ring is not None
                    self._ring.release(slot)
                self._stats.writeback_done += written
                self._stats.writeback_failed += len(batch) - written
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
        step = self._ssd_step or 64
        for start in range(0, len(leftover), step):
            self._write_back(leftover[start : start + step])

    def _read_pending(
        self,
        idx: list[int],
        keys: Sequence[str],
        ptrs: Sequence[int],
        sizes: Sequence[int],
        found: list[bool],
    ) -> int:
        """Serve DRAM misses that are still in the ring (copied under the lock: the writer
        cannot release a slot while it is read)."""
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

    def _register_staging(self, client: UMBPClientLike) -> None:
        assert self._staging is not None
        try:
            ok: Any = client.register_memory(self._staging.ptr, self._staging.size)
        except Exception as e:
            ok = e
        if ok is not True:
            self._warn.warn("staging_register", "register_memory of the %d B staging ring "
                            "returned %r", self._staging.size, ok)

    # ------------------------------------------------------------------ helpers

    def _ssd_batches(
        self, call: BatchCall, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        """``call`` over chunks of at most ``ssd_max_batch_keys`` keys (SSD staging slots)."""
        n = len(keys)
        step = self._ssd_step or n or 1
        out: list[bool] = []
        for start in range(0, n, step):
            end = start + step
            with self._lock:
                self._stats.ssd_calls += 1
            out += self._checked("ssd", call, keys[start:end], ptrs[start:end], sizes[start:end])
        return out

    def _checked(
        self,
        what: str,
        call: BatchCall,
        keys: Sequence[str],
        ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[bool]:
        n = len(keys)
        try:
            got: Any = call(keys, ptrs, sizes)
        except Exception as e:  # one tier failing must not hide the other
            self._warn.warn(f"{what}_exception", "%s call of %d keys raised %r", what, n, e)
            return [False] * n
        if got is None or not hasattr(got, "__len__") or len(got) != n:
            self._warn.warn(f"{what}_bad_result", "%s call of %d keys returned %r", what, n, got)
            return [False] * n
        return [r is True for r in got]

    def _exists(self, client: UMBPClientLike, what: str, keys: Sequence[str]) -> list[bool]:
        try:
            got: Any = client.batch_exists(keys)
        except Exception as e:
            self._warn.warn(f"{what}_exists_exception", "batch_exists raised %r", e)
            return [False] * len(keys)
        if got is None or not hasattr(got, "__len__") or len(got) != len(keys):
            self._warn.warn(f"{what}_exists_bad_result", "batch_exists returned %r", got)
            return [False] * len(keys)
        return [r is True for r in got]
