"""The in-place rollout decision (``controller/rollout.py``), step by step on plain objects.

Real: the planner's StatefulSet for a standalone CPU example with updateStrategy
InPlaceIfPossible, and the pure decision. The pods are written here the way the StatefulSet
controller and a kubelet leave them (template labels and annotations, the revision label,
container statuses, the readiness gate's condition and Ready computed from the containers and
the gates, as the kubelet does: ``_kubelet``), so each case states exactly what the cluster
shows. Writes the decision asks for are applied with a real RFC 6902 implementation
(``jsonpatch``), ``test`` ops checked.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch
import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.builders.context import (
    CONFIG_HASH_ANNOTATION,
    IN_PLACE_READY_GATE,
    POD_HASH_ANNOTATION,
)
from hicache_operator.controller.rollout import (
    IN_PLACE_ANNOTATION,
    REVISION_LABEL,
    Decision,
    Pacing,
    decide,
    target_of,
)
from hicache_operator.plan import plan
from shc_testlib import load_example

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0
OLD, NEW = "shc-old", "shc-new"
Obj = dict[str, Any]


def _sts(image: str = "engine:1", replicas: int = 3, **spec: Any) -> Obj:
    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["spec"].update(replicas=replicas, image=image,
                      updateStrategy={"type": "InPlaceIfPossible"}, **spec)
    cr["spec"]["l3"]["image"] = "engine:1"
    return next(o for o in plan(cr, OperatorConfig()).objects if o["kind"] == "StatefulSet")


def _kubelet(pod: Obj) -> Obj:
    """Ready as the kubelet computes it: containers ready AND every readiness gate True."""
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
    ok = conditions["ContainersReady"]["status"] == "True" and all(
        (conditions.get(g) or {}).get("status") == "True" for g in gates)
    conditions["Ready"] = {"type": "Ready", "status": "True" if ok else "False"}
    pod["status"]["conditions"] = list(conditions.values())
    return pod


def _pod(sts: Obj, ordinal: int, revision: str, *, ready: bool = True,
         container_id: str = "c-1", restarts: int = 0, waiting: str | None = None,
         gate: str | None = "True", node: str = "node-a") -> Obj:
    template = sts["spec"]["template"]
    engine: Obj = {"name": "engine", "containerID": container_id, "ready": ready,
                   "restartCount": restarts,
                   "state": {"waiting": {"reason": waiting, "message": "m"}}
                   if waiting else {"running": {"startedAt": "2027-01-15T08:00:00Z"}}}
    conditions = [{"type": "ContainersReady", "status": "True" if ready else "False"}]
    if gate is not None:
        conditions.append({"type": IN_PLACE_READY_GATE, "status": gate,
                           "lastTransitionTime": "2027-01-15T08:00:00Z"})
    return _kubelet({
        "metadata": {"name": f"tiny-llama-sa-{ordinal}", "uid": f"uid-{ordinal}",
                     "labels": {**template["metadata"]["labels"], REVISION_LABEL: revision},
                     "annotations": dict(template["metadata"]["annotations"])},
        "spec": {**copy.deepcopy(template["spec"]), "nodeName": node},
        "status": {"phase": "Running", "containerStatuses": [engine],
                   "conditions": conditions}})


def _live(sts: Obj, update: str, current: str) -> Obj:
    live = copy.deepcopy(sts)
    live["metadata"]["generation"] = 2
    live["status"] = {"observedGeneration": 2, "updateRevision": update,
                      "currentRevision": current}
    return live


def _serving(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"]["conditions"])


def _decide(new: Obj, live: Obj | None, pods: list[Obj], *, partition: int = 0,
            max_unavailable: int | str | None = None, configs: frozenset[str] = frozenset(),
            previous: Obj | None = None, now: float = NOW, restart_timeout_s: float | None = 300,
            **kw: Any) -> Decision:
    return decide(target_of(new, partition, max_unavailable), live, pods, serving=_serving,
                  live_configs=configs, previous=previous, now=now,
                  restart_timeout_s=restart_timeout_s, **kw)


def _gated(pods: Sequence[Obj], d: Decision) -> list[Obj]:
    """The pods after the decision's readiness-gate writes (and the kubelet's Ready)."""
    out = []
    for pod in pods:
        ops = [g.ops for g in d.gates if g.pod == pod["metadata"]["name"]]
        out.append(_kubelet(dict(jsonpatch.apply_patch(pod, ops[0]))) if ops else pod)
    return out


def _applied(pod: Obj, decision: Decision) -> Obj:
    """The pod after the decision's engine patch for it."""
    ops = next(p.ops for p in decision.patches if p.pod == pod["metadata"]["name"])
    return dict(jsonpatch.apply_patch(pod, ops))


def _to_patch(new: Obj, live: Obj, pods: list[Obj], **kw: Any) -> tuple[Decision, list[Obj]]:
    """Decide, let the gates close (grace 0), decide again: the decision with the patches."""
    first = _decide(new, live, pods, **kw)
    gated = _gated(pods, first)
    return _decide(new, live, gated, **kw), gated


def test_the_new_template_waits_for_the_statefulset_controller_to_name_its_revision() -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    pods = [_pod(old, i, OLD) for i in range(3)]
    d = _decide(new, _live(old, OLD, OLD), pods)  # the live StatefulSet has the old template
    assert d.update_strategy == {"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}
    assert d.patches == () and d.gates == () and d.status is not None
    assert d.status["method"] == "InPlace"
    assert "revision" not in d.status and d.status["reason"] == \
        "engine image engine:1 -> engine:2"


def test_pods_are_updated_in_place_highest_ordinal_first_one_at_a_time() -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    live = _live(new, NEW, OLD)
    pods = [_pod(old, i, OLD) for i in range(3)]
    first = _decide(new, live, pods, pacing=Pacing(drain_grace_s=35))
    # First the pod leaves the rotation (its readiness gate), nothing is patched yet ...
    assert first.patches == () and [(g.pod, g.ready) for g in first.gates] == [
        ("tiny-llama-sa-2", False)]
    assert first.status is not None and first.status["preparing"] == ["tiny-llama-sa-2"]
    gated = _gated(pods, first)
    assert not _serving(gated[2]) and all(_serving(p) for p in gated[:2])
    assert first.recheck_s == 35  # the operator decides again when the grace ends
    # ... and stays out for the grace period before its engine restarts.
    waiting = _decide(new, live, gated, pacing=Pacing(drain_grace_s=35), now=NOW + 34)
    assert waiting.patches == () and waiting.recheck_s == 1
    d = _decide(new, live, gated, pacing=Pacing(drain_grace_s=35), now=NOW + 35)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-2"] and d.gates == ()
    patched = _applied(gated[2], d)
    assert patched["spec"]["containers"][0]["image"] == "engine:2"
    assert patched["metadata"]["labels"][REVISION_LABEL] == NEW
    assert patched["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == \
        new["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    state = json.loads(patched["metadata"]["annotations"][IN_PLACE_ANNOTATION])
    assert state["containerID"] == "c-1" and state["revision"] == NEW
    # Only image, labels and annotations changed: what a Pod update may change.
    assert {k: v for k, v in patched["spec"]["containers"][0].items() if k != "image"} == \
        {k: v for k, v in pods[2]["spec"]["containers"][0].items() if k != "image"}
    assert d.status == {"method": "InPlace", "revision": NEW, "image": "engine:2",
                        "configHash": new["spec"]["template"]["metadata"]["annotations"][
                            CONFIG_HASH_ANNOTATION],
                        "reason": "engine image engine:1 -> engine:2", "updatedPods": 1,
                        "pods": 3, "restarting": ["tiny-llama-sa-2"]}
    # While its engine restarts, nothing else starts (maxUnavailable 1) ...
    restarting = copy.deepcopy(patched)
    restarting["status"]["conditions"][0]["status"] = "False"  # ContainersReady
    restarting = _kubelet(restarting)
    held = _decide(new, live, [*gated[:2], restarting])
    assert held.patches == () and held.gates == ()
    # ... a new container that is ready gets its gate opened, and is not done before that ...
    restarting["status"]["containerStatuses"][0]["containerID"] = "c-2"
    restarting["status"]["conditions"][0]["status"] = "True"
    back = _decide(new, live, [*gated[:2], _kubelet(restarting)])
    assert back.patches == () and [(g.pod, g.ready) for g in back.gates] == [
        ("tiny-llama-sa-2", True)]
    # ... and once it serves, the next pod goes.
    serving = _gated([*gated[:2], restarting], back)
    assert _serving(serving[2])
    d = _decide(new, live, serving)
    assert [(g.pod, g.ready) for g in d.gates] == [("tiny-llama-sa-1", False)]


def test_max_unavailable_and_partition_are_honoured() -> None:
    old, new = _sts("engine:1", replicas=4), _sts("engine:2", replicas=4)
    pods = [_pod(old, i, OLD) for i in range(4)]
    d, _ = _to_patch(new, _live(new, NEW, OLD), pods, max_unavailable=2)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-3", "tiny-llama-sa-2"]
    d, _ = _to_patch(new, _live(new, NEW, OLD), pods, max_unavailable="50%", partition=3)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-3"]
    # A pod that is down anyway (not Ready) uses up the budget of ready ones, and may go.
    pods[0] = _pod(old, 0, OLD, ready=False)
    d = _decide(new, _live(new, NEW, OLD), pods)
    assert [g.pod for g in d.gates] == ["tiny-llama-sa-0"]


def test_an_unreadable_router_holds_the_rollout_instead_of_restarting_every_pod() -> None:
    """Issue 25, item 1: 3 Ready pods, maxUnavailable 1 and a router whose worker list cannot
    be read. The old decision took "unknown" for "routes to none of them", counted every pod as
    unavailable anyway and patched all three at once."""
    old, new = _sts("engine:1"), _sts("engine:2")
    live = _live(new, NEW, OLD)
    pods = [_pod(old, i, OLD) for i in range(3)]
    why = "the router's worker list cannot be read (GET /workers failed)"
    held = _decide(new, live, pods, hold=why)
    assert held.patches == () and held.gates == () and held.pulls == ()
    assert held.status is not None and held.status["waiting"] == why
    assert held.progressing is not None and f"waiting: {why}" in held.progressing[1]
    # Even with every pod's gate already closed and its grace over, nothing is patched.
    closed = [_pod(old, i, OLD, gate="False") for i in range(3)]
    assert _decide(new, live, closed, hold=why).patches == ()
    # A router that answers but lists none of the Ready pods: they count as unavailable
    # (they may be serving nobody), so the budget is spent and nothing starts.
    nowhere = decide(target_of(new, 0, None), live, pods, serving=lambda p: False,
                     live_configs=frozenset(), previous=None, now=NOW, restart_timeout_s=300)
    assert nowhere.patches == () and nowhere.gates == ()
    # Readable again: one pod at a time.
    d, _ = _to_patch(new, live, pods)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-2"]


def test_a_pod_without_its_gate_condition_gets_it_and_becomes_ready() -> None:
    """A pod the StatefulSet (re)creates has no condition for the gate: Ready waits for it."""
    sts = _sts("engine:1")
    fresh = _pod(sts, 1, NEW, gate=None)
    assert not _serving(fresh)
    d = _decide(sts, _live(sts, NEW, NEW), [_pod(sts, 0, NEW), fresh])
    assert d.status is None and [(g.pod, g.ready) for g in d.gates] == [("tiny-llama-sa-1", True)]
    assert _serving(_gated([fresh], d)[0])
    # Before the StatefulSet exists the same holds.
    assert [g.pod for g in _decide(sts, None, [fresh]).gates] == ["tiny-llama-sa-1"]
    # A pod with no conditions yet: the patch adds the list, guarded by the pod's
    # resourceVersion (an "add" would replace a list the kubelet wrote meanwhile).
    pending = {**fresh, "metadata": {**fresh["metadata"], "resourceVersion": "41"},
               "status": {"phase": "Pending"}}
    [gate] = _decide(sts, None, [pending]).gates
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": "41"} in gate.ops
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch({**pending, "metadata": {**pending["metadata"],
                                                       "resourceVersion": "42"}}, gate.ops)


def test_the_strategy_makes_pods_recreated_mid_rollout_from_the_new_revision() -> None:
    """Issue 25, item 9. The StatefulSet controller creates a missing ordinal o from
    currentRevision when RollingUpdate has o < partition: with the partition held at replicas
    a pod deleted mid-rollout came back on the old image and was updated again."""
    old, new = _sts("engine:1", replicas=4), _sts("engine:2", replicas=4)
    live = _live(new, NEW, OLD)
    pods = [_pod(old, i, OLD) for i in range(3)] + [_pod(new, 3, NEW)]
    assert _decide(new, live, pods).update_strategy == {"type": "OnDelete"}
    # With a user's partition (a canary) lower pods keep the old template: the partition is
    # the lowest ordinal above which every existing pod is on the new revision.
    assert _decide(new, live, pods, partition=1).update_strategy == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 3}}
    gone = [pods[0], pods[1], pods[3]]  # pod 2 deleted: it may come back new
    assert _decide(new, live, gone, partition=1).update_strategy == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    # Every pod on the new revision: the user's partition lets the controller move
    # currentRevision; once it has, the partition is held again.
    done = [_pod(new, i, NEW) for i in range(4)]
    assert _decide(new, live, done).update_strategy == {"type": "RollingUpdate"}
    assert _decide(new, live, done, partition=1).update_strategy == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    assert _decide(new, _live(new, NEW, NEW), done).update_strategy == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 4}}


@pytest.mark.parametrize(("waiting", "why"), [
    ("ImagePullBackOff", "ImagePullBackOff"), ("CrashLoopBackOff", "CrashLoopBackOff")])
def test_a_failed_restart_stops_the_rollout_and_names_the_pod(waiting: str, why: str) -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    pods = [_pod(old, i, OLD) for i in range(3)]
    d, gated = _to_patch(new, _live(new, NEW, OLD), pods)
    failed = _applied(gated[2], d)
    failed["status"] = _pod(new, 2, NEW, ready=False, container_id="c-9", restarts=2,
                            waiting=waiting, gate="False")["status"]
    d = _decide(new, _live(new, NEW, OLD), [*gated[:2], failed], max_unavailable=3)
    assert d.patches == () and d.gates == () and d.failure is not None
    assert d.failure.pod == "tiny-llama-sa-2" and why in d.failure.message
    assert d.status is not None and d.status["failedPod"] == "tiny-llama-sa-2"


def test_an_engine_that_never_restarts_fails_after_the_timeout() -> None:
    old, new = _sts("engine:1"), _sts("engine:1", engine={
        **load_example("cpu/tiny-llama-standalone.yaml")["spec"]["engine"], "pageSize": 32})
    pods = [_pod(old, i, OLD) for i in range(3)]
    first, gated = _to_patch(new, _live(new, NEW, OLD), pods)
    assert first.status is not None and "engine configuration" in first.status["reason"]
    stuck = _applied(gated[2], first)
    live = _live(new, NEW, OLD)
    assert _decide(new, live, [*gated[:2], stuck], now=NOW + 299).failure is None
    late = _decide(new, live, [*gated[:2], stuck], now=NOW + 301)
    assert late.failure is not None and "not restarted within 300 s" in late.failure.message


def test_the_restart_timeout_defaults_to_the_pods_grace_period_and_a_container_start() -> None:
    """Issue 25, item 8: the kubelet may take the whole grace period to stop the old engine."""
    old, new = _sts("engine:1"), _sts("engine:2")
    grace = new["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pods = [_pod(old, i, OLD) for i in range(3)]
    first, gated = _to_patch(new, _live(new, NEW, OLD), pods, restart_timeout_s=None)
    stuck = _applied(gated[2], first)
    live = _live(new, NEW, OLD)
    slow = _decide(new, live, [*gated[:2], stuck], now=NOW + grace + 119, restart_timeout_s=None)
    assert slow.failure is None
    late = _decide(new, live, [*gated[:2], stuck], now=NOW + grace + 121, restart_timeout_s=None)
    assert late.failure is not None and f"within {grace + 120} s" in late.failure.message


def test_a_change_that_cannot_be_done_in_place_lets_the_statefulset_replace_pods() -> None:
    old = _sts("engine:1")
    new = _sts("engine:1", resources={"cpu": 4, "memory": "12Gi", "shmSize": "1Gi"})
    assert old["spec"]["template"]["metadata"]["annotations"][POD_HASH_ANNOTATION] != \
        new["spec"]["template"]["metadata"]["annotations"][POD_HASH_ANNOTATION]
    pods = [_pod(old, i, OLD) for i in range(3)]
    before = _decide(new, _live(old, OLD, OLD), pods, partition=1, max_unavailable=2)
    assert before.update_strategy == {"type": "RollingUpdate",
                                      "rollingUpdate": {"partition": 1, "maxUnavailable": 2}}
    assert before.patches == () and before.gates == () and before.status is not None
    assert before.status["method"] == "Replace"
    assert "containers[engine].resources" in before.status["reason"]
    # Once applied the reason is carried over from the status (the old template is gone).
    after = _decide(new, _live(new, NEW, OLD), pods, partition=1, max_unavailable=2,
                    previous=before.status)
    assert after.status is not None and after.status["reason"] == before.status["reason"]


def test_configuration_revisions_are_kept_until_the_statefulset_is_done() -> None:
    old, new = _sts("engine:1"), _sts("engine:1", engine={
        **load_example("cpu/tiny-llama-standalone.yaml")["spec"]["engine"], "pageSize": 32})
    old_config = old["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    pods = [_pod(new, i, NEW) for i in range(3)]
    running = _decide(new, _live(new, NEW, OLD), pods, configs=frozenset({old_config, "x"}))
    assert running.keep_configs == {old_config, "x"}  # a pod may still be made from OLD
    done = _decide(new, _live(new, NEW, NEW), pods, configs=frozenset({old_config, "x"}))
    assert done.keep_configs == frozenset() and done.status is None
