"""Lifecycle end to end: examples applied, children as planned, status, updates, drift,
deletion. The real operator (KopfRunner) against the emulator; see conftest for what is real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_lib import EXAMPLES, NAMESPACE, RESYNC_S, Cluster, example, planned

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_gets_planned_children_status_plan_and_becomes_ready(
        cluster: Cluster, operator: Any, path: Path) -> None:
    cr = example(path)
    name = cr["metadata"]["name"]
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    body = cluster.cr(name)
    assert body is not None
    uid = body["metadata"]["uid"]
    for obj in live.values():
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["uid"], r["controller"]) for r in refs] == [(uid, True)]
    cluster.wait_condition(name, "Progressing", "True")
    cluster.wait_condition(name, "SpecValid", "True")
    status = (cluster.cr(name) or {})["status"]
    assert status["plan"] == planned(cr).status_plan
    assert status["observedGeneration"] == 1
    replicas = int(cr["spec"].get("replicas", 1))
    cluster.mark_pods_ready(name, replicas)
    cluster.wait_condition(name, "Ready", "True", "AllReplicasReady")
    status = (cluster.cr(name) or {})["status"]
    assert status["readyReplicas"] == replicas and status["phase"] == "Ready"
    cluster.wait(lambda: {"Applied", "Sized", "Ready"} <= {e["reason"] for e in
                                                           cluster.events(name)},
                 "Applied, Sized and Ready events")


def test_spec_updates_converge_and_a_noop_resync_writes_nothing(
        cluster: Cluster, operator: Any) -> None:
    cr = example(EXAMPLES[0], "upd")  # deepseek-r1: PVC-backed SSD
    cluster.apply(cr)
    cluster.wait_children(cr)
    steps: list[dict[str, Any]] = [
        {"replicas": 2},
        {"l3": {**cr["spec"]["l3"], "dram": {"capacity": "256Gi"}}},
        {"replicas": 1},
    ]
    for generation, step in enumerate(steps, start=2):
        cluster.patch_spec("upd", step)
        cr["spec"].update(step)
        cluster.wait_children(cr)
        cluster.wait(lambda g=generation: ((cluster.cr("upd") or {}).get("status") or {}).get(
            "observedGeneration") == g, f"observedGeneration {generation}")
    sts = cluster.child(("apps/v1", "statefulsets"), "upd")
    assert sts is not None and sts["spec"]["replicas"] == 1
    # Nothing changes now: several resync periods must not write anything at all. (The
    # StatefulSet replaces the pod of the old template once the pods are ready.)
    cluster.ready_until("upd", lambda: cluster.condition("upd", "Ready").get("status") == "True",
                        "upd: Ready=True after the rolling update")
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(4 * RESYNC_S) == []


def _pod_containers(sts: dict[str, Any]) -> list[str]:
    pod = sts["spec"]["template"]["spec"]
    return [c["name"] for c in pod.get("initContainers", []) + pod["containers"]]


def test_mode_change_rolls_the_pod_template(cluster: Cluster, operator: Any) -> None:
    llama = next(p for p in EXAMPLES if "llama-3.1-70b" in p.stem)  # standalone
    cr = example(llama, "modes")
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    standalone = live[("StatefulSet", "modes")]
    want = next(o for o in planned(cr).objects if o["kind"] == "StatefulSet")
    assert _pod_containers(standalone) == _pod_containers(want)
    cluster.patch_spec("modes", {"l3": {**cr["spec"]["l3"], "mode": "embedded"}})
    cr["spec"]["l3"]["mode"] = "embedded"
    live = cluster.wait_children(cr)
    embedded = live[("StatefulSet", "modes")]
    want = next(o for o in planned(cr).objects if o["kind"] == "StatefulSet")
    assert _pod_containers(embedded) == _pod_containers(want)
    assert embedded["spec"]["template"] != standalone["spec"]["template"]
    cluster.wait(lambda: ((cluster.cr("modes") or {}).get("status") or {}).get(
        "observedGeneration") == 2, "observedGeneration 2 after the mode change")


def test_drift_is_corrected_and_deletion_removes_children(
        cluster: Cluster, operator: Any) -> None:
    cr = example(EXAMPLES[-1], "drift")
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    # A deleted child comes back (new uid).
    (kind, cm_name) = next(k for k in live if k[0] == "ConfigMap")
    old_uid = live[(kind, cm_name)]["metadata"]["uid"]
    cluster.emu.delete("v1", "configmaps", NAMESPACE, cm_name)
    live = cluster.wait_children(cr)
    assert live[(kind, cm_name)]["metadata"]["uid"] != old_uid
    # An edited child is put back; fields others own (an extra annotation) are left alone.
    cluster.emu.patch("apps/v1", "statefulsets", NAMESPACE, "drift", {
        "metadata": {"annotations": {"someone/else": "keep"}},
        "spec": {"replicas": 7, "template": {"spec": {"priorityClassName": "rogue"}}}})
    live = cluster.wait_children(cr)
    sts = live[("StatefulSet", "drift")]
    assert sts["spec"]["replicas"] == int(cr["spec"].get("replicas", 1))
    assert sts["metadata"]["annotations"]["someone/else"] == "keep"
    # Deleting the CR removes every child and releases the finalizer.
    body = cluster.cr("drift")
    assert body is not None and body["metadata"]["finalizers"] == ["hicache.sglang.ai/finalizer"]
    cluster.delete_cr("drift")
    cluster.wait(lambda: cluster.cr("drift") is None and not cluster.children("drift"),
                 "the CR and its children to be gone")


def test_ssd_volumes_are_kept_unless_the_cr_says_otherwise(
        cluster: Cluster, operator: Any) -> None:
    cr = example(EXAMPLES[0], "vols")
    cr["spec"]["replicas"] = 2
    cluster.apply(cr)
    cluster.wait_children(cr)
    cluster.wait(lambda: cluster.emu.list("v1", "persistentvolumeclaims", NAMESPACE),
                        "PVCs from volumeClaimTemplates")
    sts = cluster.child(("apps/v1", "statefulsets"), "vols")
    assert sts is not None
    # A scale-down deletes the removed pod's claim (whenScaled: Delete, the default: a kept
    # local-NVMe claim would pin a later scale-up to the old node); the CR's deletion keeps
    # the others unless deleteWithResource.
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Delete"}
    cluster.wait(lambda: len(cluster.emu.list("v1", "persistentvolumeclaims", NAMESPACE)) == 2,
                 "both pods' claims")
    cluster.patch_spec("vols", {"replicas": 1})
    cluster.wait(lambda: len(cluster.pods("vols")) == 1, "scale-down to one pod")
    cluster.wait(lambda: [p["metadata"]["name"] for p in cluster.emu.list(
        "v1", "persistentvolumeclaims", NAMESPACE)] == ["umbp-ssd-vols-0"],
        "the removed pod's claim deleted")
    cluster.delete_cr("vols")
    cluster.wait(lambda: cluster.cr("vols") is None, "the CR to be deleted")
    assert len(cluster.emu.list("v1", "persistentvolumeclaims", NAMESPACE)) == 1


def test_children_no_longer_planned_are_pruned(cluster: Cluster, operator: Any) -> None:
    """A child this CR owns but no longer plans (left by an older plan) is deleted; an object
    with the same labels that the CR does not own is left alone."""
    cr = example(EXAMPLES[-1], "prune")
    cluster.apply(cr)
    cluster.wait_children(cr)
    owner = cluster.cr("prune")
    assert owner is not None
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": "prune",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    labels = {"app.kubernetes.io/name": "sglang-hicache", "app.kubernetes.io/instance": "prune"}
    cluster.emu.create("v1", "configmaps", {"metadata": {
        "name": "prune-stale", "namespace": NAMESPACE, "labels": labels,
        "ownerReferences": [ref]}})
    cluster.emu.create("v1", "configmaps", {"metadata": {
        "name": "prune-foreign", "namespace": NAMESPACE, "labels": labels}})
    cluster.wait(lambda: cluster.child(("v1", "configmaps"), "prune-stale") is None,
                 "the stale owned ConfigMap to be pruned")
    cluster.wait_settled(RESYNC_S)
    assert cluster.child(("v1", "configmaps"), "prune-foreign") is not None


def _storage_class(cluster: Cluster, name: str, expandable: bool) -> None:
    cluster.emu.create("storage.k8s.io/v1", "storageclasses", {
        "metadata": {"name": name}, "provisioner": "local.csi.example",
        **({"allowVolumeExpansion": True} if expandable else {})})


def _claim_sizes(cluster: Cluster, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["resources"]["requests"]["storage"]
            for p in cluster.emu.list("v1", "persistentvolumeclaims", NAMESPACE,
                                      f"app.kubernetes.io/instance={name}")}


def test_growing_the_ssd_claim_expands_the_claims_and_recreates_the_statefulset(
        cluster: Cluster, operator: Any) -> None:
    """A bigger SSD claim on an expandable StorageClass: the existing claims are patched to the
    new size (the StatefulSet controller never resizes them) and the StatefulSet, whose
    volumeClaimTemplates the API server refuses to update, is deleted orphaning its pods and
    created anew; the running pod is adopted, its PVC kept."""
    _storage_class(cluster, "local-nvme", expandable=True)
    cr = example(EXAMPLES[0], "grow")  # deepseek-r1: SSD on a per-pod PVC (local-nvme)
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    old_uid = live[("StatefulSet", "grow")]["metadata"]["uid"]
    pod = cluster.wait(lambda: cluster.pods("grow"), "the pod")[0]
    claims = cluster.wait(lambda: _claim_sizes(cluster, "grow"), "the SSD claim")
    assert set(claims.values()) == {"3500Gi"}
    writes_before = cluster.writes()
    cr["spec"]["l3"]["ssd"]["volume"]["claimTemplate"]["size"] = "3700Gi"
    cluster.patch_spec("grow", {"l3": {"ssd": {"volume": {"claimTemplate": {
        "size": "3700Gi"}}}}})
    live = cluster.wait_children(cr)
    sts = live[("StatefulSet", "grow")]
    assert sts["metadata"]["uid"] != old_uid
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"][
        "storage"] == "3700Gi"
    assert _claim_sizes(cluster, "grow") == dict.fromkeys(claims, "3700Gi")
    cluster.wait(lambda: [p for p in cluster.pods("grow") if p["metadata"]["ownerReferences"][0][
        "uid"] == sts["metadata"]["uid"]], "the new StatefulSet to adopt the pod")
    adopted = cluster.pods("grow")[0]
    assert adopted["metadata"]["uid"] == pod["metadata"]["uid"]  # the same pod kept running
    cluster.wait(lambda: [e for e in cluster.events("grow") if "recreated" in e["message"]
                          and "expanded PersistentVolumeClaim" in e["message"]],
                 "an Applied event saying the claims grew and the StatefulSet was recreated")
    pvc_patches = [r for r in cluster.emu.writes()[writes_before:]
                   if r.plural == "persistentvolumeclaims"]
    assert [r.code for r in pvc_patches] == [200] * len(claims)  # once per claim


def test_growing_the_ssd_claim_on_a_fixed_storage_class_is_refused_and_nothing_changes(
        cluster: Cluster, operator: Any) -> None:
    """StorageClass without allowVolumeExpansion: the change is refused as a whole
    (SpecValid=False, VolumeExpansionRefused, naming the claim and the class); the StatefulSet
    and the claims stay as they were; no write repeats; reverting the size clears it."""
    _storage_class(cluster, "local-nvme", expandable=False)
    cr = example(EXAMPLES[0], "fixed")
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    sts_uid = live[("StatefulSet", "fixed")]["metadata"]["uid"]
    claims = cluster.wait(lambda: _claim_sizes(cluster, "fixed"), "the SSD claim")
    cluster.patch_spec("fixed", {"replicas": 1, "l3": {"ssd": {"volume": {"claimTemplate": {
        "size": "3700Gi"}}}}})
    cond = cluster.wait_condition("fixed", "SpecValid", "False", "VolumeExpansionRefused")
    assert "spec.l3.ssd.volume.claimTemplate.size" in cond["message"]
    assert "local-nvme does not allow volume expansion" in cond["message"]
    assert all(c in cond["message"] for c in claims)
    cluster.wait(lambda: [e for e in cluster.events("fixed")
                          if e["reason"] == "VolumeExpansionRefused"], "a refusal Event")
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(3 * RESYNC_S) == []  # refused once, not retried in a loop
    sts = cluster.child(("apps/v1", "statefulsets"), "fixed")
    assert sts is not None and sts["metadata"]["uid"] == sts_uid
    assert _claim_sizes(cluster, "fixed") == claims
    cluster.patch_spec("fixed", {"l3": {"ssd": {"volume": {"claimTemplate": {
        "size": "3500Gi"}}}}})
    cluster.wait_condition("fixed", "SpecValid", "True", "Planned")


def test_ssd_volumes_go_with_the_cr_when_it_asks_and_foreign_objects_stay(
        cluster: Cluster, operator: Any) -> None:
    """``claimTemplate.deleteWithResource``: the CR's SSD claims are deleted with it. A pod and
    a PVC of another tool that share only the instance label (a Helm release of the same name)
    are neither counted in the CR's status nor deleted with it."""
    cr = example(EXAMPLES[0], "gone")  # deepseek-r1: SSD on a per-pod PVC, one replica
    cr["spec"]["l3"]["ssd"]["volume"]["claimTemplate"]["deleteWithResource"] = True
    foreign = {"app.kubernetes.io/instance": "gone", "app.kubernetes.io/component": "cache",
               "app.kubernetes.io/managed-by": "Helm"}
    cluster.emu.create("v1", "persistentvolumeclaims", {
        "metadata": {"name": "data-gone-postgres-0", "namespace": NAMESPACE, "labels": foreign},
        "spec": {"resources": {"requests": {"storage": "1Gi"}}}})
    cluster.emu.create("v1", "pods", {
        "metadata": {"name": "gone-postgres-0", "namespace": NAMESPACE, "labels": foreign},
        "spec": {"containers": [{"name": "db", "image": "postgres"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    cluster.apply(cr)
    cluster.wait_children(cr)
    ours = cluster.wait(lambda: [p for p in cluster.emu.list(
        "v1", "persistentvolumeclaims", NAMESPACE) if p["metadata"]["name"] != "data-gone-"
        "postgres-0"], "the CR's SSD claim")
    cluster.mark_pods_ready("gone", 1)
    cluster.wait_condition("gone", "Ready", "True", "AllReplicasReady")
    status = (cluster.cr("gone") or {})["status"]
    assert (status["readyReplicas"], status["phase"]) == (1, "Ready")
    cluster.delete_cr("gone")
    cluster.wait(lambda: cluster.cr("gone") is None and not cluster.children("gone"),
                 "the CR and its children to be gone")
    cluster.wait(lambda: not any(cluster.emu.find("v1", "persistentvolumeclaims", NAMESPACE,
                                                  p["metadata"]["name"]) for p in ours),
                 "the CR's SSD claims to be deleted")
    assert cluster.emu.find("v1", "persistentvolumeclaims", NAMESPACE,
                            "data-gone-postgres-0") is not None
    assert cluster.emu.find("v1", "pods", NAMESPACE, "gone-postgres-0") is not None
