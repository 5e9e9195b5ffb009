"""The UMBP client contract against the in-process double, plus the double's own hooks.

Real: the contract checks (tests/backend/contract.py, also run against real mori in
test_client_contract_mori.py), memfd buffers and ctypes copies. Faked: the client itself --
:class:`support.memory_client.MemoryUMBPClient` stands in for mori here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hicache_umbp.clients.factories import OpenedClient
from hicache_umbp.contract.staging import SSD_STAGING_SLOTS
from hicache_umbp.store.protocol import UMBPClientLike
from support.memory_client import InjectedFault, MemoryUMBPClient

from .contract import CHECKS, Arena, Subject

VALUE = 64 * 1024


def _double(max_batch: int | None, registered: bool) -> Callable[[int], OpenedClient]:
    def open_(capacity_values: int) -> OpenedClient:
        client = MemoryUMBPClient(
            capacity_values * VALUE, max_batch=max_batch, require_registered=registered
        )
        return OpenedClient(client, "dram", "double", max_batch, None, "memory double")

    return open_


SUBJECTS = [
    Subject("double-dram", _double(None, False), VALUE),
    Subject("double-ssd-like", _double(SSD_STAGING_SLOTS, False), VALUE),
    Subject("double-standalone-like", _double(None, True), VALUE, requires_registration=True),
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda s: s.name)
def test_double_meets_contract(subject: Subject, check: Callable[[Subject], None]) -> None:
    check(subject)


def test_double_is_a_client_like() -> None:
    assert isinstance(MemoryUMBPClient(1024), UMBPClientLike)


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena(4 * VALUE)
    a.view[:] = np.arange(a.nbytes, dtype=np.uint64).astype(np.uint8)
    yield a
    a.close()


@pytest.mark.parametrize(
    "method,args",
    [
        ("batch_put_from_ptr", lambda a: (["k"], [a.ptr], [VALUE])),
        ("batch_get_into_ptr", lambda a: (["k"], [a.ptr], [VALUE])),
        ("batch_exists", lambda a: (["k"],)),
        ("batch_exists_consecutive", lambda a: (["k"],)),
        ("register_memory", lambda a: (a.ptr, VALUE)),
        ("flush", lambda a: ()),
        ("clear", lambda a: ()),
    ],
)
def test_injected_faults_then_recovery(arena: Arena, method: str, args) -> None:
    client = MemoryUMBPClient(16 * VALUE)
    call = getattr(client, method)
    client.inject(method, "raise")
    with pytest.raises(InjectedFault):
        call(*args(arena))
    client.inject(method, "none")
    assert call(*args(arena)) is None
    client.inject(method, "false")
    falsy = call(*args(arena))
    assert falsy in ([False], False, 0)
    # the queue is spent: the next call behaves normally again
    normal = call(*args(arena))
    assert normal is not None
    assert client.calls[method] == 4


def test_partial_fault_fails_every_other_entry(arena: Arena) -> None:
    client = MemoryUMBPClient(16 * VALUE)
    keys = ["a", "b", "c", "d"]
    client.inject("batch_put_from_ptr", "partial")
    ptrs = [arena.ptr + i * VALUE for i in range(4)]
    assert client.batch_put_from_ptr(keys, ptrs, [VALUE] * 4) == [True, False, True, False]
    # the partial fault only hides results: the data did land (as a lost ack would)
    assert client.batch_exists(keys) == [True] * 4


def test_faults_queue_in_order_and_count_calls(arena: Arena) -> None:
    client = MemoryUMBPClient(16 * VALUE)
    client.inject("batch_exists", "false", times=2)
    client.batch_put_from_ptr(["k"], [arena.ptr], [VALUE])
    assert client.batch_exists(["k"]) == [False]
    assert client.batch_exists(["k"]) == [False]
    assert client.batch_exists(["k"]) == [True]
    assert client.calls["batch_exists"] == 3
    assert client.calls["batch_put_from_ptr"] == 1


def test_bad_injection_names_the_allowed_values() -> None:
    client = MemoryUMBPClient(1024)
    with pytest.raises(ValueError, match=r"unknown method .put.*batch_put_from_ptr"):
        client.inject("put", "raise")
    with pytest.raises(ValueError, match=r"unknown fault .boom.*raise, false, none, partial"):
        client.inject("flush", "boom")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"capacity_bytes": 0}, "capacity_bytes must be > 0"),
        ({"capacity_bytes": 1, "low_watermark": 0.95}, "watermarks"),
        ({"capacity_bytes": 1, "granularity": 0}, "granularity"),
        ({"capacity_bytes": 1, "max_batch": 0}, "max_batch"),
    ],
)
def test_double_rejects_bad_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MemoryUMBPClient(**kwargs)


def test_eviction_follows_the_watermarks(arena: Arena) -> None:
    """10 values of capacity: the 9th put reaches 0.9 and LRU-evicts down to 0.7 (as mori)."""
    client = MemoryUMBPClient(10 * VALUE)
    keys = [f"a{i}" for i in range(10)]
    for i, key in enumerate(keys[:8]):
        assert client.batch_put_from_ptr([key], [arena.ptr], [VALUE]) == [True], i
    assert client.evictions == 0
    client.batch_put_from_ptr([keys[8]], [arena.ptr], [VALUE])
    assert client.batch_exists(keys[:9]) == [False, False] + [True] * 7
    assert client.used_bytes == 7 * VALUE


def test_granularity_charges_small_values_a_whole_slot(arena: Arena) -> None:
    client = MemoryUMBPClient(8 * 8192, granularity=8192, high_watermark=1.0, low_watermark=1.0)
    got = client.batch_put_from_ptr([f"s{i}" for i in range(10)], [arena.ptr] * 10, [1000] * 10)
    assert sum(got) == 8


# ----------------------------------------------------------------------------- the factory
# (choices made before mori is imported, so these run without mori)


def _rank(**extra):
    from hicache_umbp.contract.load import load_store_config

    return load_store_config(extra, env={}).rank(0)


def test_distributed_without_rdma_nic_is_a_clear_error(tmp_path) -> None:
    from hicache_umbp.clients.runtime import DistributedModeUnavailableError, require_distributed

    no_nic = r"needs an RDMA NIC.*lists no device"
    with pytest.raises(DistributedModeUnavailableError, match=no_nic):
        require_distributed(str(tmp_path / "absent"))
    (tmp_path / "ib").mkdir()
    with pytest.raises(DistributedModeUnavailableError, match="lists no device"):
        require_distributed(str(tmp_path / "ib"))
    (tmp_path / "ib" / "mlx5_0").mkdir()
    with pytest.raises(DistributedModeUnavailableError, match=r"mlx5_0.*not supported"):
        require_distributed(str(tmp_path / "ib"))


def test_make_client_refuses_distributed_here() -> None:
    import os

    from hicache_umbp.clients.factories import make_client
    from hicache_umbp.clients.runtime import DistributedModeUnavailableError

    rank = _rank(umbp_mode="distributed", umbp_master_address="10.0.0.1:15558")
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.fail("this test expects a host without RDMA NICs")
    with pytest.raises(DistributedModeUnavailableError, match="umbp_mode=distributed"):
        make_client(rank, "dram")


@pytest.mark.parametrize(
    "extra,media",
    [
        ({"umbp_dram_bytes": 1 << 20}, ("dram",)),
        ({"umbp_ssd_enabled": True, "umbp_ssd_dir": "/s", "umbp_ssd_bytes": 1 << 30}, ("ssd",)),
        (
            {"umbp_dram_bytes": 1, "umbp_ssd_enabled": True, "umbp_ssd_dir": "/s",
             "umbp_ssd_bytes": 1 << 30},
            ("dram", "ssd"),
        ),
        ({"umbp_mode": "standalone"}, ("dram",)),
        ({"umbp_mode": "standalone", "umbp_ssd_enabled": True}, ("dram", "ssd")),
    ],
)
def test_configured_media(extra, media) -> None:
    assert _rank(**extra).media() == media


def test_make_client_names_what_is_missing() -> None:
    from hicache_umbp.clients.factories import make_client
    from hicache_umbp.contract.settings import ConfigError

    dram_only = _rank(umbp_dram_bytes=1 << 20)
    with pytest.raises(ConfigError, match="umbp_ssd_enabled is false"):
        make_client(dram_only, "ssd")
    with pytest.raises(ValueError, match="medium must be 'dram' or 'ssd', got 'hbm'"):
        make_client(dram_only, "hbm")  # type: ignore[arg-type]
    ssd_only = _rank(umbp_ssd_enabled=True, umbp_ssd_dir="/s", umbp_ssd_bytes=1 << 30)
    with pytest.raises(ConfigError, match="embedded DRAM tier needs umbp_dram_bytes > 0"):
        make_client(ssd_only, "dram")


def test_standalone_sockets_live_in_the_socket_dir() -> None:
    from hicache_umbp.contract.paths import standalone_socket_path

    assert standalone_socket_path("/var/run/umbp", "ssd") == "/var/run/umbp/ssd.sock"
