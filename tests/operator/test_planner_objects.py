"""The objects the planner emits: standalone sidecars, deterministic labelled children, the
config hash that rolls pods, the status plan, retained SSD claims, the PDB."""

from __future__ import annotations

from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import SpecError, plan
from shc_testlib import CONFIG, GI, load_example, mori_ssd, pod_spec
from shc_testlib import configmap_env as _configmap_env
from shc_testlib import engine_container as _engine
from shc_testlib import example_cr as _cr
from shc_testlib import has_problem as _has
from shc_testlib import plan_problems as _problems

# ----------------------------------------------------------------------------- standalone


def test_standalone_sidecars_one_per_medium_share_the_socket_dir() -> None:
    """The mori SSD engine (spec.l3.ssd.engine: mori) runs one umbp-ssd sidecar beside the
    DRAM one; the hicache engine's tier is in the engine (test_planner_ssd_engine.py)."""
    p = plan(_cr("llama-3.1-70b-mi355x.yaml", mori_ssd), CONFIG)
    spec = pod_spec(p.objects)
    sidecars = {c["name"]: c for c in spec["initContainers"]}
    assert set(sidecars) == {"umbp-dram", "umbp-ssd"}
    for medium, c in sidecars.items():
        assert c["restartPolicy"] == "Always"
        sock = f"/var/run/umbp/{medium.removeprefix('umbp-')}.sock"
        assert c["command"] == ["umbp_standalone_server", f"unix:{sock}"]
        assert {"name": "umbp-sockets", "mountPath": "/var/run/umbp"} in c["volumeMounts"]
    assert {"name": "umbp-sockets", "mountPath": "/var/run/umbp"} in _engine(p.objects)[
        "volumeMounts"
    ]
    dram_env = {e["name"]: e["value"] for e in sidecars["umbp-dram"]["env"]}
    assert dram_env["UMBP_DRAM_CAPACITY"] == str(256 * GI)
    ssd_env = {e["name"]: e["value"] for e in sidecars["umbp-ssd"]["env"]}
    assert ssd_env["UMBP_SSD_CAPACITY"] == str(800 * GI)
    assert ssd_env["UMBP_SSD_DIR"] == "/mnt/umbp-ssd"
    env = _configmap_env(p.objects)
    assert env["HICACHE_UMBP_MODE"] == "standalone"
    assert "HICACHE_UMBP_DRAM_BYTES" not in env  # embedded-only keys are never rendered
    # DRAM sidecar holds its 4 KiB-backed 256Gi, their page tables (256 GiB / 512 x 513/512)
    # and 2Gi for the process.
    assert sidecars["umbp-dram"]["resources"]["limits"]["memory"] == f"{258 * 1024 + 513}Mi"


def test_standalone_needs_a_dram_server() -> None:
    problems = _problems(
        _cr("llama-3.1-70b-mi355x.yaml", lambda s: s["l3"]["dram"].update(capacity=0))
    )
    assert _has(problems, "spec.l3.dram.capacity", "standalone")


# ----------------------------------------------------------------------------- objects


def test_objects_are_deterministic_labelled_and_without_owner_refs() -> None:
    a = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    b = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    assert a.objects == b.objects
    assert [f"{o['kind']}/{o['metadata']['name']}" for o in a.objects] == [
        "ConfigMap/llama-70b-hicache",
        "Service/llama-70b-headless",
        "Service/llama-70b",
        "PodDisruptionBudget/llama-70b",
        "ServiceAccount/llama-70b-router",
        "Role/llama-70b-router",
        "RoleBinding/llama-70b-router",
        "Deployment/llama-70b-router",
        "PodDisruptionBudget/llama-70b-router",
        "StatefulSet/llama-70b",
    ]
    for o in a.objects:
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "sglang-hicache"
        assert labels["app.kubernetes.io/instance"] == "llama-70b"
        assert labels["app.kubernetes.io/managed-by"] == "sglang-hicache-operator"
        assert labels["app.kubernetes.io/component"] in {"engine", "config", "router"}
        assert o["metadata"]["namespace"] == "inference"
        assert "ownerReferences" not in o["metadata"]
    headless = a.objects[1]
    assert headless["spec"]["clusterIP"] == "None"
    assert a.objects[-1]["spec"]["serviceName"] == "llama-70b-headless"


def test_config_change_rolls_pods_via_the_hash_annotation() -> None:
    a = plan(_cr("minimal-dram-only.yaml"), CONFIG)
    b = plan(
        _cr("minimal-dram-only.yaml", lambda s: s["l3"]["dram"].update(capacity="128Gi")), CONFIG
    )
    key = "hicache.sglang.ai/config-hash"

    def annotation(p: Any) -> str:
        return str(p.objects[-1]["spec"]["template"]["metadata"]["annotations"][key])

    assert annotation(a) != annotation(b)


def test_status_plan_is_valid_status() -> None:
    from hicache_operator.api.status import PlanStatus

    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    parsed = PlanStatus.model_validate(p.status_plan)
    assert parsed.gpus_per_pod == 8 and parsed.host_pool_bytes_per_rank == 200 * GI


def test_env_names_the_operator_sets_in_the_pod_are_owned() -> None:
    cr = _cr(
        "minimal-dram-only.yaml",
        lambda s: s.update(engine={"env": [{"name": "POD_NAME", "value": "x"}]}),
    )
    assert _has(_problems(cr), "spec.engine.env[0].name", "POD_NAME")


def test_ssd_volume_retention_keeps_pvcs_unless_the_cr_opts_in() -> None:
    """PVCs survive the CR's deletion unless deleteWithResource; a scale-down deletes its
    pods' claims unless whenScaled: Retain (test_claim_rebind)."""
    cr = load_example("deepseek-r1-mi355x.yaml")
    policy = _sts_of(plan(cr, OperatorConfig()))["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert policy == {"whenDeleted": "Retain", "whenScaled": "Delete"}
    cr["spec"]["l3"]["ssd"]["volume"]["claimTemplate"]["deleteWithResource"] = True
    sts = _sts_of(plan(cr, OperatorConfig()))
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    assert "deleteWithResource" not in str(sts["spec"]["volumeClaimTemplates"])


def _sts_of(result: Any) -> dict[str, Any]:
    return next(o for o in result.objects if o["kind"] == "StatefulSet")


def test_parse_errors_and_semantic_problems_are_reported_together() -> None:
    """A field that fails to parse does not hide the CR's other problems; its own echoes
    (e.g. 'set exactly one of hostPoolPerRank or hostPoolRatio') are not repeated."""
    cr = load_example("deepseek-r1-mi355x.yaml")
    cr["spec"]["hiCache"].update(hostPoolPerRank="10Gx", memLayout="layer_first")
    cr["spec"]["engine"]["tensorParallelSize"] = 16
    cr["spec"]["placement"]["gpuModel"] = "H100"
    with pytest.raises(SpecError) as info:
        plan(cr, OperatorConfig())
    paths = [p for p, _ in info.value.problems]
    assert "spec.hiCache.hostPoolPerRank" in paths
    assert "spec.placement.gpuModel" in paths
    assert "spec.hiCache.memLayout" in paths
    assert any(p.startswith("spec.engine") for p in paths)
    assert "spec.hiCache" not in paths


def test_pdb_is_planned_only_for_more_than_one_replica() -> None:
    cr = load_example("llama-3.1-70b-mi355x.yaml")
    assert cr["spec"]["replicas"] == 2
    kinds = [o["kind"] for o in plan(cr, OperatorConfig()).objects]
    assert "PodDisruptionBudget" in kinds
    cr["spec"]["replicas"] = 1
    assert "PodDisruptionBudget" not in [o["kind"] for o in plan(cr, OperatorConfig()).objects]
