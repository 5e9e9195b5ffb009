"""MLA with attention TP > 1 needs one L3 store per pod (pure planner; the pod tier runs it:
tests/pod/test_mla_pod.py, and the engine's own guard: tests/backend/test_adapter_mla_sglang.py)."""

from __future__ import annotations

import copy

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import SpecError, plan
from shc_testlib import load_example


def deepseek(**engine: object) -> dict:
    cr = copy.deepcopy(load_example("deepseek-r1-mi355x.yaml"))
    cr["spec"]["engine"].update(engine)
    return cr


def test_the_flagship_mla_example_plans_one_store_per_pod() -> None:
    p = plan(deepseek(), OperatorConfig())
    assert p.spec.model.attention == "mla" and p.spec.l3.mode == "standalone"


def test_mla_with_tp8_and_an_embedded_l3_is_refused() -> None:
    cr = deepseek()
    cr["spec"]["l3"]["mode"] = "embedded"
    with pytest.raises(SpecError) as e:
        plan(cr, OperatorConfig())
    assert ("spec.l3.mode", next(m for p, m in e.value.problems if p == "spec.l3.mode")) \
        in e.value.problems
    assert any("attention tensor parallelism 8" in m for _, m in e.value.problems)


def test_mla_with_dp_attention_one_rank_per_group_keeps_the_embedded_l3() -> None:
    cr = deepseek(enableDpAttention=True, dataParallelSize=8)
    cr["spec"]["l3"]["mode"] = "embedded"
    plan(cr, OperatorConfig())  # attention TP size 8 / 8 = 1: every rank is its own writer


def test_auto_attention_with_tp_and_embedded_warns() -> None:
    cr = deepseek()
    cr["spec"]["model"]["attention"] = "auto"
    del cr["spec"]["model"]["kvBytesPerToken"]  # needs mha or mla
    cr["spec"]["l3"]["mode"] = "embedded"
    p = plan(cr, OperatorConfig())
    assert any("model.attention is auto" in w for w in p.warnings)
