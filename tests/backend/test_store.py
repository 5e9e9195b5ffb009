"""UMBPStore over the in-process UMBP double (``support.memory_client``).

Real: the store, the key scheme, the bytes (ctypes buffers copied by the double). Faked: mori
itself, replaced by the double that passes the same contract suite as real mori; the double's
fault injection stands in for a misbehaving mori (exceptions, False entries, None results).
The same scenarios run against real mori in ``test_store_mori.py``.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hicache_umbp.build import build_store
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.contract.staging import write_back_ring_keys
from hicache_umbp.contract.units import GIB, MIB
from hicache_umbp.store.keys import KeyScheme
from hicache_umbp.store.ratelimit import RateLimitedLog
from hicache_umbp.store.store import UMBPStore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.memory_client import MemoryUMBPClient

PAGE = 4096


class Pages:
    """``n`` pages of ``len(parts)`` host buffers each, filled with random bytes."""

    def __init__(self, n: int, parts: int, size: int = PAGE) -> None:
        self.n, self.parts, self.size = n, parts, size
        self.buf = ctypes.create_string_buffer(os.urandom(n * parts * size), n * parts * size)
        self.base = ctypes.addressof(self.buf)

    def ptrs(self, pages: range | list[int] | None = None) -> list[list[tuple[int, int]]]:
        idx = range(self.n) if pages is None else pages
        return [
            [(self.base + (i * self.parts + p) * self.size, self.size) for p in range(self.parts)]
            for i in idx
        ]

    def page_bytes(self, i: int) -> bytes:
        start = i * self.parts * self.size
        return self.buf.raw[start : start + self.parts * self.size]

    def zero(self) -> None:
        ctypes.memset(self.base, 0, self.n * self.parts * self.size)


def hashes(n: int, tag: str = "p") -> list[str]:
    return [f"{tag}{i:062d}" for i in range(n)]


def make(parts: tuple[str, ...] = MHA_PARTS, capacity: int = 64 << 20, **kw: object) -> tuple[
    UMBPStore, MemoryUMBPClient
]:
    client = MemoryUMBPClient(capacity)
    store = UMBPStore(client, KeyScheme("ns/a", "model", 2, 1, parts), **kw)  # type: ignore[arg-type]
    return store, client


@pytest.fixture(params=[MHA_PARTS, MLA_PARTS], ids=["mha", "mla"])
def parts(request: pytest.FixtureRequest) -> Iterator[tuple[str, ...]]:
    yield request.param


def test_round_trip_is_byte_exact(parts: tuple[str, ...]) -> None:
    store, _ = make(parts)
    src = Pages(20, len(parts))
    dst = Pages(20, len(parts))
    dst.zero()
    hs = hashes(20)
    assert store.batch_set(hs, src.ptrs()) == [True] * 20
    assert store.batch_exists(hs) == 20
    assert store.batch_get(hs, dst.ptrs()) == [True] * 20
    assert all(dst.page_bytes(i) == src.page_bytes(i) for i in range(20))
    st_ = store.stats()
    assert (st_.pages_set, st_.pages_get, st_.bytes_get) == (20, 20, 20 * len(parts) * PAGE)


def test_empty_batches_do_not_touch_the_client() -> None:
    store, client = make()
    assert store.batch_set([], []) == []
    assert store.batch_get([], []) == []
    assert store.batch_exists([]) == 0
    assert sum(client.calls.values()) == 0
    assert store.stats().client_calls == 0


@pytest.mark.parametrize(("max_pages", "calls"), [(None, 1), (16, 3), (7, 6), (40, 1), (1, 40)])
def test_batches_are_chunked_by_max_batch_pages(max_pages: int | None, calls: int) -> None:
    store, client = make(max_batch_pages=max_pages)
    src = Pages(40, 2)
    hs = hashes(40)
    assert store.batch_set(hs, src.ptrs()) == [True] * 40
    assert store.batch_get(hs, src.ptrs()) == [True] * 40
    assert client.calls["batch_put_from_ptr"] == calls
    assert client.calls["batch_get_into_ptr"] == calls
    assert store.batch_exists(hs) == 40
    assert client.calls["batch_exists_consecutive"] == 1


def test_a_page_is_present_only_if_all_its_parts_are() -> None:
    store, client = make(MHA_PARTS)
    src = Pages(4, 2)
    hs = hashes(4)
    assert store.batch_set(hs[:2], src.ptrs(range(2))) == [True, True]
    # Page 2: only its K part reaches the client (as after a partial mori failure).
    (k_ptr, k_size), _ = src.ptrs([2])[0]
    assert client.batch_put_from_ptr([store.keys.page_keys(hs[2])[0]], [k_ptr], [k_size]) == [
        True
    ]
    assert store.batch_exists(hs) == 2
    assert store.batch_get(hs[:3], src.ptrs(range(3))) == [True, True, False]


def test_exists_counts_the_leading_present_pages() -> None:
    store, _ = make()
    src = Pages(8, 2)
    hs = hashes(8)
    present = [0, 1, 2, 3, 4, 6, 7]
    assert store.batch_set([hs[i] for i in present], src.ptrs(present)) == [True] * 7
    assert store.batch_exists(hs) == 5
    assert store.batch_get(hs, src.ptrs()) == [i in present for i in range(8)]


def test_partial_store_failure_maps_to_pages_under_small_capacity() -> None:
    store, _ = make(MHA_PARTS, capacity=10 * PAGE)
    src = Pages(8, 2)
    got = store.batch_set(hashes(8), src.ptrs())
    assert got == [True] * 5 + [False] * 3  # 10 keys fit: 5 pages of 2 parts
    assert store.stats().set_failures == 3


def test_bad_input_is_refused_per_page_without_raising() -> None:
    store, client = make(MHA_PARTS)
    src = Pages(3, 2)
    ptrs = src.ptrs()
    ptrs[1] = ptrs[1][:1]  # page 1 carries one part instead of two
    assert store.batch_set(hashes(3), ptrs) == [True, False, True]
    assert store.batch_set(hashes(3, "q"), ptrs[:2]) == [False] * 3  # length mismatch
    assert client.calls["batch_put_from_ptr"] == 1
    assert store.stats().errors["bad_input"] == 2


def test_register_buffer_calls_the_client_once_per_buffer() -> None:
    store, client = make()
    src = Pages(2, 2)
    assert store.register_buffer(src.base, 4 * PAGE) is True
    assert store.register_buffer(src.base, 4 * PAGE) is True
    assert client.calls["register_memory"] == 1
    client.inject("register_memory", "none")
    assert store.register_buffer(src.base + 1, PAGE) is False
    client.inject("register_memory", "raise")
    assert store.register_buffer(src.base + 2, PAGE) is False


@pytest.mark.parametrize("fault", ["raise", "false", "none", "partial"])
def test_faults_become_false_pages_and_one_log_line(
    fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, client = make(MHA_PARTS, log_interval_s=3600.0)
    src = Pages(6, 2)
    hs = hashes(6)
    client.inject("batch_put_from_ptr", fault, times=5)
    with caplog.at_level(logging.WARNING, logger="hicache_umbp.store.store"):
        results = [store.batch_set(hs, src.ptrs()) for _ in range(5)]
    for r in results:
        assert isinstance(r, list) and len(r) == 6 and all(isinstance(b, bool) for b in r)
    if fault == "partial":  # every other key fails: each page loses its K or V part
        assert results[0] == [False] * 6
    else:
        assert results == [[False] * 6] * 5
    lines = [r for r in caplog.records if r.name == "hicache_umbp.store.store"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    # The client is healthy again: the same pages go through.
    assert store.batch_set(hs, src.ptrs()) == [True] * 6


@pytest.mark.parametrize("fault", ["raise", "false", "none", "partial"])
def test_get_and_exists_faults_never_raise(fault: str) -> None:
    store, client = make(MHA_PARTS)
    src = Pages(4, 2)
    hs = hashes(4)
    assert store.batch_set(hs, src.ptrs()) == [True] * 4
    client.inject("batch_get_into_ptr", fault)
    got = store.batch_get(hs, src.ptrs())
    assert len(got) == 4 and not all(got)
    client.inject("batch_exists_consecutive", fault)
    assert store.batch_exists(hs) == 0


class _Weird:
    """A client returning what no client should: wrong lengths, strings, negative counts."""

    def __init__(self, result: object) -> None:
        self.result = result

    def batch_put_from_ptr(self, keys, ptrs, sizes):
        return self.result

    batch_get_into_ptr = batch_put_from_ptr

    def batch_exists_consecutive(self, keys):
        return self.result


@pytest.mark.parametrize("result", [[True], "yes", 5.0, -1, 10**9, [1, 1, 1, 1], True])
def test_malformed_client_results_are_contained(result: object) -> None:
    store = UMBPStore(_Weird(result), KeyScheme("", "m", 1, 0, MHA_PARTS))  # type: ignore[arg-type]
    src = Pages(2, 2)
    assert store.batch_set(hashes(2), src.ptrs()) == [False, False]
    assert store.batch_get(hashes(2), src.ptrs()) == [False, False]
    assert store.batch_exists(hashes(2)) == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    faults=st.lists(
        st.tuples(
            st.sampled_from(
                ["batch_put_from_ptr", "batch_get_into_ptr", "batch_exists_consecutive"]
            ),
            st.sampled_from(["raise", "false", "none", "partial"]),
        ),
        max_size=6,
    ),
    n=st.integers(0, 12),
    chunk=st.one_of(st.none(), st.integers(1, 5)),
)
def test_never_raises_never_none_under_any_fault_sequence(
    faults: list[tuple[str, str]], n: int, chunk: int | None
) -> None:
    store, client = make(MHA_PARTS, max_batch_pages=chunk)
    for method, fault in faults:
        client.inject(method, fault)
    src = Pages(max(n, 1), 2)
    hs = hashes(n)
    for _ in range(2):
        put = store.batch_set(hs, src.ptrs(range(n)))
        get = store.batch_get(hs, src.ptrs(range(n)))
        count = store.batch_exists(hs)
        assert isinstance(put, list) and len(put) == n
        assert isinstance(get, list) and len(get) == n
        assert all(type(b) is bool for b in put + get)
        assert isinstance(count, int) and 0 <= count <= n


def test_close_deregisters_and_later_calls_fail_softly() -> None:
    store, client = make()
    src = Pages(2, 2)
    assert store.register_buffer(src.base, 4 * PAGE)
    store.close()
    store.close()
    assert client.calls["deregister_memory"] == 1
    assert store.batch_set(hashes(2), src.ptrs()) == [False, False]
    assert store.batch_get(hashes(2), src.ptrs()) == [False, False]
    assert store.batch_exists(hashes(2)) == 0
    assert store.register_buffer(src.base, PAGE) is False
    assert client.calls["batch_put_from_ptr"] == 0


def test_sibling_shares_client_and_batching_but_not_ownership() -> None:
    store, client = make(max_batch_pages=3)
    other = store.sibling(KeyScheme("ns/a", "model", 4, 3, MHA_PARTS))
    assert other.client is store.client and other.max_batch_pages == 3
    src = Pages(7, 2)
    assert other.batch_set(hashes(7), src.ptrs()) == [True] * 7
    assert client.calls["batch_put_from_ptr"] == 3
    assert store.batch_exists(hashes(7)) == 0  # different keys: no collision
    closed: list[int] = []
    client.close = lambda: closed.append(1)
    other.close()
    assert closed == []
    store.close()
    assert closed == [1]


def test_rate_limited_log_reports_once_per_kind_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real RateLimitedLog with a counting clock (no sleeping, no wall-clock thresholds)."""
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("test.ratelimit"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.ratelimit"):
        for t in (0, 1, 2, 3):
            now[0] = t
            rl.warn("a", "boom %d", t)
        rl.warn("b", "other")
        now[0] = 10.5
        rl.warn("a", "boom %d", 4)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["[a] boom 0", "[b] other", "[a] boom 4 (3 more since the last report)"]
    assert rl.counts == {"a": 5, "b": 1}


# ----------------------------------------------------------------------------- write-back ring


@pytest.mark.parametrize(
    ("budget", "value_bytes", "parts_per_page", "keys"),
    [
        (GIB, 8 * MIB, 2, 128),  # the default budget at the default part size
        (GIB + 8 * MIB - 1, 8 * MIB, 2, 128),  # a remainder is left unused
        (3 * MIB, MIB, 2, 3),  # odd part counts are fine: the ring stages parts
        (2 * MIB, MIB, 2, 2),  # exactly one page
    ],
)
def test_write_back_ring_fits_in_the_byte_budget(
    budget: int, value_bytes: int, parts_per_page: int, keys: int
) -> None:
    assert write_back_ring_keys(budget, value_bytes, parts_per_page) == keys
    assert parts_per_page * value_bytes <= keys * value_bytes <= budget


def test_a_ring_budget_smaller_than_one_page_is_a_config_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        write_back_ring_keys(2 * MIB - 1, MIB, 2)
    msg = str(err.value)
    for part in ("umbp_tier_queue_bytes", "HICACHE_UMBP_TIER_QUEUE_BYTES", str(2 * MIB - 1),
                 str(2 * MIB)):
        assert part in msg


def test_build_store_refuses_a_too_small_ring_before_opening_any_client(tmp_path: Path) -> None:
    """Real: the configuration loader and build_store's check. Nothing is faked: the error is
    raised before build_store would open the mori clients, so the test needs no mori."""
    cfg = load_store_config(
        {
            "umbp_dram_bytes": str(64 * MIB),
            "umbp_ssd_enabled": "true",
            "umbp_ssd_dir": str(tmp_path),
            "umbp_ssd_bytes": str(256 * MIB),
            "umbp_tier_queue_bytes": str(MIB),
        },
        env={},
    )
    with pytest.raises(ConfigError, match=r"umbp_tier_queue_bytes.*1048576 bytes.*"
                       r"2 part\(s\) x 8388608 bytes = 16777216 bytes"):
        build_store(cfg.rank(0), keys=KeyScheme("", "m", 1, 0, MHA_PARTS), value_bytes=8 * MIB)
    assert not list(tmp_path.iterdir())  # no SSD client was opened


def test_the_default_ring_budget_is_one_gib_per_rank() -> None:
    cfg = load_store_config({"umbp_dram_bytes": str(64 * MIB)}, env={})
    assert cfg.umbp_tier_queue_bytes == GIB


# ----------------------------------------------------------------------------- issue 11, item 6f/6h


@pytest.mark.parametrize("op", ["set", "get"])
def test_non_list_inputs_never_raise(op: str) -> None:
    """The store's docstring promises never to raise: ``parts=None``, ``hashes=None``, a
    non-string hash or a malformed (ptr, size) pair become ``False`` pages (or ``[]`` when
    there is no page list at all), never an exception."""
    store, _client = make(MHA_PARTS)
    call = store.batch_set if op == "set" else store.batch_get
    src = Pages(3, 2)
    hs = hashes(3)
    assert call(hs, None) == [False] * 3  # type: ignore[arg-type]
    assert call(None, src.ptrs()) == []  # type: ignore[arg-type]
    assert call(None, None) == []  # type: ignore[arg-type]
    assert call(hs, 7) == [False] * 3  # type: ignore[arg-type]
    pages = src.ptrs()
    pages[1] = None  # type: ignore[call-overload]
    assert call(hs, pages) == [op == "set", False, op == "set"]
    bad_pair = src.ptrs()
    bad_pair[2] = [("0x10", PAGE), (src.base, PAGE)]  # type: ignore[list-item]
    assert call(hs, bad_pair)[2] is False
    assert store.stats().errors["bad_input"] >= 4
    assert store.batch_exists(None) == 0  # type: ignore[arg-type]


def test_a_non_string_hash_fails_its_page_only() -> None:
    store, _client = make(MHA_PARTS)
    src = Pages(3, 2)
    hs: list[object] = [*hashes(3)]
    hs[1] = 12345
    assert store.batch_set(hs, src.ptrs()) == [True, False, True]  # type: ignore[arg-type]
    assert store.batch_get(hs, src.ptrs()) == [True, False, True]  # type: ignore[arg-type]
    assert store.batch_exists(hs) == 1  # type: ignore[arg-type]
    assert store.batch_exists([hs[0], None]) == 1  # type: ignore[list-item]


def test_siblings_register_each_buffer_once_and_never_close_the_shared_client() -> None:
    """Split-head stores share one client: a buffer registered through any of them is
    registered with the client once, and only the owning store deregisters and closes."""
    store, client = make(max_batch_pages=3)
    siblings = [store.sibling(KeyScheme("ns/a", "model", 4, r, MHA_PARTS)) for r in (2, 3)]
    src = Pages(2, 2)
    for s in (store, *siblings):
        assert s.register_buffer(src.base, 4 * PAGE)
    assert client.calls["register_memory"] == 1
    closed: list[int] = []
    client.close = lambda: closed.append(1)
    for s in siblings:
        s.close()
    assert client.calls["deregister_memory"] == 0 and closed == []
    store.close()
    assert client.calls["deregister_memory"] == 1 and closed == [1]
