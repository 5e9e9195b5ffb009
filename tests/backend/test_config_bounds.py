"""Every numeric setting of the env contract has a bound the layer below can honour, and a value
beyond it is refused by name (extra-config key or environment variable) with the reason, before
anything is allocated or connected (issue 17: 2**70 s waits, 2**60-byte tiers and rings, TP/DP
sizes, page sizes and host pool ratios nothing could honour used to be accepted).

Pure: the backend's own loaders. The planner's side (the same values refused at admission)
is in tests/operator/test_planner_contract_bounds.py.
"""

from __future__ import annotations

import pytest
from hicache_umbp.contract.load import load_launch_config, load_store_config
from hicache_umbp.contract.settings import (
    BY_KEY,
    MAX_MEMORY_BYTES,
    MAX_STANDALONE_WAIT_S,
    SETTINGS,
    ConfigError,
)

pytestmark = pytest.mark.unit

NUMERIC = ("int", "bytes", "float", "rank_int", "rank_bytes", "rank_port")
STANDALONE = {"umbp_mode": "standalone"}
EMBEDDED = {"umbp_dram_bytes": "1048576"}


def test_every_numeric_setting_has_a_minimum_and_a_maximum() -> None:
    unbounded = [s.key for s in SETTINGS
                 if s.kind in NUMERIC and (s.minimum is None or s.maximum is None)]
    assert unbounded == []


def test_memory_sizes_stop_at_the_address_space_and_waits_at_moris_int32() -> None:
    for key in ("umbp_dram_bytes", "umbp_tier_queue_bytes", "host_pool_bytes"):
        assert BY_KEY[key].maximum == MAX_MEMORY_BYTES == 1 << 47, key
    # mori's startup_timeout_ms is an int32 of milliseconds
    assert MAX_STANDALONE_WAIT_S * 1000 <= 2**31 - 1 < (MAX_STANDALONE_WAIT_S + 1) * 1000


STORE_CASES = [
    # (key, value, base config, words the error must carry besides the key)
    ("umbp_standalone_wait_s", 2**70, STANDALONE, ["32-bit int"]),
    ("umbp_standalone_wait_s", MAX_STANDALONE_WAIT_S + 1, STANDALONE, ["32-bit int"]),
    ("umbp_log_interval_s", 2**70, EMBEDDED, ["once a day"]),
    ("umbp_log_interval_s", 86401, EMBEDDED, ["once a day"]),
    ("umbp_dram_bytes", 2**60, {}, ["address space"]),
    ("umbp_dram_bytes", MAX_MEMORY_BYTES + 1, {}, ["address space"]),
    ("umbp_tier_queue_bytes", 2**60, EMBEDDED, ["address space"]),
    ("umbp_tier_queue_bytes", MAX_MEMORY_BYTES + 1, EMBEDDED, ["address space"]),
    ("umbp_ssd_slot_bytes", 2**60, STANDALONE, ["16 slots"]),
    ("umbp_peer_port", 80, {"umbp_mode": "distributed"}, ["minimum 1024"]),
]


@pytest.mark.parametrize("source", ["extra-config", "env"])
@pytest.mark.parametrize("key, value, base, words", STORE_CASES,
                         ids=[f"{c[0]}={c[1]}" for c in STORE_CASES])
def test_store_values_nothing_can_honour_are_refused_by_name(
        source: str, key: str, value: object, base: dict[str, str], words: list[str]) -> None:
    s = BY_KEY[key]
    with pytest.raises(ConfigError) as err:
        if source == "env":
            load_store_config({}, {BY_KEY[k].env: v for k, v in base.items()}
                              | {s.env: str(value)})
        else:
            load_store_config({**base, key: value}, env={})
    text = str(err.value)
    assert (s.env if source == "env" else key) in text
    for word in words:
        assert word in text, text


LAUNCH_CASES = [
    ("tp_size", 2**70, ["tensorParallelSize"]),
    ("tp_size", 65, ["tensorParallelSize"]),
    ("dp_size", 2**70, ["dataParallelSize"]),
    ("dp_size", 65, ["dataParallelSize"]),
    ("page_size", 2**70, ["pageSize"]),
    ("page_size", 4097, ["pageSize"]),
    ("host_pool_ratio", 2**70, ["hostPoolRatio"]),
    ("host_pool_ratio", 101, ["hostPoolRatio"]),
    ("host_pool_ratio", "inf", ["finite"]),
    ("host_pool_bytes", 2**60, ["address space"]),
    ("port", 80, ["minimum 1024"]),
]


@pytest.mark.parametrize("key, value, words", LAUNCH_CASES,
                         ids=[f"{c[0]}={c[1]}" for c in LAUNCH_CASES])
def test_launch_values_nothing_can_honour_are_refused_by_name(
        key: str, value: object, words: list[str]) -> None:
    env = {BY_KEY["model_path"].env: "m", BY_KEY["umbp_dram_bytes"].env: "1048576",
           BY_KEY[key].env: str(value)}
    with pytest.raises(ConfigError) as err:
        load_launch_config(env)
    text = str(err.value)
    assert BY_KEY[key].env in text
    for word in words:
        assert word in text, text


@pytest.mark.parametrize("key, value", [
    ("umbp_standalone_wait_s", MAX_STANDALONE_WAIT_S), ("umbp_log_interval_s", 86400),
    ("umbp_dram_bytes", MAX_MEMORY_BYTES), ("tp_size", 64), ("dp_size", 64), ("page_size", 4096),
    ("host_pool_ratio", 100), ("port", 1024)])
def test_the_bounds_themselves_are_accepted(key: str, value: object) -> None:
    env = {BY_KEY["model_path"].env: "m", BY_KEY["umbp_dram_bytes"].env: "1048576",
           BY_KEY[key].env: str(value)}
    if BY_KEY[key].modes == frozenset({"standalone"}):
        env[BY_KEY["umbp_mode"].env] = "standalone"
        env.pop(BY_KEY["umbp_dram_bytes"].env)
    cfg = load_launch_config(env)
    got = getattr(cfg, key, None)
    if got is None:
        got = getattr(cfg.store, key)
    assert (got[0] if isinstance(got, tuple) else got) == value
