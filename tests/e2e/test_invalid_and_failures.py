"""Invalid CRs and pod-level failures end to end (real operator under KopfRunner, emulator).

Schema/CEL violations are answered 422 by the emulator from the chart's CRD; semantic problems
only the planner sees end up in ``SpecValid=False`` with every problem, an Event and no
children. Pod failures set by the emulated kubelet/scheduler surface as ``Degraded`` reasons,
and an unchanged failure causes no further writes (no hot loop).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from e2e_lib import EXAMPLES, RESYNC_S, Cluster, example

pytestmark = pytest.mark.e2e


def _minimal(name: str) -> dict[str, Any]:
    return example(next(p for p in EXAMPLES if "minimal" in p.stem), name)


@pytest.mark.parametrize(("patch", "field"), [
    ({"replicas": -1}, "spec.replicas"),
    ({"hiCache": {"hostPoolPerRank": "32Gi", "memLayout": "layer_first"}}, "spec.hiCache"),
], ids=["openapi-minimum", "cel-rule"])
def test_schema_rejected_cr_is_a_422_and_the_operator_keeps_running(
        cluster: Cluster, operator: Any, patch: dict[str, Any], field: str) -> None:
    cr = _minimal("rejected")
    cr["spec"].update(patch)
    error = cluster.create_raw(cr)
    assert error is not None and error.status == 422
    assert field in [f for f, _ in error.causes]
    assert cluster.cr("rejected") is None
    good = _minimal("after")
    cluster.apply(good)
    cluster.wait_children(good)  # the operator is alive and well


def test_semantically_invalid_cr_lists_every_problem_and_gets_no_children(
        cluster: Cluster, operator: Any) -> None:
    cr = _minimal("bad")
    cr["spec"]["engine"] = {"tensorParallelSize": 16}
    cr["spec"]["l3"] = {"dram": {"capacity": "64Gi"}, "ssd": {
        "enabled": True, "capacity": "100Gi", "volume": {"hostPath": {"path": "/etc"}}}}
    cluster.apply(cr)
    cond = cluster.wait_condition("bad", "SpecValid", "False", "InvalidSpec")
    assert "spec.engine" in cond["message"] and "spec.l3.ssd.volume.hostPath.path" in \
        cond["message"]
    status = (cluster.cr("bad") or {})["status"]
    assert status["phase"] == "Invalid" and status["observedGeneration"] == 1
    assert cluster.children("bad") == {}
    cluster.wait(lambda: [e for e in cluster.events("bad") if e["reason"] == "InvalidSpec"
                          and e["type"] == "Warning"], "an InvalidSpec warning Event")
    # A permanent error is not retried: nothing more is written while the spec stays bad.
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(3 * RESYNC_S) == []
    fixed = copy.deepcopy(cr)
    fixed["spec"].pop("engine")
    fixed["spec"]["l3"] = {"dram": {"capacity": "64Gi"}}
    cluster.patch_spec("bad", {"engine": None, "l3": {"ssd": None}})  # merge patch: null drops
    cluster.wait_children(fixed)
    cluster.wait_condition("bad", "SpecValid", "True")


def test_topology_affinity_error_degrades_without_a_hot_loop(
        cluster: Cluster, operator: Any) -> None:
    cr = example(EXAMPLES[0], "numa")  # 8 GPUs per pod: spans both sockets
    cluster.apply(cr)
    cluster.wait_children(cr)
    pod = cluster.wait(lambda: cluster.pods("numa"), "the pod")[0]["metadata"]["name"]
    message = ("Pod was rejected: Resources cannot be allocated with Topology locality "
               "(single-numa-node)")
    cluster.set_pod("pod_failed", pod, "TopologyAffinityError", message)
    cond = cluster.wait_condition("numa", "Degraded", "True", "TopologyAffinityError")
    assert message in cond["message"]
    assert cluster.condition("numa", "Progressing")["reason"] == "Stalled"
    cluster.wait(lambda: [e for e in cluster.events("numa")
                          if e["reason"] == "TopologyAffinityError"], "a topology Event")
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(4 * RESYNC_S) == []  # no recreate loop, no status churn
    assert len([e for e in cluster.events("numa") if e["reason"] == "TopologyAffinityError"]) == 1
    assert cluster.pods("numa")[0]["metadata"]["uid"]  # the failed pod was left for inspection


@pytest.mark.parametrize(("setter", "args", "reason", "quoted"), [
    ("pod_unschedulable", ("0/4 nodes are available: 4 Insufficient hugepages-2Mi.",),
     "HugepagesUnavailable", "Insufficient hugepages-2Mi"),
    ("pod_unschedulable", ("0/4 nodes are available: 4 Insufficient amd.com/gpu.",),
     "GpusUnavailable", "Insufficient amd.com/gpu"),
    ("pod_unschedulable", ("0/4 nodes are available: pod has unbound immediate "
                           "PersistentVolumeClaims.",), "SsdVolumePending", "unbound immediate"),
    ("pod_waiting", ("ErrImagePull", "pull access denied for ghcr.io/x"), "ImagePullError",
     "pull access denied"),
    ("pod_waiting", ("CrashLoopBackOff", "back-off 5m0s restarting failed container", 7),
     "CrashLoopBackOff", "restarted 7 times"),
], ids=["hugepages", "gpus", "ssd-pvc", "image-pull", "crash-loop"])
def test_pod_failures_surface_in_degraded(cluster: Cluster, operator: Any, setter: str,
                                          args: tuple[Any, ...], reason: str,
                                          quoted: str) -> None:
    cr = _minimal("pods")
    cluster.apply(cr)
    cluster.wait_children(cr)
    pod = cluster.wait(lambda: cluster.pods("pods"), "the pod")[0]["metadata"]["name"]
    cluster.set_pod(setter, pod, *args)
    cond = cluster.wait_condition("pods", "Degraded", "True", reason)
    assert quoted in cond["message"]
    assert (cluster.cr("pods") or {})["status"]["phase"] == "Degraded"
    cluster.set_pod("pod_ready", pod)
    cluster.wait_condition("pods", "Degraded", "False", "NoFailures")
    cluster.wait_condition("pods", "Ready", "True")
