"""The controller's pure parts: idempotent apply patches and status computation (unit tier).

Real code only; inputs are plain dicts shaped like API objects.
"""

from __future__ import annotations

import json
from typing import Any

from hicache_operator.controller import diff, status


def _sts(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "s", "labels": {"a": "b"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "engine", "image": "x"}]}}, **spec}}


def test_live_object_with_server_defaults_needs_no_patch() -> None:
    desired = diff.with_last_applied(_sts())
    live = json.loads(json.dumps(desired))
    live["metadata"].update(uid="u", resourceVersion="7", creationTimestamp="t")
    live["spec"]["podManagementPolicy"] = "OrderedReady"  # server default
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/x"
    live["status"] = {"replicas": 1}
    assert diff.apply_patch(desired, live) is None


def test_drift_is_patched_back_and_foreign_fields_are_kept() -> None:
    desired = diff.with_last_applied(_sts())
    live = json.loads(json.dumps(desired))
    live["spec"]["replicas"] = 5
    live["metadata"]["annotations"]["someone/else"] = "x"
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "rogue"
    patch = diff.apply_patch(desired, live)
    assert patch == {"spec": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "engine", "image": "x"}]}}}}


def test_fields_no_longer_rendered_are_removed_three_way() -> None:
    before = diff.with_last_applied(_sts(minReadySeconds=10))
    live = json.loads(json.dumps(before))
    live["spec"]["serviceName"] = "set-by-someone-else"
    after = diff.with_last_applied(_sts())
    patch = diff.apply_patch(after, live)
    assert patch is not None
    assert patch["spec"] == {"minReadySeconds": None}  # ours: removed; theirs: untouched
    assert patch["metadata"]["annotations"][diff.LAST_APPLIED] == after["metadata"][
        "annotations"][diff.LAST_APPLIED]


def test_covers_compares_numbers_and_bools_strictly_enough() -> None:
    assert diff.covers({"a": 1.0}, {"a": 1})
    assert not diff.covers({"a": 1}, {"a": True})
    assert not diff.covers({"l": [1, 2]}, {"l": [1]})


def _pod(name: str, **pod_status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": pod_status}


READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
STS = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "updatedReplicas": 2,
                                                 "currentRevision": "r", "updateRevision": "r"}}


def _conds(st: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}


def test_ready_when_every_pod_is_ready_on_the_current_revision() -> None:
    outcome = status.Outcome(replicas=2, status_plan={"gpusPerPod": 8})
    ready = status.compute_status(generation=3, outcome=outcome, observed=status.Observed(
        STS, [_pod("a", **READY), _pod("b", **READY)]))
    assert ready["phase"] == "Ready" and ready["readyReplicas"] == 2
    assert ready["observedGeneration"] == 3 and ready["plan"] == {"gpusPerPod": 8}
    assert _conds(ready)["Ready"] == ("True", "AllReplicasReady")
    assert _conds(ready)["Progressing"] == ("False", "Available")
    # Recomputing an unchanged world gives an identical status (timestamps carried over).
    again = status.compute_status(generation=3, outcome=outcome, observed=status.Observed(
        STS, [_pod("a", **READY), _pod("b", **READY)]), previous=ready)
    assert status.same_status(ready, again)


def test_degraded_reasons_by_severity_and_scheduler_messages_quoted() -> None:
    outcome = status.Outcome(replicas=2)
    pods = [
        _pod("a", phase="Pending", conditions=[{
            "type": "PodScheduled", "status": "False",
            "message": "0/3 nodes are available: 3 Insufficient hugepages-1Gi."}]),
        _pod("b", phase="Failed", reason="TopologyAffinityError", message="NUMA says no"),
    ]
    st = status.compute_status(generation=1, outcome=outcome,
                               observed=status.Observed(STS, pods))
    degraded = status.condition(st, "Degraded")
    assert degraded["reason"] == "TopologyAffinityError"
    assert degraded["message"] == "pod b: NUMA says no (and 1 more)"
    assert st["phase"] == "Degraded" and _conds(st)["Progressing"] == ("False", "Stalled")
    issues = status.pod_issues(status.Observed(STS, pods[:1]))
    assert [(i.reason, i.message) for i in issues] == [
        ("HugepagesUnavailable", "0/3 nodes are available: 3 Insufficient hugepages-1Gi.")]


def test_pending_pvc_gpus_image_pull_and_crash_loop() -> None:
    waiting = {"phase": "Pending", "containerStatuses": [
        {"name": "engine", "restartCount": 0, "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "no such image"}}}]}
    crash = {"phase": "Running", "containerStatuses": [
        {"name": "engine", "restartCount": 4, "state": {"waiting": {
            "reason": "CrashLoopBackOff", "message": "back-off"}}}]}
    gpu = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                               "message": "Insufficient amd.com/gpu"}]}
    pvc = [{"metadata": {"name": "ssd-s-0"}, "status": {"phase": "Pending"}}]
    observed = status.Observed(STS, [_pod("a", **waiting), _pod("b", **crash),
                                     _pod("c", **gpu)], pvc)
    reasons = [i.reason for i in status.pod_issues(observed)]
    assert reasons == ["GpusUnavailable", "SsdVolumePending", "ImagePullError",
                       "CrashLoopBackOff"]


def test_kubelet_admission_rejections_name_the_missing_resource() -> None:
    """A pod the kubelet refuses at admission (``Failed``, reason ``OutOf<resource>``) is
    reported as the resource it lacks; other failures stay ``PodFailed``."""
    failed = [
        _pod("a", phase="Failed", reason="OutOfhugepages-2Mi",
             message="Node didn't have enough resource: hugepages-2Mi, requested: 1073741824"),
        _pod("b", phase="Failed", reason="OutOfamd.com/gpu", message="no GPUs left"),
        _pod("c", phase="Failed", reason="OutOfcpu", message="no CPUs left"),
        _pod("d", phase="Failed", reason="Evicted", message="disk pressure"),
    ]
    issues = status.pod_issues(status.Observed(STS, failed))
    assert [(i.reason, i.pod) for i in issues] == [
        ("HugepagesUnavailable", "a"), ("GpusUnavailable", "b"), ("PodFailed", "c"),
        ("PodFailed", "d")]
    assert issues[0].message.startswith("Node didn't have enough resource: hugepages-2Mi")


def test_invalid_spec_keeps_the_last_plan_and_lists_problems() -> None:
    previous = {"plan": {"gpusPerPod": 8}}
    outcome = status.Outcome(replicas=1, problems=[("spec.a", "bad"), ("spec.b", "worse")])
    st = status.compute_status(generation=2, outcome=outcome, observed=status.Observed(),
                               previous=previous)
    assert st["phase"] == "Invalid" and st["plan"] == {"gpusPerPod": 8}
    spec_valid = status.condition(st, "SpecValid")
    assert spec_valid["status"] == "False" and spec_valid["reason"] == "InvalidSpec"
    assert spec_valid["message"] == "spec.a: bad; spec.b: worse"


def test_only_immutable_statefulset_changes_need_a_recreate() -> None:
    from hicache_operator.controller.apply import needs_recreate

    assert needs_recreate("StatefulSet", {"spec": {"replicas": 2, "template": {}}}) == []
    assert needs_recreate("StatefulSet", {"spec": {"volumeClaimTemplates": [],
                                                   "selector": {}}}) == [
        "selector", "volumeClaimTemplates"]
    assert needs_recreate("ConfigMap", {"spec": {"selector": {}}}) == []


def test_permissions_cover_every_call_the_api_module_makes() -> None:
    """The RBAC table (the chart derives its ClusterRole from it) covers the kinds and verbs the
    reconciler uses: list/get/create/patch/delete on children, patch on the CR status."""
    from hicache_operator.controller import kube

    granted = {(group, resource): set(verbs) for group, resource, verbs in kube.PERMISSIONS}
    for api_version, kind in kube.CHILD_KINDS:
        group = api_version.rpartition("/")[0]
        plural = kube.PLURALS[(api_version, kind)]
        assert {"get", "list", "create", "patch", "delete"} <= granted[(group, plural)]
    assert "patch" in granted[("hicache.sglang.ai", "sglanghicaches/status")]
    assert {"list", "watch"} <= granted[("", "pods")]
    assert "create" in granted[("", "events")]
    assert all("*" not in verbs for verbs in granted.values())
    assert kube.resource_path("apps/v1", "StatefulSet", "ns", "s", "status") == \
        "/apis/apps/v1/namespaces/ns/statefulsets/s/status"
    assert kube.resource_path("v1", "Pod", "ns") == "/api/v1/namespaces/ns/pods"


def test_default_peering_priority_differs_per_replica() -> None:
    """kopf pauses every peer when two share a priority: replicas must not default to one."""
    from hicache_operator.controller.main import default_priority

    a = default_priority("sglang-hicache-operator-7d9f8b6c5-abcde")
    b = default_priority("sglang-hicache-operator-7d9f8b6c5-fghij")
    assert a != b
    assert 1 <= a <= 10000 and 1 <= b <= 10000
    assert default_priority("sglang-hicache-operator-7d9f8b6c5-abcde") == a


def test_every_condition_reason_is_documented() -> None:
    """docs/operations.md explains every reason the controller can write."""
    from pathlib import Path

    from hicache_operator.controller.status import REASONS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    missing = [r for reasons in REASONS.values() for r in reasons if f"`{r}`" not in doc]
    assert not missing, f"docs/operations.md does not explain: {missing}"
