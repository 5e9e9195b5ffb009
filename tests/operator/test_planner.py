"""The planner's sizing and parallelism rules, one test per rule, with the expected numbers
worked out by hand. Real: the planner and the backend's env contract it calls; no fakes."""

from __future__ import annotations

from typing import Any

import pytest
from hicache_operator.api.config import AdminPolicy, OperatorConfig
from hicache_operator.plan import plan
from shc_testlib import CONFIG, GI, all_containers, pod_spec
from shc_testlib import engine_container as _engine
from shc_testlib import example_cr as _cr
from shc_testlib import has_problem as _has
from shc_testlib import plan_problems as _problems

# ----------------------------------------------------------------------------- sizing


def test_tp8_embedded_sizing_by_hand() -> None:
    """llama-405b: 8 ranks x 200Gi on 2Mi pages = 1600Gi hugepages; memory = roundup(1.1 x
    (16 + 12 x 8)) = 123.2Gi + shm 32Gi + 4 KiB-backed UMBP DRAM 512Gi + write-back rings
    8 x floor(1Gi / 2,064,384) x 2,064,384 B = 8 x 1,073,479,680 B (7.998Gi) + embedded SSD
    staging 8 x 16 x 2,064,384 B = 264,241,152 B (0.246Gi) = 675.44Gi -> 676Gi (page part:
    64 tokens x 516,096 B / 2 / 8 ranks); cpu 4 + 8 x 8."""
    p = plan(_cr("llama-3.1-405b-mi355x.yaml"), CONFIG)
    res = _engine(p.objects)["resources"]
    expected = {"cpu": "68", "memory": "676Gi", "hugepages-2Mi": "1600Gi", "amd.com/gpu": "8"}
    assert res["limits"] == expected
    assert res["requests"] == expected
    assert p.sizing.dram_per_rank == 64 * GI
    assert p.sizing.ssd_per_rank == 384 * GI
    shm = next(v for v in pod_spec(p.objects)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert p.status_plan["hugepagesPerPod"] == "1600Gi (2Mi)"


def test_host_pool_rounds_up_to_whole_hugepages() -> None:
    def odd_pool(s: dict[str, Any]) -> None:
        s["hiCache"]["hostPoolPerRank"] = 10 * GI + 1
        s["hiCache"]["hostAllocator"] = {"hugePageSize": "1Gi"}

    p = plan(_cr("minimal-dram-only.yaml", odd_pool), CONFIG)
    assert p.sizing.host_pool_per_rank == 11 * GI
    assert _engine(p.objects)["resources"]["limits"]["hugepages-1Gi"] == "11Gi"


def test_hugepage_backed_dram_joins_the_hugepage_request() -> None:
    def dram_on_2mi(s: dict[str, Any]) -> None:
        s["l3"]["dram"]["hugePageSize"] = "2Mi"

    p = plan(_cr("minimal-dram-only.yaml", dram_on_2mi), CONFIG)
    limits = _engine(p.objects)["resources"]["limits"]
    assert limits["hugepages-2Mi"] == "96Gi"  # 32Gi host pool + 64Gi DRAM
    # memory no longer carries the DRAM: roundup(1.1 x 28Gi) + 16Gi shm = 30.8 + 16 -> 47Gi
    assert limits["memory"] == "47Gi"


def test_every_container_is_guaranteed_with_integer_cpus() -> None:
    for example in (
        "deepseek-r1-mi355x.yaml",
        "llama-3.1-70b-mi355x.yaml",
        "minimal-dram-only.yaml",
    ):
        p = plan(_cr(example), CONFIG)
        for c in all_containers(p.objects):
            req, lim = c["resources"]["requests"], c["resources"]["limits"]
            assert {k: v for k, v in req.items() if k != "ephemeral-storage"} == lim, c["name"]
            assert lim["cpu"].isdigit() and lim["memory"], c["name"]


def test_explicit_memory_below_minimum_shows_the_arithmetic() -> None:
    problems = _problems(
        _cr("minimal-dram-only.yaml", lambda s: s.update(resources={"memory": "20Gi"}))
    )
    # shm 16Gi + 4 KiB DRAM 64Gi + 4Gi process = 84Gi = 90194313216 B
    assert _has(problems, "spec.resources.memory", "21474836480 B", "90194313216 B")


def test_host_pool_larger_than_the_node_is_rejected_with_arithmetic() -> None:
    problems = _problems(
        _cr("deepseek-r1-mi355x.yaml", lambda s: s["hiCache"].update(hostPoolPerRank="400Gi"))
    )
    assert _has(
        problems, "spec.hiCache.hostPoolPerRank", "more than the node's", str(3 * 1024 * GI)
    )


def test_admin_max_hugepages_per_pod() -> None:
    config = OperatorConfig(policy=AdminPolicy(max_hugepages_per_pod="1Ti"))
    problems = _problems(_cr("deepseek-r1-mi355x.yaml"), config)
    assert _has(problems, "spec.hiCache.hostPoolPerRank", "maxHugepagesPerPod 1Ti")


def test_host_pool_below_one_gb_is_rejected() -> None:
    problems = _problems(
        _cr("minimal-dram-only.yaml", lambda s: s["hiCache"].update(hostPoolPerRank="512Mi"))
    )
    assert _has(problems, "spec.hiCache.hostPoolPerRank", "below 1 GB")


@pytest.mark.parametrize("value", [0, "0", "0Gi"])
def test_a_zero_host_pool_is_rejected_not_turned_into_ratio_sizing(value: Any) -> None:
    """--hicache-size 0 would make SGLang size the pool by its default ratio, silently."""
    problems = _problems(
        _cr("minimal-dram-only.yaml", lambda s: s["hiCache"].update(hostPoolPerRank=value))
    )
    assert _has(problems, "spec.hiCache.hostPoolPerRank", "0 B is below 1 GB", "hostPoolRatio")


def test_booleans_are_not_quantities_or_cpus() -> None:
    """pydantic's lax ints would read false as 0 bytes, true as 1 CPU or one replica; every
    such field is reported at once."""

    def mutate(s: dict[str, Any]) -> None:
        s["hiCache"]["hostPoolPerRank"] = False
        s["l3"]["dram"]["capacity"] = True
        s["resources"] = {"cpu": True, "memory": False}
        s["replicas"] = True
        s["engine"] = {"tensorParallelSize": True, "gpusPerPod": False}

    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    for path in (
        "spec.replicas",
        "spec.engine.tensorParallelSize",
        "spec.engine.gpusPerPod",
        "spec.hiCache.hostPoolPerRank",
        "spec.l3.dram.capacity",
        "spec.resources.cpu",
        "spec.resources.memory",
    ):
        assert _has(problems, path, "is a boolean"), (path, problems)


def test_integers_and_booleans_are_what_the_crd_types_say() -> None:
    """pydantic's lax mode would read "8" as 8 and 0 or "yes" as a boolean; the CRD's
    integer and boolean types refuse them, and so does the planner (found by hypothesis)."""

    def mutate(s: dict[str, Any]) -> None:
        s["engine"] = {"tensorParallelSize": "1", "enableDpAttention": 0}
        s["l3"]["dram"]["prefault"] = "yes"
        s["model"]["kvBytesPerToken"] = "70272"

    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    assert _has(problems, "spec.engine.tensorParallelSize", "'1' is a string, not an integer")
    assert _has(problems, "spec.model.kvBytesPerToken", "is a string, not an integer")
    for path in ("spec.engine.enableDpAttention", "spec.l3.dram.prefault"):
        assert _has(problems, path, "is not a boolean (true or false)"), (path, problems)


def test_ratio_needs_4k_pages_and_explicit_memory() -> None:
    def ratio(s: dict[str, Any]) -> None:
        s["hiCache"] = {"hostPoolRatio": 2.0, "hostAllocator": {"hugePageSize": "none"}}

    assert _has(
        _problems(_cr("minimal-dram-only.yaml", ratio)),
        "spec.resources.memory",
        "cannot size memory",
    )

    def ratio_with_memory(s: dict[str, Any]) -> None:
        ratio(s)
        s["resources"] = {"memory": "300Gi"}

    p = plan(_cr("minimal-dram-only.yaml", ratio_with_memory), CONFIG)
    assert "--hicache-ratio" in p.engine.sglang_argv
    assert "hugepages-2Mi" not in _engine(p.objects)["resources"]["limits"]


# ----------------------------------------------------------------------------- parallelism


def test_gpus_per_pod_must_match_tp_times_dp() -> None:
    problems = _problems(
        _cr("llama-3.1-70b-mi355x.yaml", lambda s: s["engine"].update(gpusPerPod=8))
    )
    assert _has(problems, "spec.engine.gpusPerPod", "tensorParallelSize 4 x dataParallelSize 1 = 4")


def test_more_gpus_than_the_node_has() -> None:
    problems = _problems(
        _cr("deepseek-r1-mi355x.yaml", lambda s: s["engine"].update(tensorParallelSize=16))
    )
    assert _has(problems, "spec.engine", "16 GPUs per pod > 8 GPUs")


def test_dp_attention_shares_tp_gpus_and_needs_divisible_sizes() -> None:
    p = plan(
        _cr(
            "deepseek-r1-mi355x.yaml",
            lambda s: s["engine"].update(dataParallelSize=8, enableDpAttention=True),
        ),
        CONFIG,
    )
    assert p.sizing.ranks == 8
    assert "--attn-dp-size" in p.engine.sglang_argv
    problems = _problems(
        _cr(
            "deepseek-r1-mi355x.yaml",
            lambda s: s["engine"].update(dataParallelSize=3, enableDpAttention=True),
        )
    )
    assert _has(problems, "spec.engine.dataParallelSize", "not a multiple")
