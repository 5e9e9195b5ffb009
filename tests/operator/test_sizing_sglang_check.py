"""Engine memory covers SGLang 0.5.23's own host-memory check for 4 KiB host pools.

SGLang refuses a host pool unless limit - usage - 10 GiB >= ranks x pool (pool_host/base.py);
the pod tier (tests/pod/test_host_memory_pod.py) shows a pod at the planned minimum starting and
the same pod 3 GiB short refused by SGLang. Here: the planner's rule itself (pure).
"""

from __future__ import annotations

import copy

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_operator.planner.sizing import ENGINE_MIN_PROCESS_MEMORY, SGLANG_HOST_MEMORY_RESERVE
from shc_testlib import load_example

GIB = 1 << 30


def cr(huge_page: str, memory: str) -> dict:
    out = copy.deepcopy(load_example("cpu/tiny-llama-embedded.yaml"))
    out["spec"]["hiCache"]["hostAllocator"]["hugePageSize"] = huge_page
    out["spec"]["resources"]["memory"] = memory
    return out


def test_an_explicit_memory_below_sglangs_check_is_refused_for_a_4k_pool() -> None:
    with pytest.raises(SpecError) as e:
        plan(cr("none", "12Gi"), OperatorConfig())
    (path, message), = e.value.problems
    assert path == "spec.resources.memory"
    assert "Not enough host memory available" in message and "hugePageSize" in message


def test_the_check_minimum_is_process_plus_reserve_plus_pool() -> None:
    need = ENGINE_MIN_PROCESS_MEMORY + SGLANG_HOST_MEMORY_RESERVE + 2 * GIB
    assert need == 16 * GIB
    plan(cr("none", "16Gi"), OperatorConfig())
    with pytest.raises(SpecError):
        plan(cr("none", "15Gi"), OperatorConfig())


def test_a_hugepage_pool_is_not_held_to_the_4k_reserve() -> None:
    plan(cr("2Mi", "12Gi"), OperatorConfig())  # checked against hugepages in the pod


def test_auto_memory_always_covers_the_check() -> None:
    auto = cr("none", "auto")
    engine = plan(auto, OperatorConfig()).sizing.engine
    assert engine.memory_bytes >= ENGINE_MIN_PROCESS_MEMORY + SGLANG_HOST_MEMORY_RESERVE + 2 * GIB
