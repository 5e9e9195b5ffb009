"""Staging memory from mori: the write-back ring's buffer for standalone servers, which accept
only buffers mori's host allocator made (see :mod:`hicache_umbp.store.ring` for the ring)."""

from __future__ import annotations

from typing import Any

from .runtime import import_umbp


class MoriShmStaging:
    """Memory from mori's host allocator with ``AnonymousShm`` backing.

    Standalone servers accept only buffers mori allocated that way (``register_memory`` of
    anything else raises), so a tiered client over standalone servers stages through this.
    """

    def __init__(self, size: int) -> None:
        umbp = import_umbp()
        self._allocator = umbp.UMBPHostMemAllocator()
        self._handle: Any = self._allocator.alloc(
            size, umbp.UMBPHostBufferBacking.AnonymousShm, 0, -1, False
        )
        self.ptr = int(self._handle.ptr)
        self.size = size

    def close(self) -> None:
        if self._handle is not None:
            self._allocator.free(self._handle)
            self._handle = None
