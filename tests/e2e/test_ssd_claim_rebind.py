"""A local-NVMe SSD claim bound to a lost node (issue 25, item 7).

Real: the operator (kopf, every module: ``planner.claim_rebind``, ``controller.claims``)
reading the claim's PersistentVolume and the nodes and deleting claim and pod. Emulated: the API
server (PersistentVolumes, Nodes), the StatefulSet controller (recreates the pod and its claim),
the volume controller's binding (``bind_local_volume``: a local PersistentVolume with node
affinity to one node's hostname) and the scheduler's verdict (the pod Pending, unschedulable).
Counts and states only; the wait before deleting is a spec field the test sets.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_lib import NAMESPACE, REPO, Cluster, example

pytestmark = pytest.mark.e2e
NAME = "nvme"
CLAIM = f"umbp-ssd-{NAME}-0"


def _node(name: str, ready: bool = True, unschedulable: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]}}


def _cr(rebind_after: int) -> dict[str, Any]:
    cr = example(REPO / "examples" / "minimal-dram-only.yaml", NAME)
    cr["spec"]["replicas"] = 1
    cr["spec"]["l3"]["ssd"] = {
        "enabled": True, "capacity": "10Gi", "ioBackend": "posix",
        "volume": {"claimTemplate": {"storageClassName": "local-nvme", "size": "20Gi",
                                     "rebindAfterSeconds": rebind_after}}}
    return cr


def _claim(cluster: Cluster) -> dict[str, Any] | None:
    return cluster.emu.find("v1", "persistentvolumeclaims", NAMESPACE, CLAIM)


def test_a_claim_on_a_lost_node_is_deleted_after_the_wait_and_the_pod_comes_back(
        cluster: Cluster, operator: Any) -> None:
    sim = cluster.emu.simulator
    assert sim is not None
    cluster.emu.create("v1", "nodes", _node("gpu-a"))
    cluster.emu.create("v1", "nodes", _node("gpu-b"))
    cluster.apply(_cr(rebind_after=3600))
    cluster.wait(lambda: len(cluster.pods(NAME)) == 1 and _claim(cluster), "pod and claim")
    sts = cluster.child(("apps/v1", "statefulsets"), NAME)
    assert sts is not None
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Delete"}
    pv = cluster.emu.call(lambda s: sim.bind_local_volume(NAMESPACE, CLAIM, "gpu-a"))
    first_uid = (_claim(cluster) or {})["metadata"]["uid"]

    # gpu-a is cordoned, then deleted; gpu-b cannot mount the volume: the pod stays Pending.
    cluster.emu.patch("v1", "nodes", None, "gpu-a", {"spec": {"unschedulable": True}})
    cluster.set_pod("pod_unschedulable", f"{NAME}-0",
                    "0/2 nodes are available: 1 node(s) had volume node affinity conflict, "
                    "1 node(s) were unschedulable")
    lost = cluster.wait_condition(NAME, "Degraded", "True", "SsdVolumeLost", 60)
    assert "node gpu-a is cordoned" in lost["message"] and "deleted at" in lost["message"]
    assert pv["metadata"]["name"] in lost["message"]
    cluster.emu.delete("v1", "nodes", None, "gpu-a")
    cluster.wait(lambda: "no longer exists" in cluster.condition(NAME, "Degraded").get(
        "message", ""), "the node's loss in the condition", 60)
    assert (_claim(cluster) or {})["metadata"]["uid"] == first_uid  # not yet: 3600 s

    # The wait is lowered: the claim and the pod go, the StatefulSet recreates both.
    cluster.patch_spec(NAME, {"l3": {"ssd": {"volume": {"claimTemplate": {
        "rebindAfterSeconds": 1}}}}})
    cluster.wait(lambda: (_claim(cluster) or {}).get("metadata", {}).get("uid")
                 not in (None, first_uid), "a new claim", 60)
    events = cluster.wait(lambda: [e for e in cluster.events(NAME)
                                   if e.get("reason") == "SsdVolumeLost"
                                   and "deleted the claim and the pod" in e["message"]],
                          "the Event")
    assert len(events) == 1 and f"pod {NAME}-0" in events[0]["message"]
    assert not (_claim(cluster) or {}).get("spec", {}).get("volumeName")  # unbound, new
    cond = cluster.wait_condition(NAME, "Degraded", "True", "SsdVolumeLost")
    assert "cold SSD tier" in cond["message"]
    # The new pod is scheduled elsewhere and becomes Ready: the condition clears.
    cluster.mark_pods_ready(NAME, 1)
    cluster.wait_condition(NAME, "Degraded", "False", "NoFailures", 60)


def test_a_pending_pod_whose_node_is_fine_keeps_its_claim(cluster: Cluster,
                                                          operator: Any) -> None:
    """Pending for another reason (no GPU free) on a volume whose node is Ready: nothing is
    deleted, however long it waits."""
    sim = cluster.emu.simulator
    assert sim is not None
    cluster.emu.create("v1", "nodes", _node("gpu-a"))
    cluster.apply(_cr(rebind_after=0))
    cluster.wait(lambda: len(cluster.pods(NAME)) == 1 and _claim(cluster), "pod and claim")
    cluster.emu.call(lambda s: sim.bind_local_volume(NAMESPACE, CLAIM, "gpu-a"))
    uid = (_claim(cluster) or {})["metadata"]["uid"]
    cluster.set_pod("pod_unschedulable", f"{NAME}-0",
                    "0/1 nodes are available: 1 Insufficient amd.com/gpu")
    cluster.wait_condition(NAME, "Degraded", "True", "GpusUnavailable", 60)
    cluster.patch_spec(NAME, {"l3": {"ssd": {"volume": {"claimTemplate": {
        "rebindAfterSeconds": 1}}}}})
    cluster.wait(lambda: (cluster.cr(NAME) or {}).get("status", {}).get(
        "observedGeneration") == 2, "the edit reconciled", 60)
    cluster.wait_settled(2)
    assert (_claim(cluster) or {})["metadata"]["uid"] == uid
    assert not [e for e in cluster.events(NAME) if e.get("reason") == "SsdVolumeLost"]
