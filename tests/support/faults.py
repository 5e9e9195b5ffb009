"""Fault injection around a REAL UMBP client (amd-mori 1.2.4), for the never-raise tests.

:class:`FaultyClient` forwards every call to the client it wraps (the real mori client the
store would have opened) and, when told to, makes the next calls of one method raise
``RuntimeError`` (``"raise"``), return all-False (``"false"``), return ``None`` (``"none"``)
or report every other entry of a batch as failed (``"partial"``; the real call still ran, as
when mori copies some values and refuses others). ``calls`` counts calls per method, so a
test can assert how many client calls an operation made.

Unlike the in-memory double (:mod:`support.memory_client`), nothing below the injected fault
is simulated: bytes, capacity, write-once keys and exact-size gets are mori's own.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from .memory_client import FAULTS, METHODS, Fault


class FaultyClient:
    """A real client with injectable faults and call counts (see the module docstring)."""

    def __init__(self, inner: Any, on_close: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self._faults: dict[str, tuple[str, int]] = {}
        self._on_close = on_close
        self._lock = threading.Lock()
        self.closed = 0

    def inject(self, method: str, fault: Fault, times: int = 1) -> None:
        if method not in METHODS or fault not in FAULTS or times < 1:
            raise ValueError(f"cannot inject {fault!r} into {method!r} x{times}")
        with self._lock:
            self._faults[method] = (fault, times)

    def _take(self, method: str) -> str | None:
        with self._lock:
            self.calls[method] += 1
            fault, left = self._faults.get(method, (None, 0))
            if fault is None:
                return None
            if left <= 1:
                del self._faults[method]
            else:
                self._faults[method] = (fault, left - 1)
            return fault

    def _batch(self, method: str, keys: Any, *args: Any) -> Any:
        fault = self._take(method)
        if fault == "raise":
            raise RuntimeError(f"injected fault in {method}")
        if fault == "none":
            return None
        if fault == "false":
            return 0 if method == "batch_exists_consecutive" else [False] * len(keys)
        got = getattr(self.inner, method)(keys, *args)
        if fault == "partial":
            if method == "batch_exists_consecutive":
                return int(got) // 2
            return [bool(r) and i % 2 == 0 for i, r in enumerate(got)]
        return got

    def batch_put_from_ptr(self, keys: Any, ptrs: Any, sizes: Any) -> Any:
        return self._batch("batch_put_from_ptr", keys, ptrs, sizes)

    def batch_get_into_ptr(self, keys: Any, ptrs: Any, sizes: Any) -> Any:
        return self._batch("batch_get_into_ptr", keys, ptrs, sizes)

    def batch_exists(self, keys: Any) -> Any:
        return self._batch("batch_exists", keys)

    def batch_exists_consecutive(self, keys: Any) -> Any:
        return self._batch("batch_exists_consecutive", keys)

    def register_memory(self, ptr: int, size: int) -> Any:
        fault = self._take("register_memory")
        if fault == "raise":
            raise RuntimeError("injected fault in register_memory")
        if fault in ("false", "none", "partial"):
            return None if fault == "none" else False
        return self.inner.register_memory(ptr, size)

    def deregister_memory(self, ptr: int) -> Any:
        self._take("deregister_memory")
        return self.inner.deregister_memory(ptr)

    def flush(self) -> Any:
        if self._take("flush") == "raise":
            raise RuntimeError("injected fault in flush")
        return self.inner.flush()

    def clear(self) -> Any:
        if self._take("clear") == "raise":
            raise RuntimeError("injected fault in clear")
        return self.inner.clear()

    def close(self) -> None:
        """What closing the store's own client does (``OpenedClient.close``: flush, hooks)."""
        self.closed += 1
        if self._on_close is not None:
            self._on_close()


@contextlib.contextmanager
def use_client_opener(opener: Callable[[Any], Any]) -> Iterator[None]:
    """SGLang backends of our adapter open their UMBP client with ``opener`` (rank config ->
    client) instead of the configuration's mori clients while the block runs. The adapter opens
    its client when SGLang registers the host pool: register inside the block.

    The seam is the adapter module's name ``build_store`` (the store builder's own ``opener``
    argument), replaced here for the block only: nothing in the product knows about it.
    """
    from hicache_umbp.sglang import adapter

    real = vars(adapter)["build_store"]

    def build_store(rank_config: Any, **kw: Any) -> Any:
        return real(rank_config, opener=opener, **kw)

    setattr(adapter, "build_store", build_store)  # noqa: B010 (the module's name is the seam)
    try:
        yield
    finally:
        setattr(adapter, "build_store", real)  # noqa: B010


def real_client_opener(
    made: list[FaultyClient] | None = None,
) -> Callable[[Any], FaultyClient]:
    """A client opener (:func:`use_client_opener`) that opens the REAL mori client the
    rank's configuration asks for (one medium: the DRAM tier, embedded or standalone) and
    wraps it in a :class:`FaultyClient`; each one is appended to ``made``."""
    from hicache_umbp.clients.factories import make_client

    def opener(rank_config: Any) -> FaultyClient:
        media = rank_config.media()
        if len(media) != 1:
            raise ValueError(f"real_client_opener opens one medium, the rank asks for {media}")
        opened = make_client(rank_config, media[0])
        client = FaultyClient(opened.client, on_close=opened.close)
        if made is not None:
            made.append(client)
        return client

    return opener
