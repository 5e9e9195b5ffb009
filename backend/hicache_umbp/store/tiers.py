"""DRAM in front of SSD, composed from two UMBP clients (mori 1.2.4 cannot chain them itself).

mori 1.2.4 puts a DRAM tier in front of an SSD tier only through its RDMA transfer engine, so a
client (embedded) or a standalone server serves exactly one medium. :class:`TieredClient` is itself
a :class:`~hicache_umbp.clients.factories.UMBPClientLike` over a DRAM client and an SSD client, so
:class:`~hicache_umbp.store.store.UMBPStore` is the same for one tier or two.

Pages are atomic. Keys come page-major in groups of ``parts_per_page`` (K and V of an MHA page,
as the store sends them), and each tier holds, for each page, parts of at most one write:

* mori keys are write-once *per key* and tiers evict per key, so a page whose K was evicted
  while its V stayed would, re-put by another writer, hold K from one write and V from another
  (``tests/backend/test_tiers_mori.py`` stages exactly that on real mori). So a put writes a
  page only into a tier that holds *no* part of it: a tier holding the whole page keeps it, a
  tier holding part of it is skipped (the partial page ages out), but for an SSD tier that can
  remove keys (ours), which gives up the parts it still holds, so the page is written whole.
* puts (and promotions) run one at a time, so two writers of one page never interleave.
* reads take all of a page's parts from one side: DRAM when DRAM has every part, else the
  SSD side (the write-back ring plus SSD, which only ever hold one write of a page), else miss.

Writes land in DRAM and reach SSD by the write policy:

* ``write_back`` (default; measured in ``bench/l3_store.py``): pages DRAM took are copied into a
  staging ring of our own (:mod:`hicache_umbp.store.writeback`) inside the call and a background
  thread writes them to SSD in batches of at most ``ssd_max_batch_keys`` (mori's SSD staging
  slots). A put that finds the ring full waits up to ``queue_wait_s``, then writes that batch
  to SSD synchronously from the caller's buffer.
* ``write_through``: the call returns after both tiers were written.

A page is reported stored only when a tier that *keeps* it holds it: the SSD side (on SSD, or
in the write-back ring, which keeps it until SSD has it; refused writes are retried, never
dropped: :mod:`hicache_umbp.store.refusals`). A DRAM copy alone does not count: DRAM evicts on
its own (a page no SSD slot can take, ``ssd_too_large``, is the warned exception).

Why copy inside the put rather than DRAM -> SSD in the background: on real mori 1.2.4 a DRAM
tier full of keys that were read evicts a fresh put within the same call, before any background
reader could copy it (``test_mori_dram_evicts_fresh_puts_first_once_full_of_read_keys``).

Reads promote SSD-side hits into DRAM (``promote_on_hit``) when DRAM holds no part of the page
and no put is running (promotion is best effort and never waits). ``flush`` waits until the ring
is drained; ``close`` drains it and stops the thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ..contract.staging import SSD_STAGING_SLOTS
from .protocol import UMBPClientLike
from .ratelimit import RateLimitedLog
from .refusals import RETRY_PAUSE_S, RETRY_WINDOW_S, BatchCall, SyncSsdWriter
from .ring import MemfdStaging, StagingBuffer
from .tierstats import TierStats
from .writeback import WriteBackRing

__all__ = ["TierStats", "TieredClient"]

log = logging.getLogger(__name__)

WritePolicy = Literal["write_back", "write_through"]
WRITE_POLICIES: tuple[str, ...] = ("write_back", "write_through")


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
        parts_per_page: int = 1,
        ssd_max_value_bytes: int | None = None,
        retry_window_s: float = RETRY_WINDOW_S,
        retry_pause_s: float = RETRY_PAUSE_S,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"write_policy={write_policy!r} is not allowed; allowed values: "
                + ", ".join(WRITE_POLICIES)
            )
        for name, value in (("queue_bytes", queue_bytes), ("queue_keys", queue_keys),
                            ("parts_per_page", parts_per_page)):
            if value < 1:
                raise ValueError(f"{name}={value!r} must be >= 1")
        if ssd_max_batch_keys is not None and ssd_max_batch_keys < 1:
            raise ValueError(f"ssd_max_batch_keys={ssd_max_batch_keys!r} must be >= 1 or None")
        self.dram = dram
        self.ssd = ssd
        self.write_policy = write_policy
        self.promote_on_hit = promote_on_hit
        self.parts_per_page = parts_per_page
        self._ssd_step = ssd_max_batch_keys
        self._ssd_max_value = ssd_max_value_bytes
        self._on_close = on_close
        self._warn = RateLimitedLog(log, log_interval_s)
        self._lock = threading.Lock()  # counters
        self._put_lock = threading.Lock()  # one put (or promotion) at a time: pages are atomic
        # Held around this client's SSD reads, and by a fair retry window (see the docstring).
        self._ssd_gate = threading.Lock()
        self._stats = TierStats()
        self._closed = False
        self._ring: WriteBackRing | None = None
        if write_policy == "write_back":
            self._ring = WriteBackRing(
                lambda k, p, s: self._ssd_batches(self.ssd.batch_put_from_ptr, k, p, s),
                queue_bytes=queue_bytes,
                queue_keys=queue_keys,
                queue_wait_s=queue_wait_s,
                ssd_step=ssd_max_batch_keys or 64,
                staging=staging,
                register=(dram, ssd),
                warn=self._warn,
                gate=self._ssd_gate,
                retry_window_s=retry_window_s,
                retry_pause_s=retry_pause_s,
            )
        ring = self._ring
        self._sync = SyncSsdWriter(
            lambda k, p, s: self._ssd_batches(self.ssd.batch_put_from_ptr, k, p, s),
            gate=self._ssd_gate, window_s=retry_window_s, warn=self._warn,
            stalled=lambda: ring is not None and ring.stalled)

    @property
    def _writer(self) -> threading.Thread | None:
        return self._ring._writer if self._ring is not None else None

    # ------------------------------------------------------------------ UMBPClientLike

    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        n = len(keys)
        if n == 0 or len(ptrs) != n or len(sizes) != n:
            return [False] * n
        ppp = self._page_width(n)
        with self._put_lock:
            return self._put(keys, ptrs, sizes, ppp)

    def _put(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int], ppp: int
    ) -> list[bool]:
        n = len(keys)
        pages = range(n // ppp)
        in_dram = self._pages(self._exists(self.dram, "dram", keys), ppp)
        on_ssd = self._whole_again(keys, self._pages(self._ssd_side(keys), ppp), ppp)
        skipped = sum(d == "part" for d in in_dram) + sum(s == "part" for s in on_ssd)
        # DRAM takes the pages it holds no part of.
        to_dram = [p for p in pages if in_dram[p] == "none"]
        dram_whole = [in_dram[p] == "all" for p in pages]
        if to_dram:
            idx = _keys_of(to_dram, ppp)
            ok = self._checked("dram_put", self.dram.batch_put_from_ptr,
                               *_select(idx, keys, ptrs, sizes))
            for j, p in enumerate(to_dram):
                dram_whole[p] = all(ok[j * ppp : (j + 1) * ppp])
        # The SSD side takes the pages it holds no part of (and that fit its slots).
        fits = [self._fits(sizes, p, ppp) for p in pages]
        to_ssd = [p for p in pages if on_ssd[p] == "none" and fits[p]]
        queued: list[int] = []
        if self._ring is not None:  # write-back: only what DRAM holds; the rest synchronously
            queued = self._queue([p for p in to_ssd if dram_whole[p]], keys, ptrs, sizes, ppp)
        direct = [p for p in to_ssd if p not in set(queued)]
        ssd_whole: dict[int, bool] = {p: True for p in queued}
        if direct:
            idx = _keys_of(direct, ppp)
            ok = self._sync.write(*_select(idx, keys, ptrs, sizes))
            for j, p in enumerate(direct):
                ssd_whole[p] = all(ok[j * ppp : (j + 1) * ppp])
            with self._lock:
                self._stats.ssd_direct_writes += sum(ok)
        if skipped:
            with self._lock:
                self._stats.partial_pages_skipped += skipped
        # Stored: the SSD side holds the page whole; DRAM only for a page no SSD slot can take.
        result = [on_ssd[p] == "all" or ssd_whole.get(p, False) or (not fits[p] and dram_whole[p])
                  for p in pages]
        return [result[i // ppp] for i in range(n)]

    def _whole_again(self, keys: Sequence[str], on_ssd: list[str], ppp: int) -> list[str]:
        """An SSD that can remove keys (ours: :mod:`hicache_umbp.disk`) gives up the parts it
        still holds of a page it lost a part of, so this put writes the page whole: skipped, it
        would stay unreadable until its other parts aged out. Not while the ring writes it."""
        remove, ring = getattr(self.ssd, "batch_remove", None), self._ring
        part = [p for p, state in enumerate(on_ssd) if state == "part" and not (
            ring is not None and any(ring.pending([keys[i] for i in _keys_of([p], ppp)])))]
        if remove is None or not part:
            return on_ssd
        held = [keys[i] for i in _keys_of(part, ppp)]
        try:
            remove(held)
        except Exception as e:
            self._warn.warn("ssd_remove_exception", "batch_remove raised %r", e)
            return on_ssd
        gone, out = self._exists(self.ssd, "ssd", held), list(on_ssd)
        for j, p in enumerate(part):
            if not any(gone[j * ppp : (j + 1) * ppp]):
                out[p] = "none"
        with self._lock:
            self._stats.partial_pages_rewritten += sum(map(str.__ne__, out, on_ssd))
        return out

    def _queue(
        self, pages: list[int], keys: Sequence[str], ptrs: Sequence[int],
        sizes: Sequence[int], ppp: int,
    ) -> list[int]:
        """Copy ``pages`` into the ring and queue them; [] when the ring has no room."""
        ring = self._ring
        if not pages or ring is None:
            return []
        k, p, s = _select(_keys_of(pages, ppp), keys, ptrs, sizes)
        slots = ring.reserve(k, s)
        if slots is None:
            return []
        try:
            ring.copy_in(slots, p)
        except BaseException:
            ring.cancel(slots)
            raise
        ring.commit(slots)
        return pages

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        n = len(keys)
        if n == 0 or len(ptrs) != n or len(sizes) != n:
            return [False] * n
        ppp = self._page_width(n)
        got = self._checked("dram_get", self.dram.batch_get_into_ptr, keys, ptrs, sizes)
        dram_pages = [all(got[p * ppp : (p + 1) * ppp]) for p in range(n // ppp)]
        in_dram_part = [any(got[p * ppp : (p + 1) * ppp]) for p in range(n // ppp)]
        found = [dram_pages[i // ppp] for i in range(n)]
        miss = [i for i in range(n) if not found[i]]  # every part of a page DRAM lacks
        touch = getattr(self.ssd, "touch_later", None)
        if touch is not None and len(miss) < n:  # our SSD tier: its LRU sees DRAM's hits too
            touch([keys[i] for i in range(n) if found[i]])
        ring_hits = ssd_hits = 0
        side = [False] * n
        if miss and self._ring is not None:
            ring_hits = self._ring.read_pending(miss, keys, ptrs, sizes, side)
        rest = [i for i in miss if not side[i]]
        if rest:
            with self._ssd_gate:  # a fair retry window holds it: reads would renew the lease
                ok = self._ssd_batches(self.ssd.batch_get_into_ptr,
                                       *_select(rest, keys, ptrs, sizes))
            for j, i in enumerate(rest):
                side[i] = ok[j]
            ssd_hits = sum(ok)
        side_pages = [p for p in range(n // ppp)
                      if not dram_pages[p] and all(side[p * ppp : (p + 1) * ppp])]
        for p in side_pages:
            found[p * ppp : (p + 1) * ppp] = [True] * ppp
        promoted = skipped = 0
        if side_pages and self.promote_on_hit:
            promote = [p for p in side_pages if not in_dram_part[p]]
            promoted, skipped = self._promote(promote, keys, ptrs, sizes, ppp)
        with self._lock:
            s = self._stats
            s.dram_hits += sum(dram_pages) * ppp
            s.ring_hits += ring_hits
            s.ssd_hits += ssd_hits
            s.misses += n - sum(found)
            s.promotions += promoted
            s.promotions_skipped += skipped
        return found

    def _promote(
        self, pages: list[int], keys: Sequence[str], ptrs: Sequence[int],
        sizes: Sequence[int], ppp: int,
    ) -> tuple[int, int]:
        """Copy SSD-side hits into DRAM when DRAM holds no part of them; never waits for a
        put (best effort). (keys copied, keys skipped because a put was running)."""
        if not pages or not self._put_lock.acquire(blocking=False):
            return 0, len(pages) * ppp
        try:
            k, p, s = _select(_keys_of(pages, ppp), keys, ptrs, sizes)
            present = self._exists(self.dram, "dram", k)
            keep = [j for j in range(len(pages)) if not any(present[j * ppp : (j + 1) * ppp])]
            if not keep:
                return 0, 0
            idx = _keys_of(keep, ppp)
            return sum(self._checked("dram_promote", self.dram.batch_put_from_ptr,
                                     *_select(idx, k, p, s))), 0
        finally:
            self._put_lock.release()

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        """A key is present when its whole page is in DRAM or on the SSD side."""
        n = len(keys)
        if not n:
            return []
        ppp = self._page_width(n)
        in_dram = self._pages(self._exists(self.dram, "dram", keys), ppp)
        need = [i for i in range(n) if in_dram[i // ppp] != "all"]
        side = [True] * n
        if need:
            got = self._ssd_side([keys[i] for i in need])
            for j, i in enumerate(need):
                side[i] = got[j]
        on_ssd = self._pages(side, ppp)
        return [in_dram[i // ppp] == "all" or on_ssd[i // ppp] == "all" for i in range(n)]

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        present = self.batch_exists(keys)
        return present.index(False) if False in present else len(present)

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
        """Wait until every queued key was written to SSD, then flush both tiers; False while
        the SSD keeps refusing queued keys (they stay in the ring, readable)."""
        drained = self._ring.flush() if self._ring is not None else True
        d = self.dram.flush()
        s = self.ssd.flush()
        return drained and d is True and s is True

    # ------------------------------------------------------------------ lifecycle

    def tier_stats(self) -> TierStats:
        with self._lock:
            out = TierStats(**vars(self._stats))
        out.ssd_retries, out.ssd_refused = self._sync.retries, self._sync.refused
        if self._ring is not None:
            for name, value in vars(self._ring.snapshot()).items():  # x is writeback_x here
                setattr(out, f"writeback_{name}", int(value))
        return out

    def close(self) -> None:
        """Drain the ring, stop the thread, free the staging buffer; idempotent. Later puts
        write through."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._ring is not None:
            self._ring.close()
        if self._on_close is not None:
            self._on_close()

    # ------------------------------------------------------------------ helpers

    def _page_width(self, n: int) -> int:
        if n % self.parts_per_page == 0:
            return self.parts_per_page
        self._warn.warn("not_whole_pages", "%d keys are not whole pages of %d parts; handled "
                        "key by key", n, self.parts_per_page)
        return 1

    @staticmethod
    def _pages(present: list[bool], ppp: int) -> list[str]:
        """Per page: "all", "none" or "part" of its keys present."""
        out = []
        for p in range(len(present) // ppp):
            got = sum(present[p * ppp : (p + 1) * ppp])
            out.append("all" if got == ppp else "none" if got == 0 else "part")
        return out

    def _ssd_side(self, keys: Sequence[str]) -> list[bool]:
        """Pending in the ring, or on SSD."""
        present = self._ring.pending(keys) if self._ring is not None else [False] * len(keys)
        ask = [i for i in range(len(keys)) if not present[i]]
        if ask:
            got = self._exists(self.ssd, "ssd", [keys[i] for i in ask])
            for j, i in enumerate(ask):
                present[i] = got[j]
        return present

    def _fits(self, sizes: Sequence[int], page: int, ppp: int) -> bool:
        limit = self._ssd_max_value
        if limit is None:
            return True
        big = sum(int(s) > limit for s in sizes[page * ppp : (page + 1) * ppp])
        if big:
            with self._lock:
                self._stats.ssd_too_large += big
            self._warn.warn("ssd_too_large", "a page part is larger than the SSD tier's %d-byte "
                            "staging slot; kept in DRAM only", limit)
        return not big

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
        self, what: str, call: BatchCall, keys: Sequence[str], ptrs: Sequence[int],
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


def _keys_of(pages: Sequence[int], ppp: int) -> list[int]:
    return [p * ppp + j for p in pages for j in range(ppp)]


def _select(
    idx: Sequence[int], keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
) -> tuple[list[str], list[int], list[int]]:
    return [keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx]
