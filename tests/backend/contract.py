"""The contract of "a UMBP client": what the store relies on, as plain checks over a subject.

A :class:`Subject` opens fresh clients of a given capacity (in values of ``value_bytes``) and
says how the client must be fed (batch limit, registered memfd buffers). The same checks run
against the in-process double (tests/backend/test_client_contract.py) and against the real
amd-mori 1.2.4 -- embedded DRAM, embedded SSD node, standalone DRAM and SSD servers
(tests/backend/test_client_contract_mori.py). The double is trusted only because it passes them.

Buffers are memfd-backed mappings (:class:`Arena`), which every real client accepts (the
standalone server maps them by fd); they are registered once per client.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from hicache_umbp.clients.factories import OpenedClient


class Arena:
    """A memfd-backed buffer with its address and a numpy view (both venvs, no mori).

    The standalone server accepts only buffers mori's own allocator made: those subjects pass
    ``HostArena`` (hicache_umbp.hostmem.allocator, shared) instead."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._fd = os.memfd_create("umbp-contract", 0)
        os.ftruncate(self._fd, nbytes)
        self._map = mmap.mmap(self._fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = np.frombuffer(self._map, dtype=np.uint8)
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def close(self) -> None:
        del self.view
        self._map.close()
        os.close(self._fd)


class HostArena:
    """An :class:`Arena` from :class:`hicache_umbp.hostmem.allocator.HostAllocator`
    (memfd-backed)."""

    def __init__(self, nbytes: int) -> None:
        from hicache_umbp.hostmem.allocator import HostAllocator

        self.nbytes = nbytes
        self._buf = HostAllocator(hugepage_bytes=0, shared=True, prefault=False).alloc(nbytes)
        self.view = np.frombuffer(self._buf.view(), dtype=np.uint8)
        self.ptr = self._buf.ptr

    def close(self) -> None:
        del self.view
        self._buf.free()


@dataclass
class Subject:
    """One kind of client under contract."""

    name: str
    #: opens a fresh, empty client holding ``capacity_values`` values of ``value_bytes``
    open: Callable[[int], OpenedClient]
    value_bytes: int = 1 << 20
    arena: Callable[[int], Arena | HostArena] = Arena
    #: ``clear()`` makes later puts fail (embedded mori and standalone servers do)
    clear_disables_puts: bool = True
    #: DRAM refuses what does not fit in one batch; mori's SSD log makes room inside the batch
    full_batch_fails_tail: bool = True
    #: smallest capacity (in values) the checks use: mori 1.2.4's SSD tier misbehaves in tiny
    #: pools (below ~64 MiB puts fail with SSD write errors or keys are lost)
    min_capacity_values: int = 0
    #: exists is exact after eviction. mori 1.2.4's SSD tier sometimes reports an evicted key
    #: present (exists True, get False): the store must treat SSD exists as a hint.
    exists_exact: bool = True
    #: puts/gets only work on registered memory (the standalone server maps registered memfds)
    requires_registration: bool = False


@dataclass
class Ctx:
    """An opened client, its arena (``slots`` source values then ``slots`` destinations)."""

    opened: OpenedClient
    arena: Arena | HostArena
    slots: int
    value_bytes: int
    rng: np.random.Generator

    @property
    def client(self) -> Any:
        return self.opened.client

    def src(self, i: int) -> int:
        return self.arena.ptr + i * self.value_bytes

    def dst(self, i: int) -> int:
        return self.arena.ptr + (self.slots + i) * self.value_bytes

    def src_view(self, i: int) -> np.ndarray:
        v = self.value_bytes
        return self.arena.view[i * v : (i + 1) * v]

    def dst_view(self, i: int) -> np.ndarray:
        v = self.value_bytes
        return self.arena.view[(self.slots + i) * v : (self.slots + i + 1) * v]

    def fill(self, i: int) -> None:
        self.src_view(i)[:] = self.rng.integers(0, 256, self.value_bytes, dtype=np.uint8)

    @property
    def batch(self) -> int:
        limit = self.opened.max_batch_keys
        return self.slots if limit is None else min(limit, self.slots)

    def put(self, keys: list[str], first_slot: int = 0) -> list[bool]:
        """Put ``keys`` from consecutive source slots, in batches the client accepts."""
        out: list[bool] = []
        for start in range(0, len(keys), self.batch):
            chunk = keys[start : start + self.batch]
            slots = range(first_slot + start, first_slot + start + len(chunk))
            out += self.client.batch_put_from_ptr(
                chunk, [self.src(s) for s in slots], [self.value_bytes] * len(chunk)
            )
        return out

    def get(self, keys: list[str]) -> list[bool]:
        out: list[bool] = []
        for start in range(0, len(keys), self.batch):
            chunk = keys[start : start + self.batch]
            slots = range(start, start + len(chunk))
            out += self.client.batch_get_into_ptr(
                chunk, [self.dst(s) for s in slots], [self.value_bytes] * len(chunk)
            )
        return out


@contextmanager
def opened(subject: Subject, capacity_values: int, slots: int = 24, seed: int = 0) -> Iterator[Ctx]:
    arena = subject.arena(2 * slots * subject.value_bytes)
    client = subject.open(capacity_values)
    try:
        assert client.client.register_memory(arena.ptr, arena.nbytes) is True
        ctx = Ctx(client, arena, slots, subject.value_bytes, np.random.default_rng(seed))
        for i in range(slots):
            ctx.fill(i)
        yield ctx
        client.client.deregister_memory(arena.ptr)
    finally:
        client.close()
        arena.close()


def keys_of(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:04d}" for i in range(n)]


# ----------------------------------------------------------------------------- the checks


def check_roundtrip_byte_exact(s: Subject) -> None:
    with opened(s, capacity_values=64) as c:
        n = min(c.batch, 12)
        keys = keys_of("rt", n)
        assert c.put(keys) == [True] * n
        assert c.client.batch_exists(keys) == [True] * n
        assert c.get(keys) == [True] * n
        for i in range(n):
            assert np.array_equal(c.dst_view(i), c.src_view(i)), f"value {i} differs"


def check_missing_keys(s: Subject) -> None:
    with opened(s, capacity_values=16) as c:
        c.dst_view(0)[:] = 7
        assert c.client.batch_exists(["nope"]) == [False]
        assert c.client.batch_get_into_ptr(["nope"], [c.dst(0)], [c.value_bytes]) == [False]
        assert int(c.dst_view(0).min()) == int(c.dst_view(0).max()) == 7, "miss wrote bytes"


def check_get_needs_exact_size(s: Subject) -> None:
    with opened(s, capacity_values=16) as c:
        assert c.put(["k"]) == [True]
        v = c.value_bytes
        for size in (v // 2, v - 1, v + 1, 2 * v):
            c.dst_view(0)[:] = 0
            assert c.client.batch_get_into_ptr(["k"], [c.dst(0)], [size]) == [False], size
        assert c.client.batch_get_into_ptr(["k"], [c.dst(0)], [v]) == [True]
        assert np.array_equal(c.dst_view(0), c.src_view(0))


def check_write_once(s: Subject) -> None:
    with opened(s, capacity_values=16) as c:
        assert c.put(["k"], first_slot=0) == [True]
        assert c.client.batch_put_from_ptr(["k"], [c.src(1)], [c.value_bytes]) == [True]
        assert c.client.batch_get_into_ptr(["k"], [c.dst(0)], [c.value_bytes]) == [True]
        assert np.array_equal(c.dst_view(0), c.src_view(0)), "re-put replaced the old value"
        assert not np.array_equal(c.src_view(0), c.src_view(1))


def check_repeated_key_in_one_batch(s: Subject) -> None:
    with opened(s, capacity_values=16) as c:
        got = c.client.batch_put_from_ptr(["d", "d"], [c.src(0), c.src(1)], [c.value_bytes] * 2)
        assert got == [True, False]
        assert c.client.batch_get_into_ptr(["d"], [c.dst(0)], [c.value_bytes]) == [True]
        assert np.array_equal(c.dst_view(0), c.src_view(0))


def check_exists_consecutive(s: Subject) -> None:
    with opened(s, capacity_values=16) as c:
        keys = keys_of("c", 4)
        assert c.put([keys[0], keys[1], keys[3]]) == [True] * 3
        assert c.client.batch_exists_consecutive(keys) == 2
        assert c.client.batch_exists_consecutive(keys[:2]) == 2
        assert c.client.batch_exists_consecutive(["nope", *keys]) == 0
        assert c.client.batch_exists_consecutive(keys[3:]) == 1
        assert c.client.batch_exists(keys) == [True, True, False, True]


def check_empty_batches(s: Subject) -> None:
    with opened(s, capacity_values=8) as c:
        assert c.client.batch_put_from_ptr([], [], []) == []
        assert c.client.batch_get_into_ptr([], [], []) == []
        assert c.client.batch_exists([]) == []
        assert c.client.batch_exists_consecutive([]) == 0


def check_mismatched_lengths_fail_every_entry(s: Subject) -> None:
    with opened(s, capacity_values=8) as c:
        v = c.value_bytes
        assert c.client.batch_put_from_ptr(["a", "b"], [c.src(0)], [v, v]) == [False, False]
        assert c.client.batch_exists(["a", "b"]) == [False, False]
        assert c.put(["a"]) == [True]
        assert c.client.batch_get_into_ptr(["a", "b"], [c.dst(0)], [v]) == [False, False]


def check_full_batch_partly_fails(s: Subject) -> None:
    """A batch larger than the free space: the head fits, the tail fails, nothing lies.

    (SSD clients make room inside the batch instead: they must then keep every key exact.)"""
    cap = 8
    if not s.full_batch_fails_tail:
        check_keeps_working_past_capacity(s)
        return
    with opened(s, capacity_values=cap) as c:
        n = min(c.batch, cap + 4)
        keys = keys_of("full", n)
        got = c.put(keys)
        assert got[:cap] == [True] * cap and got[cap:] == [False] * (n - cap), got
        present = c.client.batch_exists(keys)
        assert not any(present[cap:]), "a failed put is reported present"
        # every key that still exists reads back byte-exact
        for i, key in enumerate(keys):
            if present[i]:
                assert c.client.batch_get_into_ptr([key], [c.dst(0)], [c.value_bytes]) == [True]
                assert np.array_equal(c.dst_view(0), c.src_view(i)), f"{key} corrupted"


def check_keeps_working_past_capacity(s: Subject) -> None:
    """Writing 3x the capacity: old keys make room, new puts succeed, and every key reported
    present reads back byte-exact (a key that exists must not miss)."""
    cap = max(8, s.min_capacity_values)
    with opened(s, capacity_values=cap) as c:
        written: list[tuple[str, int]] = []
        step = 1 if cap <= 8 else c.batch  # singles for small pools, full batches for big ones
        for rnd in range(0, 3 * cap, step):
            keys = [f"wave-{i:04d}" for i in range(rnd, rnd + step)]
            slot = rnd % (c.slots - step + 1)
            assert c.put(keys, first_slot=slot) == [True] * step, f"put {rnd} failed"
            written += [(k, slot + j) for j, k in enumerate(keys)]
        keys = [k for k, _ in written]
        present = c.client.batch_exists(keys)
        assert present[-1], "the newest key is gone"
        assert 0 < sum(present) <= cap
        assert not all(present[:cap]), "nothing was evicted"
        overreported = 0
        for (key, slot), here in zip(written, present, strict=True):
            ok = c.client.batch_get_into_ptr([key], [c.dst(0)], [c.value_bytes])
            if ok == [True]:
                assert here, f"{key} reads back but exists said no"
                assert np.array_equal(c.dst_view(0), c.src_view(slot)), f"{key} corrupted"
            elif here:
                overreported += 1
        if s.exists_exact:
            assert overreported == 0, f"{overreported} keys exist but do not read back"
        else:
            assert overreported < sum(present), "no present key reads back"


def check_batch_limit_is_honoured(s: Subject) -> None:
    """Batches up to ``max_batch_keys`` of full-size values all succeed (the store's chunk)."""
    with opened(s, capacity_values=64, slots=32) as c:
        n = c.batch
        keys = keys_of("lim", n)
        got = c.client.batch_put_from_ptr(
            keys, [c.src(i) for i in range(n)], [c.value_bytes] * n
        )
        assert got == [True] * n
        got = c.client.batch_get_into_ptr(keys, [c.dst(i) for i in range(n)], [c.value_bytes] * n)
        assert got == [True] * n
        assert all(np.array_equal(c.dst_view(i), c.src_view(i)) for i in range(n))


def check_flush_and_clear(s: Subject) -> None:
    with opened(s, capacity_values=16) as c:
        keys = keys_of("cl", 3)
        assert c.put(keys) == [True] * 3
        assert c.client.flush() is True
        assert c.client.clear() is True
        assert c.client.batch_exists(keys) == [False] * 3
        assert c.client.batch_get_into_ptr(keys[:1], [c.dst(0)], [c.value_bytes]) == [False]
        after = c.put(["after-clear"], first_slot=5)
        assert after == [not s.clear_disables_puts]


def check_unregistered_memory(s: Subject) -> None:
    """Embedded clients copy from any pointer; standalone ones only from registered memory."""
    with opened(s, capacity_values=16) as c:
        other = s.arena(2 * c.value_bytes)
        try:
            other.view[: c.value_bytes] = 9
            got = c.client.batch_put_from_ptr(["u"], [other.ptr], [c.value_bytes])
            assert got == [not s.requires_registration]
            assert c.client.batch_exists(["u"]) == got
        finally:
            other.close()


CHECKS: tuple[Callable[[Subject], None], ...] = (
    check_roundtrip_byte_exact,
    check_missing_keys,
    check_get_needs_exact_size,
    check_write_once,
    check_repeated_key_in_one_batch,
    check_exists_consecutive,
    check_empty_batches,
    check_mismatched_lengths_fail_every_entry,
    check_full_batch_partly_fails,
    check_keeps_working_past_capacity,
    check_batch_limit_is_honoured,
    check_flush_and_clear,
    check_unregistered_memory,
)
