"""What the planner renders into the engine's env and SGLang arguments, and which spec fields
it refuses; real: the planner, the env contract, the launcher's command renderer."""

from __future__ import annotations

from typing import Any

import pytest
from hicache_operator.plan import plan
from hicache_umbp.contract.load import load_launch_config
from shc_testlib import CONFIG, GI
from shc_testlib import configmap_env as _configmap_env
from shc_testlib import engine_container as _engine
from shc_testlib import example_cr as _cr
from shc_testlib import has_problem as _has
from shc_testlib import plan_problems as _problems

# ----------------------------------------------------------------------------- env and args


def test_env_is_what_the_backend_reads_back() -> None:
    p = plan(_cr("llama-3.1-405b-mi355x.yaml"), CONFIG)
    env = _configmap_env(p.objects)
    assert all(k.startswith("HICACHE_") for k in env)
    cfg = load_launch_config(env)
    assert cfg.host_pool_bytes == (200 * GI,) * 8
    assert cfg.store.umbp_dram_bytes == (64 * GI,) * 8
    assert cfg.store.umbp_ssd_bytes == (384 * GI,) * 8
    assert cfg.store.umbp_local_ranks == 8 and cfg.tp_size == 8
    assert cfg.store.umbp_namespace == "inference/llama-405b"
    assert cfg.numa_policy == "auto"
    assert env["HICACHE_HOST_POOL_BYTES"] == str(200 * GI)  # plain bytes, never "200Gi"
    engine = _engine(p.objects)
    assert engine["envFrom"] == [{"configMapRef": {"name": "llama-405b-hicache"}}]
    assert engine["command"] == ["python", "-m", "hicache_umbp.launch"]


def test_owned_flags_and_env_are_rejected_by_name() -> None:
    def collide(s: dict[str, Any]) -> None:
        s["engine"]["extraArgs"] = [
            "--tp-size=4",
            "--hicache-size",
            "10",
            "--page-size",
            "--trust-remote-code",
        ]
        s["engine"]["env"] = [
            {"name": "HICACHE_TP_SIZE", "value": "1"},
            {"name": "UMBP_DRAM_CAPACITY", "value": "1"},
            {"name": "SGLANG_DP_RANK", "value": "0"},
            {"name": "FINE", "value": "1"},
        ]

    problems = _problems(_cr("deepseek-r1-mi355x.yaml", collide))
    assert _has(problems, "spec.engine.extraArgs[0]", "--tp-size")
    assert _has(problems, "spec.engine.extraArgs[1]", "--hicache-size")
    assert _has(problems, "spec.engine.extraArgs[3]", "--page-size")
    for i, name in enumerate(("HICACHE_TP_SIZE", "UMBP_DRAM_CAPACITY", "SGLANG_DP_RANK")):
        assert _has(problems, f"spec.engine.env[{i}].name", name)
    assert len(problems) == 6


@pytest.mark.parametrize(
    ("arg", "owned"),
    [
        ("--model=/other", "--model"),
        ("--page-s", "--page-size"),
        ("--tp", "--tp-size"),
        ("--hicache", "--hicache-"),
        ("--enable-hier", "--enable-hierarchical-cache"),
    ],
)
def test_aliases_and_abbreviations_of_owned_flags_are_rejected(arg: str, owned: str) -> None:
    """SGLang's argparse resolves aliases and unambiguous prefixes to the owned flag."""
    def mutate(s: dict[str, Any]) -> None:
        s.setdefault("engine", {})["extraArgs"] = [arg, "8"]

    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    assert _has(problems, "spec.engine.extraArgs[0]", owned, "set by the operator"), problems


def test_flags_that_are_no_prefix_of_an_owned_flag_pass() -> None:
    args = ["--trust-remote-code", "--enable-dp-lm-head", "--mem-fraction-static", "0.8"]

    def mutate(s: dict[str, Any]) -> None:
        s.setdefault("engine", {})["extraArgs"] = args

    p = plan(_cr("minimal-dram-only.yaml", mutate), CONFIG)
    assert list(p.engine.sglang_argv[-len(args) :]) == args


def test_write_through_only_when_allowed() -> None:
    assert _has(
        _problems(
            _cr(
                "minimal-dram-only.yaml", lambda s: s["hiCache"].update(writePolicy="write_through")
            )
        ),
        "spec.hiCache.writePolicy",
        "allowWriteThrough",
    )
    p = plan(
        _cr(
            "minimal-dram-only.yaml",
            lambda s: s["hiCache"].update(writePolicy="write_through", allowWriteThrough=True),
        ),
        CONFIG,
    )
    assert _configmap_env(p.objects)["HICACHE_WRITE_POLICY"] == "write_through"


def test_layer_first_is_rejected() -> None:
    assert _has(
        _problems(
            _cr("minimal-dram-only.yaml", lambda s: s["hiCache"].update(memLayout="layer_first"))
        ),
        "spec.hiCache.memLayout",
        "page-first",
    )


def test_all_problems_are_reported_at_once() -> None:
    def many(s: dict[str, Any]) -> None:
        s["engine"]["tensorParallelSize"] = 0
        s["hiCache"]["memLayout"] = "sideways"
        s["l3"]["mode"] = "distributed"
        s["placement"]["gpuModel"] = "H100"
        s["bogus"] = 1

    problems = _problems(_cr("deepseek-r1-mi355x.yaml", many))
    paths = {p for p, _ in problems}
    assert {
        "spec.engine.tensorParallelSize",
        "spec.hiCache.memLayout",
        "spec.l3.mode",
        "spec.placement.gpuModel",
        "spec.bogus",
    } <= paths


@pytest.mark.parametrize("name", ["Upper", "9starts-with-digit", "a" * 53, "has_underscore"])
def test_bad_names_are_rejected(name: str) -> None:
    cr = _cr("minimal-dram-only.yaml")
    cr["metadata"]["name"] = name
    assert _has(_problems(cr), "metadata.name", "DNS-1035")


def test_no_l3_tier_is_rejected() -> None:
    problems = _problems(_cr("minimal-dram-only.yaml", lambda s: s.pop("l3")))
    assert _has(problems, "spec.l3", "no L3 tier")
