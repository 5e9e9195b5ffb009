"""Where the planner puts the pod: AMD GPU labels and taints, user affinity, and the NUMA
node of every rank (real planner and node facts models)."""

from __future__ import annotations

from typing import Any

from hicache_operator.api.config import NodeFacts
from hicache_operator.plan import plan
from shc_testlib import CONFIG, pod_spec
from shc_testlib import engine_container as _engine
from shc_testlib import example_cr as _cr
from shc_testlib import has_problem as _has
from shc_testlib import plan_problems as _problems

# ----------------------------------------------------------------------------- placement


def test_mi355x_affinity_accepts_both_label_forms() -> None:
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    terms = pod_spec(p.objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    exprs = [t["matchExpressions"] for t in terms]
    assert [{"key": "amd.com/gpu.device-id", "operator": "In", "values": ["75a3", "75b3"]}] in exprs
    assert [{"key": "amd.com/gpu.device-id.75a3", "operator": "Gt", "values": ["0"]}] in exprs
    assert [{"key": "amd.com/gpu.device-id.75b3", "operator": "Gt", "values": ["0"]}] in exprs


def test_other_models_come_from_the_table() -> None:
    p = plan(
        _cr("minimal-dram-only.yaml", lambda s: s.update(placement={"gpuModel": "MI300X"})), CONFIG
    )
    terms = pod_spec(p.objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["74a1"]
    assert _has(
        _problems(
            _cr("minimal-dram-only.yaml", lambda s: s.update(placement={"gpuModel": "MI999X"}))
        ),
        "spec.placement.gpuModel",
        "MI999X",
    )


def test_user_required_node_terms_are_anded_with_gpu_terms() -> None:
    def zones(s: dict[str, Any]) -> None:
        s["placement"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    ]
                }
            }
        }

    p = plan(_cr("deepseek-r1-mi355x.yaml", zones), CONFIG)
    terms = pod_spec(p.objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2 * 4  # 2 user terms x 4 GPU label-form terms
    assert all(t["matchExpressions"][0]["key"] == "zone" for t in terms)


def test_gpu_taint_tolerated_unhealthy_never_by_default() -> None:
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    tolerations = pod_spec(p.objects)["tolerations"]
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert all(t.get("key") != "amd-gpu-unhealthy" and t.get("key") for t in tolerations)
    assert not any("amd-gpu-unhealthy" in w for w in p.warnings)
    p2 = plan(
        _cr(
            "deepseek-r1-mi355x.yaml",
            lambda s: s["placement"].update(tolerations=[{"operator": "Exists"}]),
        ),
        CONFIG,
    )
    assert any("amd-gpu-unhealthy" in w for w in p2.warnings)


def test_gpu_requests_and_limits() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    res = _engine(p.objects)["resources"]
    assert res["requests"]["amd.com/gpu"] == res["limits"]["amd.com/gpu"] == "4"


# ----------------------------------------------------------------------------- NUMA


def test_rank_numa_map_and_single_numa_node_verdict() -> None:
    p8 = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    assert [r["numaNode"] for r in p8.status_plan["ranks"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert p8.status_plan["topology"]["singleNumaNodeCompatible"] is False
    assert any(
        "single-numa-node" in w and "8 GPUs per pod span 2 NUMA nodes" in w for w in p8.warnings
    )
    p4 = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    assert p4.status_plan["topology"] == {
        "singleNumaNodeCompatible": True,
        "admittedBy": ["none", "best-effort", "restricted", "single-numa-node"],
        "reasons": [],
        "podsPerNode": 2,
        "podsPerNodeLimitedBy": ["gpus", "memory"],
    }


def test_node_facts_override_the_map() -> None:
    facts = NodeFacts(gpu_numa=[1, 1, 1, 1, 0, 0, 0, 0], memory="4Ti")
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG, facts)
    assert [r["numaNode"] for r in p.status_plan["ranks"]] == [1, 1, 1, 1, 0, 0, 0, 0]
    one_socket = NodeFacts(numa_nodes=1, gpus_per_numa_node=8, memory="4Ti")
    p1 = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG, one_socket)
    assert p1.status_plan["topology"]["singleNumaNodeCompatible"] is True
