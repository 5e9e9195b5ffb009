"""An in-process UMBP client double with the observed semantics of amd-mori 1.2.4.

Used where the real mori is not importable (the Python 3.11 project venv, unit tests) and for
fault injection. It is trusted only because it passes the same contract suite as the real
clients (``tests/backend/contract.py``, run against real mori DRAM, SSD and standalone in
``tests/backend/test_client_contract_mori.py``).

Semantics copied from the real ``mori.umbp.UMBPClient`` (measured on 1.2.4, embedded DRAM):

* ``batch_put_from_ptr`` copies ``size`` bytes from each pointer. An entry fails (False) when
  it does not fit in the free capacity *at that point of the batch*; later, smaller entries of
  the same batch may still succeed (no eviction happens inside a batch). Size 0 fails.
* After each put call, if used bytes >= ``high_watermark * capacity`` (0.9), least recently
  used keys are evicted until used <= ``low_watermark * capacity`` (0.7).
* Keys are write-once: putting a key that is present returns True and keeps the old bytes
  (and the old size). A key that was evicted can be put again with new data. A key repeated
  inside one batch: the first entry wins, the repeat returns False.
* ``batch_get_into_ptr`` needs the exact stored size; a smaller or larger size returns False
  and writes nothing. A get refreshes the key's LRU position.
* ``batch_exists_consecutive`` counts present keys from the start up to the first miss.
* Keys, pointers and sizes of different lengths: every entry False (mori logs an error).
* ``clear()`` drops everything and, as in embedded mori, later puts fail.
* Empty batches return ``[]`` / ``0``.

Differences from real mori, on purpose: capacity is counted in bytes rounded up to
``granularity`` (mori's slab allocator charges small values a whole slot: on 1.2.4 a 1 MiB
pool holds 16 values of 1000 B; for page-sized values of >= 256 KiB it charges their size);
mori protects recently read keys with a read lease, the double uses plain LRU.

Options that model the other real clients: ``max_batch`` (the SSD path's 16 staging slots:
entries past it fail in one call) and ``require_registered`` (standalone: pointers must lie in
registered memory).

Fault injection (for the store's never-raise tests): ``inject(method, fault, times)`` makes
the next ``times`` calls of ``method`` raise ``RuntimeError`` (``"raise"``), return all-False
(``"false"``), return ``None`` (``"none"``) or, for batch methods, fail every other entry
(``"partial"``). ``calls`` counts every call per method, so tests can assert how many mori
calls an operation made (e.g. none for an empty key list).
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

Fault = Literal["raise", "false", "none", "partial"]
FAULTS: tuple[str, ...] = ("raise", "false", "none", "partial")
METHODS: tuple[str, ...] = (
    "batch_put_from_ptr",
    "batch_get_into_ptr",
    "batch_exists",
    "batch_exists_consecutive",
    "register_memory",
    "deregister_memory",
    "flush",
    "clear",
)


class InjectedFault(RuntimeError):
    """Raised by the double when a ``"raise"`` fault is injected."""


class MemoryUMBPClient:
    """In-process stand-in for ``mori.umbp.UMBPClient`` (see the module docstring)."""

    def __init__(
        self,
        capacity_bytes: int,
        *,
        high_watermark: float = 0.9,
        low_watermark: float = 0.7,
        granularity: int = 1,
        max_batch: int | None = None,
        require_registered: bool = False,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        if not 0.0 < low_watermark <= high_watermark <= 1.0:
            raise ValueError(
                f"watermarks must satisfy 0 < low <= high <= 1, got low={low_watermark} "
                f"high={high_watermark}"
            )
        if granularity < 1:
            raise ValueError(f"granularity must be >= 1, got {granularity}")
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}")
        self.capacity_bytes = capacity_bytes
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self.granularity = granularity
        self.max_batch = max_batch
        self.require_registered = require_registered
        self.calls: Counter[str] = Counter()
        self.evictions = 0
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._used = 0
        self._cleared = False
        self._regions: dict[int, int] = {}
        self._faults: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ fault injection
    def inject(self, method: str, fault: Fault, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` misbehave as ``fault``."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; allowed: {', '.join(FAULTS)}")
        with self._lock:
            self._faults.setdefault(method, []).extend([fault] * times)

    def _take_fault(self, method: str) -> str | None:
        self.calls[method] += 1
        queue = self._faults.get(method)
        if not queue:
            return None
        fault = queue.pop(0)
        if fault == "raise":
            raise InjectedFault(f"injected fault in {method}")
        return fault

    @staticmethod
    def _faulty(fault: str, n: int, good: list[bool] | None = None) -> Any:
        if fault == "none":
            return None
        if fault == "partial" and good is not None:
            return [ok and i % 2 == 0 for i, ok in enumerate(good)]
        return [False] * n

    # ------------------------------------------------------------------ introspection
    @property
    def used_bytes(self) -> int:
        return self._used

    def keys(self) -> list[str]:
        """Present keys, least recently used first."""
        with self._lock:
            return list(self._data)

    def _charge(self, size: int) -> int:
        g = self.granularity
        return -(-size // g) * g

    def _in_registered(self, ptr: int, size: int) -> bool:
        return any(base <= ptr and ptr + size <= base + n for base, n in self._regions.items())

    # ------------------------------------------------------------------ the client API
    def batch_put_from_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        with self._lock:
            fault = self._take_fault("batch_put_from_ptr")
            if fault == "none" or fault == "false":
                return self._faulty(fault, len(keys))
            result = self._put_locked(keys, ptrs, sizes)
            if fault == "partial":
                return self._faulty(fault, len(keys), result)
            return result

    def _put_locked(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n:
            return [False] * n
        out = [False] * n
        if self._cleared:
            return out
        seen: set[str] = set()
        for i, (key, ptr, size) in enumerate(zip(keys, ptrs, sizes, strict=True)):
            if self.max_batch is not None and i >= self.max_batch:
                break
            if key in seen:
                continue
            seen.add(key)
            if key in self._data:
                out[i] = True  # write-once: keep the old bytes
                continue
            if size <= 0 or ptr == 0:
                continue
            if self.require_registered and not self._in_registered(ptr, size):
                continue
            charge = self._charge(size)
            if self._used + charge > self.capacity_bytes:
                continue
            self._data[key] = ctypes.string_at(ptr, size)
            self._used += charge
            out[i] = True
        if self._used >= self.high_watermark * self.capacity_bytes:
            floor = self.low_watermark * self.capacity_bytes
            while self._data and self._used > floor:
                _, old = self._data.popitem(last=False)
                self._used -= self._charge(len(old))
                self.evictions += 1
        return out

    def batch_get_into_ptr(
        self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        with self._lock:
            fault = self._take_fault("batch_get_into_ptr")
            if fault == "none" or fault == "false":
                return self._faulty(fault, len(keys))
            n = len(keys)
            out = [False] * n
            if len(ptrs) == n and len(sizes) == n:
                for i, (key, ptr, size) in enumerate(zip(keys, ptrs, sizes, strict=True)):
                    if self.max_batch is not None and i >= self.max_batch:
                        break
                    data = self._data.get(key)
                    if data is None or len(data) != size or ptr == 0:
                        continue
                    if self.require_registered and not self._in_registered(ptr, size):
                        continue
                    ctypes.memmove(ptr, data, size)
                    self._data.move_to_end(key)
                    out[i] = True
            if fault == "partial":
                return self._faulty(fault, n, out)
            return out

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            fault = self._take_fault("batch_exists")
            out = [k in self._data for k in keys]
            if fault is not None:
                return self._faulty(fault, len(keys), out)
            return out

    def batch_exists_consecutive(self, keys: Sequence[str]) -> int:
        with self._lock:
            fault = self._take_fault("batch_exists_consecutive")
            if fault == "none":
                return None  # type: ignore[return-value]
            if fault is not None:
                return 0
            count = 0
            for key in keys:
                if key not in self._data:
                    break
                count += 1
            return count

    def exists(self, key: str) -> bool:
        return self.batch_exists([key])[0]

    def put_from_ptr(self, key: str, src: int, size: int) -> bool:
        return self.batch_put_from_ptr([key], [src], [size])[0]

    def get_into_ptr(self, key: str, dst: int, size: int) -> bool:
        return self.batch_get_into_ptr([key], [dst], [size])[0]

    def register_memory(self, ptr: int, size: int, *args: Any) -> bool:
        with self._lock:
            fault = self._take_fault("register_memory")
            if fault is not None:
                return None if fault == "none" else False  # type: ignore[return-value]
            if ptr == 0 or size <= 0:
                return False
            self._regions[ptr] = size
            return True

    def deregister_memory(self, ptr: int) -> None:
        with self._lock:
            self._take_fault("deregister_memory")
            self._regions.pop(ptr, None)

    def flush(self) -> bool:
        with self._lock:
            fault = self._take_fault("flush")
            if fault is not None:
                return None if fault == "none" else False  # type: ignore[return-value]
            return True

    def clear(self) -> bool:
        with self._lock:
            fault = self._take_fault("clear")
            if fault is not None:
                return None if fault == "none" else False  # type: ignore[return-value]
            self._data.clear()
            self._used = 0
            self._cleared = True
            return True
