"""The write-back ring: first-in-first-out slots carved from one staging buffer.

:class:`Ring` hands out slots in first-in-first-out order from one buffer, and slots may be
released in any order (the space is reused once every older slot is released). The buffer is any
:class:`StagingBuffer`: :class:`MemfdStaging` for embedded clients, or mori's shared memory for
standalone servers (:class:`hicache_umbp.clients.buffers.MoriShmStaging`). How large the ring is:
:func:`hicache_umbp.contract.staging.write_back_ring_keys`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol


class StagingBuffer(Protocol):
    """Host memory the write-back ring lives in."""

    ptr: int
    size: int

    def close(self) -> None: ...


class MemfdStaging:
    """A memfd-backed mapping: enough for embedded clients (the default)."""

    def __init__(self, size: int) -> None:
        self.size = size
        fd = os.memfd_create("hicache-tier-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._anchor: Any = ctypes.c_char.from_buffer(self._map)
        self.ptr: int = ctypes.addressof(self._anchor)

    def close(self) -> None:
        del self._anchor
        self._map.close()


@dataclass
class Slot:
    key: str
    offset: int
    size: int
    released: bool = False


class Ring:
    """First-in-first-out space in one buffer; slots may be released in any order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: deque[Slot] = deque()
        self.head = 0  # where the next slot starts

    def alloc(self, key: str, size: int) -> Slot | None:
        if not 0 < size <= self.size:
            return None
        if not self.slots:
            start = 0
        else:
            tail = self.slots[0].offset
            if self.head > tail:  # live bytes are [tail, head): free at the end, then [0, tail)
                if self.head + size <= self.size:
                    start = self.head
                elif size <= tail:
                    start = 0
                else:
                    return None
            elif self.head + size <= tail:  # wrapped: free bytes are [head, tail)
                start = self.head
            else:
                return None
        slot = Slot(key, start, size)
        self.slots.append(slot)
        self.head = start + size
        return slot

    def undo(self, count: int) -> None:
        """Drop the ``count`` newest slots (a batch that did not fit as a whole)."""
        for _ in range(count):
            self.slots.pop()
        self.head = self.slots[-1].offset + self.slots[-1].size if self.slots else 0

    def release(self, slot: Slot) -> None:
        slot.released = True
        while self.slots and self.slots[0].released:
            self.slots.popleft()
