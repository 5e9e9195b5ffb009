"""The zero-copy UMBP page store SGLang's adapter calls: pages in, per-page booleans out.

A page is one SGLang host-pool page, made of ``len(keys.parts)`` host buffers (K and V for MHA
page-first layouts, one buffer for MLA). :class:`UMBPStore` maps pages to namespaced keys
(:mod:`hicache_umbp.store.keys`), hands mori the caller's pointers (no copy in Python), batches in
as few client calls as the client allows, and folds per-key results back into per-page booleans: a
page is stored or found only if every one of its parts is.

Contract for callers (SGLang's prefetch and backup threads):

* the batch methods never raise and never return ``None``; they return one boolean per page
  (``batch_exists``: the number of leading pages present);
* empty batches return at once without touching the client;
* client exceptions, ``False`` entries, ``None`` or malformed results become ``False`` pages and
  one rate-limited warning per failure kind (see :mod:`hicache_umbp.store.ratelimit`); nothing is
  logged per call on success.

Thread safety: methods may be called from several threads at once; the mori client serialises
what it must, counters are updated under a lock once per batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .keys import KeyScheme
from .pages import flatten_pages, is_int, page_pointers
from .protocol import UMBPClientLike
from .ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

PagePointers = Sequence[tuple[int, int]]  # one (ptr, size) per key part of a page


@dataclass
class StoreStats:
    """Counters since the store was built (pages and bytes are the caller's pages)."""

    pages_set: int = 0  # pages acknowledged by batch_set
    bytes_set: int = 0
    set_failures: int = 0  # pages batch_set reported as not stored
    pages_get: int = 0  # hits: pages batch_get filled completely
    bytes_get: int = 0
    get_misses: int = 0  # pages batch_get could not fill
    exists_queries: int = 0  # pages asked about in batch_exists
    exists_hits: int = 0  # leading pages batch_exists reported present
    client_calls: int = 0  # calls made into the UMBP client (batch and registration)
    errors: dict[str, int] = field(default_factory=dict)  # failures by kind
    # The client's tier counters (hicache_umbp.tiers.TierStats) when it composes DRAM and SSD:
    # refused SSD writes, retries, the write-back ring's stalls and pending keys.
    tiers: dict[str, int] = field(default_factory=dict)
    # The SSD tier's own counters (hicache_umbp.disk.DiskStats) when it is ours.
    disk: dict[str, int] = field(default_factory=dict)
    # Pages served by each L3 tier: {"dram": n, "ssd": n} (the write-back ring counts as DRAM:
    # it is host memory).
    tier_pages: dict[str, int] = field(default_factory=dict)


class UMBPStore:
    """Batch page I/O over one UMBP client (embedded, standalone or tiered).

    ``max_batch_pages`` bounds the pages per client call (``None``: one call per batch); the
    SSD path needs it because mori's SSD node stages each key of a batch in one of a fixed
    number of staging slots. :func:`build_store` picks it.
    """

    def __init__(
        self,
        client: UMBPClientLike,
        keys: KeyScheme,
        *,
        log_interval_s: float = 30.0,
        max_batch_pages: int | None = None,
        on_close: Callable[[], None] | None = None,
        owns_client: bool = True,
        registered: dict[int, int] | None = None,
        medium: str = "dram",
    ) -> None:
        if max_batch_pages is not None and max_batch_pages < 1:
            raise ValueError(f"max_batch_pages={max_batch_pages!r} must be >= 1 or None")
        self._client = client
        self._keys = keys
        self._parts = keys.parts_per_page
        self._medium = medium  # the one L3 tier when the client is not tiered
        self._max_batch_pages = max_batch_pages
        self._on_close = on_close
        self._owns_client = owns_client
        self._log_interval_s = log_interval_s
        self._warn = RateLimitedLog(log, log_interval_s)
        self._lock = threading.Lock()
        self._stats = StoreStats()
        # Shared by siblings over one client: a buffer is registered with the client once.
        self._registered: dict[int, int] = {} if registered is None else registered
        self._closed = False

    @property
    def keys(self) -> KeyScheme:
        return self._keys

    @property
    def client(self) -> UMBPClientLike:
        return self._client

    @property
    def max_batch_pages(self) -> int | None:
        return self._max_batch_pages

    def sibling(self, keys: KeyScheme) -> UMBPStore:
        """A store over the same client and batching with another key scheme (e.g. one per
        split-head group). Siblings share the registrations (a buffer registered through any
        of them is registered with the client once); closing a sibling leaves the client and
        the registrations to the owning store, which deregisters and closes them."""
        return UMBPStore(
            self._client,
            keys,
            log_interval_s=self._log_interval_s,
            max_batch_pages=self._max_batch_pages,
            owns_client=False,
            registered=self._registered,
            medium=self._medium,
        )

    # ------------------------------------------------------------------ registration

    def register_buffer(self, ptr: int, size: int) -> bool:
        """Register a host buffer with the client once (later calls for it return True)."""
        if self._closed:
            self._fail("closed", "register_buffer called after close()")
            return False
        if not (is_int(ptr) and is_int(size)):
            self._fail("bad_input", "register_buffer(%r, %r): not integers", ptr, size)
            return False
        if self._registered.get(ptr) == size:
            return True
        try:
            self._count_call()
            ok = self._client.register_memory(ptr, size)
        except Exception as e:
            self._fail("register_exception", "register_memory(%#x, %d) raised %r", ptr, size, e)
            return False
        if ok is not True:
            self._fail("register_rejected", "register_memory(%#x, %d) returned %r", ptr, size, ok)
            return False
        self._registered[ptr] = size
        return True

    # ------------------------------------------------------------------ data path

    def batch_set(self, hashes: Sequence[str], parts: Sequence[PagePointers]) -> list[bool]:
        """Store pages: ``parts[i]`` holds one (ptr, size) per key part of page ``hashes[i]``.

        Returns one boolean per page. mori keys are write-once: setting a page that is already
        stored returns True and keeps the stored bytes.
        """
        n = self._count("set", hashes)
        if n == 0:
            return []
        results, nbytes = self._transfer("put", hashes, parts)
        stored = sum(results)
        with self._lock:
            s = self._stats
            s.pages_set, s.bytes_set = s.pages_set + stored, s.bytes_set + nbytes
            s.set_failures += n - stored
        return results

    def batch_get(self, hashes: Sequence[str], parts: Sequence[PagePointers]) -> list[bool]:
        """Fill the caller's buffers with stored pages; True where every part was found.

        A page reported False may have been partly written into its buffers; the caller must
        treat those buffers as garbage (SGLang does: it only uses hit pages).
        """
        n = self._count("get", hashes)
        if n == 0:
            return []
        results, nbytes = self._transfer("get", hashes, parts)
        hits = sum(results)
        with self._lock:
            s = self._stats
            s.pages_get, s.bytes_get = s.pages_get + hits, s.bytes_get + nbytes
            s.get_misses += n - hits
        return results

    def batch_exists(self, hashes: Sequence[str]) -> int:
        """How many leading pages of ``hashes`` are present with all of their parts."""
        n = self._count("exists", hashes)
        if n == 0:
            return 0
        present = 0
        # Only the leading string hashes can count; a malformed one ends the run.
        valid = next((i for i in range(n) if type(hashes[i]) is not str), n)
        if valid < n:
            self._fail("bad_input", "batch_exists: hash %d of %d is %r, not a string",
                       valid, n, type(hashes[valid]).__name__)
        if self._closed:
            self._fail("closed", "batch_exists called after close()")
        elif valid:
            keys = self._keys.batch_keys(hashes[:valid])
            try:
                self._count_call()
                count: Any = self._client.batch_exists_consecutive(keys)
            except Exception as e:
                self._fail("exists_exception", "batch_exists_consecutive raised %r", e)
                count = 0
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= len(
                keys
            ):
                self._fail(
                    "exists_bad_result",
                    "batch_exists_consecutive returned %r for %d keys",
                    count,
                    len(keys),
                )
                count = 0
            present = count // self._parts
        with self._lock:
            self._stats.exists_queries += n
            self._stats.exists_hits += present
        return present

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> StoreStats:
        """A snapshot of the counters (with the client's tier counters, if it has any)."""
        with self._lock:
            out = replace(self._stats, errors=dict(self._stats.errors))
        tier_stats = getattr(self._client, "tier_stats", None)
        if callable(tier_stats):
            try:
                out.tiers = {k: int(v) for k, v in vars(tier_stats()).items()}
            except Exception as e:
                self._fail("stats_exception", "tier_stats raised %r", e)
        ssd_side = getattr(self._client, "ssd", self._client)
        disk_stats = getattr(ssd_side, "disk_stats", None)
        if callable(disk_stats):
            try:
                out.disk = {k: int(v) for k, v in vars(disk_stats()).items()}
            except Exception as e:
                self._fail("stats_exception", "disk_stats raised %r", e)
        t, parts = out.tiers, self._parts
        if t:
            out.tier_pages = {"dram": (t.get("dram_hits", 0) + t.get("ring_hits", 0)) // parts,
                              "ssd": t.get("ssd_hits", 0) // parts}
        else:  # one tier: every hit is its own
            out.tier_pages = {self._medium: out.pages_get}
        return out

    def flush(self) -> bool:
        """Ask the client to persist what it buffers (tiered: drain the write-back queue)."""
        try:
            self._count_call()
            return self._client.flush() is True
        except Exception as e:
            self._fail("flush_exception", "flush raised %r", e)
            return False

    def close(self) -> None:
        """Deregister buffers and release the client (the owning store only); idempotent,
        never raises."""
        if self._closed:
            return
        self._closed = True
        if not self._owns_client:
            return  # the owning store deregisters the shared buffers and closes the client
        for ptr in list(self._registered):
            try:
                self._count_call()
                self._client.deregister_memory(ptr)
            except Exception as e:
                self._fail("deregister_exception", "deregister_memory(%#x) raised %r", ptr, e)
        self._registered.clear()
        closer = getattr(self._client, "close", None)
        try:
            if callable(closer):
                closer()
            if self._on_close is not None:
                self._on_close()
        except Exception as e:
            self._fail("close_exception", "closing the client raised %r", e)

    # ------------------------------------------------------------------ internals

    def _count(self, op: str, hashes: Sequence[str]) -> int:
        """``len(hashes)``; 0 (and one bad_input failure) when it is no list of pages."""
        if isinstance(hashes, (str, bytes)):
            self._fail("bad_input", "batch_%s got a single %s instead of a list of hashes",
                       op, type(hashes).__name__)
            return 0
        try:
            return len(hashes)
        except TypeError:
            self._fail("bad_input", "batch_%s got %r instead of a list of hashes", op,
                       type(hashes).__name__)
            return 0

    def _transfer(
        self, op: str, hashes: Sequence[str], parts: Sequence[PagePointers]
    ) -> tuple[list[bool], int]:
        """One boolean per page and the bytes of the pages that succeeded."""
        n = len(hashes)
        if self._closed:
            self._fail("closed", "batch_%s called after close()", op)
            return [False] * n, 0
        try:
            nparts_given = len(parts)
        except TypeError:
            nparts_given = -1
        if nparts_given != n or isinstance(parts, (str, bytes)):
            self._fail("bad_input", "batch_%s got %d hashes but %r as page pointers",
                       op, n, nparts_given if nparts_given >= 0 else type(parts).__name__)
            return [False] * n, 0
        try:
            return self._transfer_pages(op, hashes, parts)
        except Exception as e:  # the promise: never raise into SGLang's threads
            self._fail("internal_error", "batch_%s of %d pages raised %r", op, n, e)
            return [False] * n, 0

    def _transfer_pages(
        self, op: str, hashes: Sequence[str], parts: Sequence[PagePointers]
    ) -> tuple[list[bool], int]:
        n = len(hashes)
        nparts = self._parts
        flat = flatten_pages(hashes, parts, nparts)
        if flat is not None:
            pages: list[int] = list(range(n))
            ptrs, sizes = flat
        else:
            # Malformed pages (a non-string hash, not exactly ``nparts`` integer (ptr, size)
            # pairs) are refused one by one; the rest go through.
            pages, ptrs, sizes = [], [], []
            for i in range(n):
                page = page_pointers(hashes[i], parts[i], nparts)
                if page is not None:
                    pages.append(i)
                    ptrs += page[0]
                    sizes += page[1]
            if len(pages) < n:
                self._fail("bad_input", "batch_%s: %d pages are malformed (a hash that is not "
                           "a string, or not exactly %d integer (ptr, size) parts)",
                           op, n - len(pages), nparts)
        results = [False] * n
        if not pages:
            return results, 0
        keys = self._keys.batch_keys([hashes[i] for i in pages])
        call = (
            self._client.batch_put_from_ptr if op == "put" else self._client.batch_get_into_ptr
        )
        # One client call per batch; an SSD client takes at most max_batch_pages per call.
        step = self._max_batch_pages or len(pages)
        key_ok: list[bool] = []
        for a in range(0, len(pages), step):
            lo, hi = a * nparts, min(a + step, len(pages)) * nparts
            key_ok += self._call(op, call, keys[lo:hi], ptrs[lo:hi], sizes[lo:hi])
        if len(pages) == n and all(key_ok):  # the common case: every page, every part
            return [True] * n, sum(sizes)
        nbytes = 0
        for j, i in enumerate(pages):
            lo = j * nparts
            if all(key_ok[lo : lo + nparts]):
                results[i] = True
                nbytes += sum(sizes[lo : lo + nparts])
        return results, nbytes

    def _call(
        self,
        op: str,
        call: Callable[[Sequence[str], Sequence[int], Sequence[int]], list[bool]],
        keys: list[str],
        ptrs: list[int],
        sizes: list[int],
    ) -> list[bool]:
        n = len(keys)
        try:
            self._count_call()
            got: Any = call(keys, ptrs, sizes)
        except Exception as e:
            self._fail(f"{op}_exception", "batch_%s of %d keys raised %r", op, n, e)
            return [False] * n
        if got is None or not hasattr(got, "__len__") or len(got) != n:
            self._fail(f"{op}_bad_result", "batch_%s of %d keys returned %r", op, n, got)
            return [False] * n
        ok = [r is True for r in got]
        if op == "put" and not all(ok):
            self._fail(
                "put_rejected",
                "the store refused %d of %d keys (full, or a bad pointer/size)",
                n - sum(ok),
                n,
            )
        return ok

    def _count_call(self) -> None:
        with self._lock:
            self._stats.client_calls += 1

    def _fail(self, kind: str, msg: str, *args: object) -> None:
        with self._lock:
            self._stats.errors[kind] = self._stats.errors.get(kind, 0) + 1
        self._warn.warn(kind, msg, *args)
