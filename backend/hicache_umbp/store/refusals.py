"""Refused SSD writes: retried in a fair window, never dropped silently.

mori 1.2.4's SSD node refuses puts for ~50-150 ms after a read batch (the read leases its
staging slots, whatever ``UMBP_SSD_READ_LEASE_MS`` says; measured 46-153 ms on an embedded node
with 16 slots of 1 MiB); a standalone SSD sidecar refuses while it restarts. A refused key is
written again in a *fair window* (:func:`retry_refused`): for up to ``window_s`` the writer holds
the tiered client's SSD read gate, so this process's SSD reads (which take the gate) cannot renew
the lease, and retries with doubling pauses.

Two writers use it: the write-back ring's thread (:mod:`hicache_umbp.store.writeback`, which
keeps refused keys pending and opens window after window), and :class:`SyncSsdWriter`, the
synchronous SSD write of a put (``write_through``, a full ring, pages DRAM refused): one window,
then the pages the SSD still refuses are reported not stored (``ssd_refused``, warned); while the
SSD keeps refusing, further synchronous writes try once, without a window, for
:data:`REFUSING_HOLD_S`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from .ratelimit import RateLimitedLog

BatchCall = Callable[[Sequence[str], Sequence[int], Sequence[int]], list[bool]]
#: First pause of a fair window; each further pause doubles.
RETRY_FIRST_DELAY_S = 0.005
#: How long a fair window lasts (SSD reads of this process wait meanwhile).
RETRY_WINDOW_S = 0.5
#: Pause between the write-back's fair windows once its ring is stalled (reads go on).
RETRY_PAUSE_S = 1.0
#: After a synchronous SSD write ended refused, further ones skip the fair window this long.
REFUSING_HOLD_S = 1.0


def retry_refused(
    call: BatchCall, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int],
    ok: list[bool], *, gate: threading.Lock, window_s: float,
    first_delay_s: float = RETRY_FIRST_DELAY_S,
) -> int:
    """Write the keys ``ok`` marks False again, holding ``gate`` (SSD reads wait), with doubling
    pauses from ``first_delay_s`` until every one is taken or ``window_s`` has passed; ``ok`` is
    updated in place. Returns the key writes repeated."""
    retried = 0
    delay = first_delay_s
    with gate:
        deadline = time.monotonic() + window_s
        while not all(ok):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(delay, left))
            delay *= 2
            idx = [i for i, good in enumerate(ok) if not good]
            got = call([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx])
            retried += len(idx)
            for j, i in enumerate(idx):
                ok[i] = got[j] is True
    return retried


class SyncSsdWriter:
    """The synchronous SSD write of a put (see the module docstring); counts what it repeated
    (``retries``) and what the SSD still refused (``refused``)."""

    def __init__(self, put: BatchCall, *, gate: threading.Lock, window_s: float,
                 warn: RateLimitedLog, stalled: Callable[[], bool]) -> None:
        self._put = put
        self._gate = gate
        self._window_s = window_s
        self._warn = warn
        self._stalled = stalled  # the write-back ring knows the SSD keeps refusing
        self._refusing_until = 0.0
        self._lock = threading.Lock()
        self.retries = 0
        self.refused = 0

    def write(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
              ) -> list[bool]:
        ok = self._put(keys, ptrs, sizes)
        retried = 0
        if not all(ok) and not self._stalled() and time.monotonic() >= self._refusing_until:
            retried = retry_refused(self._put, keys, ptrs, sizes, ok, gate=self._gate,
                                    window_s=self._window_s)
        refused = len(ok) - sum(ok)
        if refused:
            self._refusing_until = time.monotonic() + REFUSING_HOLD_S
        with self._lock:
            self.retries += retried
            self.refused += refused
        if refused:
            self._warn.warn("ssd_refused", "the SSD tier refused %d of %d keys of a synchronous "
                            "write after retrying; those pages are reported not stored",
                            refused, len(ok))
        return ok
