"""The planner refuses what the API server would refuse, and warns about what it would silently
get wrong: pass-through Kubernetes fields, built objects, pods per node, rounding, model paths,
update strategies, and the plan/summary layering.

Real: the planner, the typed core/v1 models, kubernetes-validate's 1.33 schemas. No fakes.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hicache_operator.api.config import NodeFacts, OperatorConfig
from hicache_operator.api.k8s import ROLLING_UPDATE_TYPES_MESSAGE
from hicache_operator.api.quantity import parse_bytes
from hicache_operator.controller.kube import PERMISSIONS
from hicache_operator.plan import plan, render_summary
from hicache_operator.planner.errors import Problems
from hicache_operator.planner.object_checks import check_objects
from hicache_umbp.contract.units import fmt_bytes
from shc_testlib import crd_schema_errors, load_example, pod_spec, validate_k8s
from shc_testlib import example_cr as _cr
from shc_testlib import plan_problems as _problems

pytestmark = pytest.mark.unit
CONFIG = OperatorConfig()
PLANNER = Path(__file__).resolve().parents[2] / "operator" / "hicache_operator" / "planner"


def _placement(**fields: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda s: s.setdefault("placement", {}).update(fields)


def _required(*terms: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


BAD = {
    "1e400": (lambda s: s["hiCache"].update(hostPoolPerRank="1e400"),
              "spec.hiCache.hostPoolPerRank", "8 EiB"),
    "node-affinity-string": (_placement(affinity={"nodeAffinity": "x"}),
                             "spec.placement.affinity.nodeAffinity", "valid dictionary"),
    "terms-string": (_placement(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}}),
        "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms", "valid list"),
    "match-expressions-string": (_placement(affinity=_required({"matchExpressions": "oops"})),
                                 "spec.placement.affinity.nodeAffinity."
                                 "requiredDuringSchedulingIgnoredDuringExecution."
                                 "nodeSelectorTerms[0].matchExpressions", "valid list"),
    "in-without-values": (_placement(affinity=_required({"matchExpressions": [
        {"key": "zone", "operator": "In"}]})), "spec.placement.affinity.nodeAffinity."
        "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]."
        "matchExpressions[0].values", "non-empty"),
    "gt-two-values": (_placement(affinity=_required({"matchExpressions": [
        {"key": "cpus", "operator": "Gt", "values": ["1", "2"]}]})), "spec.placement.affinity."
        "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]."
        "matchExpressions[0].values", "one integer"),
    "secret-key-ref-string": (lambda s: s.setdefault("engine", {}).update(
        env=[{"name": "T", "valueFrom": {"secretKeyRef": "nope"}}]),
        "spec.engine.env[0].valueFrom.secretKeyRef", "valid dictionary"),
    "two-env-sources": (lambda s: s.setdefault("engine", {}).update(
        env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                         "fieldRef": {"fieldPath": "metadata.name"}}}]),
        "spec.engine.env[0].valueFrom", "exactly one"),
    "label-key": (_placement(nodeSelector={"bad key!": "x"}), "spec.placement.nodeSelector",
                  "not a valid label key"),
    "label-value": (_placement(nodeSelector={"zone": "a b"}), "spec.placement.nodeSelector[zone]",
                    "not a valid label value"),
    "priority-class": (_placement(priorityClassName="Bad_Name!"),
                       "spec.placement.priorityClassName", "pattern"),
    "mount-on-dev-shm": (lambda s: s["model"].update(
        mountPath="/dev/shm", volume={"persistentVolumeClaim": {"claimName": "w"}}),
        "spec.model.mountPath", "collides with /dev/shm"),
    "mount-above-ssd": (lambda s: s["model"].update(
        mountPath="/mnt", volume={"persistentVolumeClaim": {"claimName": "w"}}),
        "spec.model.mountPath", "collides with /mnt/umbp-ssd"),
    "unknown-volume-source": (lambda s: s["model"].update(volume={"gitRepo": {"repository": "x"}}),
                              "spec.model.volume.gitRepo", "unknown field"),
    "toleration-exists-value": (_placement(tolerations=[
        {"key": "k", "operator": "Exists", "value": "v"}]),
        "spec.placement.tolerations[0].value", "must be empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_planner_refuses_what_the_api_server_would(case: str) -> None:
    mutate, path, fragment = BAD[case]
    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    assert any(p == path and fragment in m for p, m in problems), problems


# (An unknown volume source is pruned by the API server, then the CEL "exactly one volume
# source" rule refuses the empty volume: the emulator e2e tests cover that path.)
@pytest.mark.parametrize("case", ["node-affinity-string", "terms-string",
                                  "match-expressions-string", "secret-key-ref-string",
                                  "priority-class"])
def test_the_crd_schema_refuses_the_same_at_apply(case: str) -> None:
    mutate, _, _ = BAD[case]
    assert crd_schema_errors(_cr("minimal-dram-only.yaml", mutate))


def test_typed_pass_through_fields_reach_the_pod_as_written() -> None:
    affinity: dict[str, Any] = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"app": "x"}}}]},
    }
    env: list[dict[str, Any]] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]

    def mutate(s: dict[str, Any]) -> None:
        s["placement"] = {"affinity": affinity, "priorityClassName": "inference-high"}
        s["engine"] = {"env": env}
        s["model"].update(path="/weights/qwen", mountPath="/weights",
                          volume={"image": {"reference": "registry.example/qwen:1",
                                            "pullPolicy": "IfNotPresent"}})

    p = plan(_cr("minimal-dram-only.yaml", mutate), CONFIG)
    pod = pod_spec(p.objects)
    assert pod["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]
    assert pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] \
        == affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pod["priorityClassName"] == "inference-high"
    assert env[0] in pod["containers"][0]["env"]
    assert {"name": "model", "image": {"reference": "registry.example/qwen:1",
                                       "pullPolicy": "IfNotPresent"}} in pod["volumes"]
    for obj in p.objects:
        validate_k8s(obj)


def test_object_checks_catch_a_broken_built_object() -> None:
    """The last gate sees what no spec check covers (here: objects broken after building)."""
    p = plan(load_example("minimal-dram-only.yaml"), CONFIG)
    objects = copy.deepcopy(p.objects)
    sts = objects[-1]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["volumeMounts"].append(dict(container["volumeMounts"][0]))
    container["volumeMounts"].append({"name": "nowhere", "mountPath": "/x"})
    sts["metadata"]["labels"]["bad key!"] = "v"
    problems = Problems()
    check_objects(objects, problems)
    messages = " | ".join(f"{p}: {m}" for p, m in problems.items)
    assert "mountPath '/dev/shm' is used twice" in messages
    assert "'nowhere' is not a volume of the pod" in messages
    assert "StatefulSet/qwen-small metadata.labels" in messages
    clean = Problems()
    check_objects(p.objects, clean)
    assert not clean


def test_quantities_beyond_int64_are_refused_not_overflowed() -> None:
    with pytest.raises(ValueError, match="8 EiB"):
        parse_bytes("1e400")
    with pytest.raises(ValueError, match="8 EiB"):
        parse_bytes(2**63)
    assert parse_bytes(2**63 - 1) == 2**63 - 1
    assert fmt_bytes(10**400).endswith("TiB")


def test_pods_per_node_counts_memory_hugepages_and_cpus_not_only_gpus() -> None:
    cr = load_example("llama-3.1-70b-mi355x.yaml")  # TP4: 2 pods by GPUs
    assert plan(cr, CONFIG).topology.pods_per_node == 2
    small_memory = CONFIG.model_copy(update={"node_facts": NodeFacts(memory="2000Gi")})
    t = plan(cr, small_memory).topology
    assert (t.pods_per_node, t.pods_per_node_limited_by) == (1, ("memory",))
    few_cpus = CONFIG.model_copy(update={"node_facts": NodeFacts(cpus=60)})
    assert plan(cr, few_cpus).topology.pods_per_node_limited_by == ("cpu",)
    few_pages = CONFIG.model_copy(update={"node_facts": NodeFacts(hugepages={"2Mi": "1000Gi"})})
    p = plan(cr, few_pages)
    assert (p.topology.pods_per_node, p.topology.pods_per_node_limited_by) == (
        1, ("hugepages-2Mi",))
    assert p.status_plan["topology"]["podsPerNodeLimitedBy"] == ["hugepages-2Mi"]
    no_pages = CONFIG.model_copy(update={"node_facts": NodeFacts(hugepages={"2Mi": "500Gi"})})
    p = plan(cr, no_pages)
    assert p.topology.pods_per_node == 0
    assert any("fits one pod" in w and "hugepages-2Mi" in w for w in p.warnings)
    assert "(limited by hugepages-2Mi)" in render_summary(p)


def test_1gi_hugepages_rounding_the_dram_tier_down_is_a_warning() -> None:
    def dram(s: dict[str, Any]) -> None:
        s["engine"] = {"tensorParallelSize": 3}
        s["l3"]["dram"] = {"capacity": "100Gi", "hugePageSize": "1Gi"}

    p = plan(_cr("minimal-dram-only.yaml", dram), CONFIG)
    assert p.sizing.dram_per_rank == 33 * 2**30 and p.sizing.dram_total == 99 * 2**30
    assert any("rounds down to whole 1Gi pages" in w and "33Gi per rank" in w
               and "(1 GiB less" in w for w in p.warnings), p.warnings
    exact = plan(_cr("minimal-dram-only.yaml", lambda s: s["l3"].update(
        dram={"capacity": "64Gi", "hugePageSize": "1Gi"})), CONFIG)
    assert not any("rounds down" in w for w in exact.warnings)


@pytest.mark.parametrize(("path", "warned"), [
    ("/models/qwen", False), ("/data/qwen", True), ("Qwen/Qwen2.5-7B-Instruct", True)])
def test_a_model_path_outside_the_model_volume_is_flagged(path: str, warned: bool) -> None:
    p = plan(_cr("minimal-dram-only.yaml", lambda s: s["model"].update(
        path=path, volume={"persistentVolumeClaim": {"claimName": "w"}})), CONFIG)
    assert any("model.path" in w and "/models" in w for w in p.warnings) == warned


@pytest.mark.parametrize(("strategy", "rendered"), [
    (None, {"type": "RollingUpdate"}),
    ({"type": "OnDelete"}, {"type": "OnDelete"}),
    ({"rollingUpdate": {"partition": 1, "maxUnavailable": "50%"}},
     {"type": "RollingUpdate", "rollingUpdate": {"partition": 1, "maxUnavailable": "50%"}}),
    # In place: the operator rolls the pods; the StatefulSet controller is held off them all.
    ({"type": "InPlaceIfPossible", "rollingUpdate": {"partition": 1, "maxUnavailable": 2}},
     {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}),
])
def test_update_strategy_is_rendered_with_a_safe_default(
        strategy: dict[str, Any] | None, rendered: dict[str, Any]) -> None:
    def mutate(s: dict[str, Any]) -> None:
        s["replicas"] = 2
        if strategy is not None:
            s["updateStrategy"] = strategy

    p = plan(_cr("minimal-dram-only.yaml", mutate), CONFIG)
    assert p.objects[-1]["spec"]["updateStrategy"] == rendered
    validate_k8s(p.objects[-1])


def test_update_strategy_mistakes_are_refused() -> None:
    problems = _problems(_cr("minimal-dram-only.yaml", lambda s: s.update(
        updateStrategy={"type": "OnDelete", "rollingUpdate": {"partition": 1}})))
    assert ("spec.updateStrategy", ROLLING_UPDATE_TYPES_MESSAGE) in problems
    problems = _problems(_cr("minimal-dram-only.yaml", lambda s: s.update(
        updateStrategy={"rollingUpdate": {"maxUnavailable": "150%"}})))
    assert any(p == "spec.updateStrategy.rollingUpdate.maxUnavailable" for p, _ in problems)
    held = plan(_cr("minimal-dram-only.yaml", lambda s: s.update(
        replicas=2, updateStrategy={"rollingUpdate": {"partition": 2}})), CONFIG)
    assert any("partition 2 >= replicas 2" in w for w in held.warnings)


def test_the_summary_only_reads_a_finished_plan() -> None:
    """orchestrate.py never imports summary.py (summary imports it, not the other way round)."""
    tree = ast.parse((PLANNER.parent / "plan" / "orchestrate.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.endswith("summary") for m in imported), imported


def test_rbac_declares_finalizers_update_pvc_patch_and_storage_classes() -> None:
    grants = {(g, r): v for g, r, v in PERMISSIONS}
    assert grants[("hicache.sglang.ai", "sglanghicaches/finalizers")] == ("update",)
    assert "patch" in grants[("", "persistentvolumeclaims")]
    assert grants[("storage.k8s.io", "storageclasses")] == ("get",)
    assert not any(r in ("pods/proxy", "secrets") for _, r in grants)
