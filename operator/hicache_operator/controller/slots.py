"""Reconcile slots: at most ``n`` reconciles at once, new and changed CRs first.

After an operator restart every existing CR is reconciled once (kopf lists them), each with a
dozen API reads; with a plain semaphore a CR created right then queued behind all of them (8
CRs: 14 s before its StatefulSet; thousands: minutes). A waiter marked urgent (its generation
not yet observed: new or changed) takes the next free slot before every waiter that is not;
among equals, first come first served.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator

__all__ = ["PrioritySlots"]


class PrioritySlots:
    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"slots={n!r} must be >= 1")
        self._free = n
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = 0

    @property
    def waiting(self) -> int:
        return sum(not f.done() for _, _, f in self._waiters)

    @contextlib.asynccontextmanager
    async def slot(self, urgent: bool) -> AsyncIterator[None]:
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, urgent: bool) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (0 if urgent else 1, self._seq, future))
        self._seq += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed a slot just as it was cancelled: pass it on
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():  # a cancelled waiter's future is done: skipped
                future.set_result(None)  # the slot passes straight to it
                return
        self._free += 1
