"""``spec.hiCache.prefetch``: SGLang's L3 prefetch policy, threshold and timeouts, rendered
through the env contract into the flag and the extra-config keys SGLang reads (the planner and
the launcher's command renderer are real; the CR is an example with fields set)."""

from __future__ import annotations

import json
from typing import Any

from hicache_operator.plan import plan
from hicache_umbp.contract.settings import (
    PREFETCH_POLICY,
    PREFETCH_THRESHOLD,
    PREFETCH_TIMEOUT_BASE_S,
    PREFETCH_TIMEOUT_PER_KI_S,
)
from shc_testlib import CONFIG, example_cr, has_problem, plan_problems
from shc_testlib import configmap_env as _configmap

EXAMPLE = "cpu/tiny-llama-standalone.yaml"
KEYS = ("prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token")


def _sglang(p: Any) -> tuple[str, dict[str, Any]]:
    argv = p.engine.sglang_argv
    extra = json.loads(argv[argv.index("--hicache-storage-backend-extra-config") + 1])
    return argv[argv.index("--hicache-storage-prefetch-policy") + 1], {k: extra[k] for k in KEYS}


def test_unset_keeps_the_configmap_and_sglang_gets_the_measured_defaults() -> None:
    p = plan(example_cr(EXAMPLE), CONFIG)
    assert not [k for k in _configmap(p.objects) if k.startswith("HICACHE_PREFETCH")]
    assert _sglang(p) == (PREFETCH_POLICY, {
        "prefetch_threshold": PREFETCH_THRESHOLD, "prefetch_timeout_base": PREFETCH_TIMEOUT_BASE_S,
        "prefetch_timeout_per_ki_token": PREFETCH_TIMEOUT_PER_KI_S})


def test_set_fields_reach_sglangs_flag_and_extra_config() -> None:
    def prefetch(spec: dict[str, Any]) -> None:
        spec["hiCache"]["prefetch"] = {"policy": "wait_complete", "threshold": 1024,
                                       "timeoutBase": 0.5, "timeoutPerKiToken": 0.1}

    p = plan(example_cr(EXAMPLE, prefetch), CONFIG)
    env = _configmap(p.objects)
    assert env["HICACHE_PREFETCH_POLICY"] == "wait_complete"
    assert env["HICACHE_PREFETCH_THRESHOLD"] == "1024"
    assert _sglang(p) == ("wait_complete", {"prefetch_threshold": 1024,
                                            "prefetch_timeout_base": 0.5,
                                            "prefetch_timeout_per_ki_token": 0.1})


def test_a_policy_sglang_does_not_know_is_refused() -> None:
    def bad(spec: dict[str, Any]) -> None:
        spec["hiCache"]["prefetch"] = {"policy": "never"}

    problems = plan_problems(example_cr(EXAMPLE, bad))
    assert has_problem(problems, "spec.hiCache.prefetch.policy"), problems
