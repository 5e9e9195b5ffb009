"""What the store needs from a UMBP client: mori's ``UMBPClient`` batch calls, by pointer.

The real client (:mod:`hicache_umbp.clients`), the tiered composition
(:class:`~hicache_umbp.store.tiers.TieredClient`) and the in-process double
(``tests/support/memory_client.py``, test support, not shipped) all satisfy it; the double is
trusted only because it passes the same contract suite as the real mori
(tests/backend/contract.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class UMBPClientLike(Protocol):
    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]: ...

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]: ...

    def batch_exists(self, keys: Sequence[str]) -> list[bool]: ...

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int: ...

    def register_memory(self, ptr: int, size: int) -> bool: ...

    def deregister_memory(self, ptr: int) -> None: ...

    def flush(self) -> bool: ...
