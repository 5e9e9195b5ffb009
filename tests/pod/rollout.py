"""An in-place rollout of a running pod-tier pod, decided by the operator's own code.

The pod is rendered as the API server would show it (labels with the StatefulSet's revision,
annotations, spec, the engine's container status); ``controller.rollout.decide`` is asked what to
do for the new plan, exactly as the operator asks it; its JSON patch is applied to that object
(RFC 6902, ``test`` ops checked), the ConfigMap gets the new configuration revision beside the
old one (what the operator's ConfigMap holds during a rollout), and the kubelet imitation is told
about the updated pod (``Pod.update``): a changed image restarts that container, changed
annotations rewrite the downward API files (the launcher's watcher restarts the engine on a new
configuration revision). The operator's readiness gate is stepped through as the operator does
it (condition False, the kubelet's Ready False, then the patch); nothing routes to the single
pod here, so the gate changes no traffic.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from .harness import PlannedPod
from .runtime import Pod

OLD_REVISION, NEW_REVISION = "engine-rev-1", "engine-rev-2"


def api_pod(pod: Pod, revision: str) -> dict[str, Any]:
    """The pod as ``kubectl get pod -o json`` would show it, for the operator's decision."""
    from hicache_operator.builders.context import IN_PLACE_READY_GATE

    engine = pod.container("engine")
    status = {"name": "engine", "ready": engine.ready, "restartCount": engine.restarts,
              "containerID": f"pod-tier://{pod.meta.name}/engine/{engine.generation}",
              "state": {"running": {}} if engine.proc is not None else {"waiting": {}}}
    return {"metadata": {"name": pod.meta.name, "uid": pod.meta.uid,
                         "labels": {**pod.meta.labels, "controller-revision-hash": revision},
                         "annotations": dict(pod.meta.annotations)},
            "spec": copy.deepcopy(pod.spec),
            "status": {"phase": "Running", "containerStatuses": [status], "conditions": [
                {"type": "ContainersReady", "status": "True" if engine.ready else "False"},
                # the operator opened the pod's readiness gate when the pod was made
                {"type": IN_PLACE_READY_GATE, "status": "True",
                 "lastTransitionTime": "2027-01-15T08:00:00Z"},
                {"type": "Ready", "status": "True" if engine.ready else "False"}]}}


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``test``, ``add`` and ``replace`` (what the operator's pod patches use)."""
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, leaf = _pointer(op["path"])
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        index: Any = int(leaf) if isinstance(node, list) else leaf
        if op["op"] == "test":
            if node[index] != op["value"]:
                raise AssertionError(f"test failed at {op['path']}: {node[index]!r}")
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and (index not in node if isinstance(node, dict) else
                                          index >= len(node)):
                raise AssertionError(f"replace of a missing {op['path']}")
            node[index] = copy.deepcopy(op["value"])
        else:
            raise NotImplementedError(op["op"])
    return out


def roll_in_place(pod: Pod, old: PlannedPod, new: PlannedPod) -> dict[str, Any]:
    """Update ``pod`` from ``old``'s plan to ``new``'s as the operator does; returns the
    operator's rollout status for it."""
    from hicache_operator.controller.rollout import decide, target_of

    sts = new.statefulset
    live = {**copy.deepcopy(sts), "metadata": {**sts["metadata"], "generation": 2},
            "status": {"observedGeneration": 2, "updateRevision": NEW_REVISION,
                       "currentRevision": OLD_REVISION}}
    before = api_pod(pod, OLD_REVISION)
    # First the operator takes the pod out of rotation (its readiness gate; the kubelet then
    # reports it not Ready), then, the drain grace over (0 here), it patches the engine.
    closing = decide(target_of(sts, 0, None), live, [before], serving=lambda p: True,
                     live_configs=frozenset(), previous=None, now=time.time(),
                     restart_timeout_s=300)
    assert [(g.pod, g.ready) for g in closing.gates] == [(pod.meta.name, False)], closing
    before = json_patch(before, closing.gates[0].ops)
    before["status"]["conditions"] = [
        {**c, "status": "False"} if c["type"] == "Ready" else c
        for c in before["status"]["conditions"]]
    decision = decide(target_of(sts, 0, None), live, [before], serving=lambda p: False,
                      live_configs=frozenset(), previous=None, now=time.time(),
                      restart_timeout_s=300)
    assert [p.pod for p in decision.patches] == [pod.meta.name], decision
    after = json_patch(before, decision.patches[0].ops)
    for name, data in new.configmaps.items():  # the old revision stays while pods run it
        pod.configmaps[name] = {**old.configmaps.get(name, {}), **data}
    pod.update(labels=after["metadata"]["labels"], annotations=after["metadata"]["annotations"],
               spec=after["spec"])
    assert decision.status is not None
    return decision.status
