"""Concurrent writers of the same pages with different bytes, and readers that check every hit
page is whole: K and V from the same write (shared by the unit and mori tiers).

Writer ``w`` fills both parts of every page it writes with the byte ``w + 1``; a reader that
gets a page whose two parts hold different bytes (or a part that is not uniform) has seen a
torn page. Counts only: hits, torn pages, rounds; no timing.
"""

from __future__ import annotations

import ctypes
import random
import threading
from dataclasses import dataclass, field

from hicache_umbp.store.store import UMBPStore


@dataclass
class TornPageReport:
    hits: int = 0
    misses: int = 0
    torn: int = 0
    examples: list[tuple[str, int, int]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


def hammer(
    store: UMBPStore,
    *,
    pages: int,
    part: int,
    writers: int = 3,
    readers: int = 2,
    min_hits: int = 1000,
    max_rounds: int = 2000,
    batch: int = 4,
    seed: int = 0,
    alloc: type | None = None,
) -> TornPageReport:
    """``writers`` threads write every page again and again (shuffled, ``batch`` pages per
    call) while ``readers`` threads read random batches, until the readers have seen
    ``min_hits`` hit pages (or the writers did ``max_rounds`` rounds); returns what the readers
    saw. Counting, not timing: a slow machine runs longer, never less.

    ``alloc(nbytes)`` makes a buffer with ``.ptr`` (and ``.close()``); default: ctypes memory.
    Buffers are registered with the store (standalone servers need it).
    """
    hashes = [f"{i:064x}" for i in range(pages)]
    report = TornPageReport()
    lock = threading.Lock()
    enough = threading.Event()
    buffers: list[object] = []

    def buffer(nbytes: int, fill: int) -> int:
        if alloc is None:
            mem = ctypes.create_string_buffer(bytes([fill]) * nbytes, nbytes)
            buffers.append(mem)
            ptr = ctypes.addressof(mem)
        else:
            mem = alloc(nbytes)
            buffers.append(mem)
            ptr = int(mem.ptr)
            ctypes.memset(ptr, fill, nbytes)
        assert store.register_buffer(ptr, nbytes)
        return ptr

    def parts_of(base: int, slot: int) -> list[tuple[int, int]]:
        return [(base + (2 * slot + p) * part, part) for p in range(2)]

    def write(w: int) -> None:
        rng = random.Random(seed * 100 + w)
        base = buffer(2 * batch * part, w + 1)
        for _ in range(max_rounds):
            if enough.is_set():
                return
            order = list(range(pages))
            rng.shuffle(order)
            for s in range(0, pages, batch):
                chunk = order[s : s + batch]
                store.batch_set([hashes[i] for i in chunk], [parts_of(base, j)
                                                             for j in range(len(chunk))])

    def read(r: int, stop: threading.Event) -> None:
        rng = random.Random(seed * 100 + 50 + r)
        base = buffer(2 * batch * part, 0)
        while not stop.is_set():
            chunk = rng.sample(range(pages), batch)
            ctypes.memset(base, 0, 2 * batch * part)
            got = store.batch_get([hashes[i] for i in chunk], [parts_of(base, j)
                                                               for j in range(batch)])
            for j, ok in enumerate(got):
                if not ok:
                    with lock:
                        report.misses += 1
                    continue
                k = ctypes.string_at(base + 2 * j * part, part)
                v = ctypes.string_at(base + (2 * j + 1) * part, part)
                whole = k == bytes([k[0]]) * part and v == bytes([v[0]]) * part
                with lock:
                    report.hits += 1
                    if report.hits >= min_hits:
                        enough.set()
                    if not whole or k[0] != v[0]:
                        report.torn += 1
                        if len(report.examples) < 5:
                            report.examples.append((hashes[chunk[j]][-4:], k[0], v[0]))

    def guarded(fn: object, *args: object) -> None:
        try:
            fn(*args)  # type: ignore[operator]
        except BaseException as e:  # surfaced by the caller
            with lock:
                report.errors.append(e)

    stop = threading.Event()
    ws = [threading.Thread(target=guarded, args=(write, w)) for w in range(writers)]
    rs = [threading.Thread(target=guarded, args=(read, r, stop)) for r in range(readers)]
    for t in ws + rs:
        t.start()
    for t in ws:
        t.join()
    stop.set()
    enough.set()
    for t in rs:
        t.join()
    store.flush()
    # A final read of every page after the writers are done: nothing may be torn either.
    final = buffer(2 * part, 0)
    for h in hashes:
        if store.batch_get([h], [parts_of(final, 0)]) == [True]:
            k = ctypes.string_at(final, part)
            v = ctypes.string_at(final + part, part)
            report.hits += 1
            if k != bytes([k[0]]) * part or v != bytes([v[0]]) * part or k[0] != v[0]:
                report.torn += 1
    for mem in buffers:
        close = getattr(mem, "close", None)
        if callable(close):
            close()
    return report
