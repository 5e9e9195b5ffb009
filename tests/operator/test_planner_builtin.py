"""``spec.l3.backend: sglang-mori``: what the planner renders for SGLang's built-in backend and
what it refuses (the launcher's side is tests/launcher/test_builtin_command.py; the facts behind
the refusals are tests/backend/test_builtin_backend_sglang.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_umbp.contract.load import load_launch_config
from shc_testlib import all_containers
from shc_testlib import configmap_env as _configmap
from shc_testlib import example_cr as _cr
from shc_testlib import plan_problems as _problems

CONFIG = OperatorConfig()
BUILTIN = "cpu/tiny-llama-builtin.yaml"


def _builtin(spec: dict[str, Any]) -> None:
    spec["l3"]["backend"] = "sglang-mori"
    spec["l3"].pop("ssd", None)


def test_builtin_embedded_renders_sglangs_flag_and_only_the_keys_it_reads() -> None:
    p = plan(_cr(BUILTIN), CONFIG)
    env = _configmap(p.objects)
    assert env["HICACHE_L3_BACKEND"] == "sglang-mori"
    for ours in ("HICACHE_UMBP_NAMESPACE", "HICACHE_UMBP_MODEL_ID",
                 "HICACHE_UMBP_TIER_QUEUE_BYTES", "HICACHE_UMBP_TIER_WRITE_POLICY"):
        assert ours not in env
    assert env["HICACHE_UMBP_DRAM_BYTES"] == str(1 << 30)
    argv = p.engine.sglang_argv
    assert argv[argv.index("--hicache-storage-backend") + 1] == "mori"
    assert argv[argv.index("--hicache-storage-backend-extra-config") + 1] == (
        # SGLang's prefetch keys: it reads them from every backend's extra-config
        '{"ssd_enabled":false,"dram_capacity_bytes":1073741824,"prefetch_threshold":256,'
        '"prefetch_timeout_base":1.0,"prefetch_timeout_per_ki_token":0.25}')
    cfg = load_launch_config(env)  # the pod reads back what was rendered
    assert cfg.l3_backend == "sglang-mori" and cfg.store.umbp_dram_bytes == (1 << 30,)


def test_our_backend_renders_no_backend_key() -> None:
    """CRs that never set l3.backend keep their ConfigMap (and config hash) byte for byte, so
    upgrading the operator restarts no engine."""
    for example in ("deepseek-r1-mi355x.yaml", "cpu/tiny-llama-standalone.yaml"):
        assert "HICACHE_L3_BACKEND" not in _configmap(plan(_cr(example), CONFIG).objects)


def test_builtin_standalone_uses_the_dram_sidecar() -> None:
    def standalone(spec: dict[str, Any]) -> None:
        spec["l3"]["mode"] = "standalone"

    p = plan(_cr(BUILTIN, standalone), CONFIG)
    names = [c["name"] for c in all_containers(p.objects)]
    assert sorted(names) == ["engine", "umbp-dram"]
    env = _configmap(p.objects)
    assert env["HICACHE_UMBP_SOCKET_DIR"] == "/var/run/umbp"
    argv = p.engine.sglang_argv
    assert argv[argv.index("--hicache-storage-backend-extra-config") + 1] == (
        '{"ssd_enabled":false,"prefetch_threshold":256,'
        '"prefetch_timeout_base":1.0,"prefetch_timeout_per_ki_token":0.25}')
    assert not any("MLA" in w for w in p.warnings)


@pytest.mark.parametrize("example", ["deepseek-r1-mi355x.yaml", "cpu/tiny-llama-standalone.yaml"])
def test_builtin_with_an_ssd_tier_is_invalid_with_the_alternative(example: str) -> None:
    problems = _problems(_cr(example, lambda s: s["l3"].update(backend="sglang-mori")))
    assert ("spec.l3",
            "the SSD tier needs backend umbp on mori 1.2.4: SGLang's built-in mori backend "
            "never writes its SSD tier in-process, and a standalone SSD server fails the part "
            "of each backup batch beyond its 16 staging slots (Write page to storage: N pages "
            "failed)") in problems


def test_builtin_with_prefault_threads_is_invalid() -> None:
    def threads(spec: dict[str, Any]) -> None:
        spec["hiCache"]["hostAllocator"]["prefaultThreads"] = 8

    problems = _problems(_cr(BUILTIN, threads))
    assert any(p == "spec.hiCache.hostAllocator.prefaultThreads" and "no thread setting" in m
               for p, m in problems), problems


@pytest.mark.parametrize("name", ["SGLANG_HICACHE_HOST_NUMA_NODE", "SGLANG_HICACHE_HOST_HUGEPAGE",
                                  "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE",
                                  "SGLANG_HICACHE_HOST_PREFAULT", "UMBP_STANDALONE_ADDRESS"])
def test_the_variables_the_launcher_renders_are_owned(name: str) -> None:
    def env(spec: dict[str, Any]) -> None:
        spec["engine"]["env"].append({"name": name, "value": "1"})

    problems = _problems(_cr(BUILTIN, env))
    assert any(p == "spec.engine.env[1].name" and f"{name} is owned by the operator" in m
               for p, m in problems), problems


def test_mla_with_attention_tp_above_one_in_embedded_mode() -> None:
    def embedded(spec: dict[str, Any], attention: str = "auto") -> None:
        _builtin(spec)
        spec["l3"]["mode"] = "embedded"
        spec["model"]["attention"] = attention
        if attention == "auto":
            spec["model"].pop("kvBytesPerToken")  # the page geometry needs mha or mla

    p = plan(_cr("deepseek-r1-mi355x.yaml", embedded), CONFIG)
    assert any("built-in backend serves it no L3 hit" in w and "parallelism 8" in w
               for w in p.warnings), p.warnings
    with pytest.raises(SpecError, match="cannot use an embedded L3"):  # declared MLA: refused
        plan(_cr("deepseek-r1-mi355x.yaml", lambda s: embedded(s, "mla")), CONFIG)

    def dp_attention(spec: dict[str, Any]) -> None:
        embedded(spec)
        spec["engine"].update(dataParallelSize=8, enableDpAttention=True)

    p = plan(_cr("deepseek-r1-mi355x.yaml", dp_attention), CONFIG)
    assert not any("MLA" in w for w in p.warnings)  # attention TP 1: no follower ranks


