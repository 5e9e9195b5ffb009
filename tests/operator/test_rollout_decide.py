"""The in-place rollout decision (``controller/rollout.py``), step by step on plain objects.

Real: the planner's StatefulSet for a standalone CPU example with updateStrategy
InPlaceIfPossible, and the pure decision. The pods are written here the way the StatefulSet
controller and a kubelet leave them (template labels and annotations, the revision label,
container statuses), so each case states exactly what the cluster shows.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch
import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.builders.context import CONFIG_HASH_ANNOTATION, POD_HASH_ANNOTATION
from hicache_operator.controller.rollout import (
    IN_PLACE_ANNOTATION,
    REVISION_LABEL,
    Decision,
    decide,
    target_of,
)
from hicache_operator.plan import plan
from shc_testlib import load_example

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0
OLD, NEW = "shc-old", "shc-new"


def _sts(image: str = "engine:1", replicas: int = 3, **spec: Any) -> dict[str, Any]:
    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["spec"].update(replicas=replicas, image=image,
                      updateStrategy={"type": "InPlaceIfPossible"}, **spec)
    cr["spec"]["l3"]["image"] = "engine:1"
    return next(o for o in plan(cr, OperatorConfig()).objects if o["kind"] == "StatefulSet")


def _pod(sts: dict[str, Any], ordinal: int, revision: str, *, ready: bool = True,
         container_id: str = "c-1", restarts: int = 0,
         waiting: str | None = None) -> dict[str, Any]:
    template = sts["spec"]["template"]
    engine: dict[str, Any] = {"name": "engine", "containerID": container_id, "ready": ready,
                              "restartCount": restarts,
                              "state": {"waiting": {"reason": waiting, "message": "m"}}
                              if waiting else {"running": {"startedAt": "2027-01-15T08:00:00Z"}}}
    return {"metadata": {"name": f"tiny-llama-sa-{ordinal}", "uid": f"uid-{ordinal}",
                         "labels": {**template["metadata"]["labels"], REVISION_LABEL: revision},
                         "annotations": dict(template["metadata"]["annotations"])},
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Running", "containerStatuses": [engine],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _live(sts: dict[str, Any], update: str, current: str) -> dict[str, Any]:
    live = copy.deepcopy(sts)
    live["metadata"]["generation"] = 2
    live["status"] = {"observedGeneration": 2, "updateRevision": update,
                      "currentRevision": current}
    return live


def _decide(new: dict[str, Any], live: dict[str, Any] | None, pods: list[dict[str, Any]], *,
            partition: int = 0, max_unavailable: int | str | None = None,
            configs: frozenset[str] = frozenset(), previous: dict[str, Any] | None = None,
            now: float = NOW) -> Decision:
    def serving(pod: Mapping[str, Any]) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in pod["status"]["conditions"])

    return decide(target_of(new, partition, max_unavailable), live, pods, serving=serving,
                  live_configs=configs, previous=previous, now=now, restart_timeout_s=300)


def _applied(pod: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The pod after the decision's patch for it (RFC 6902, ``test`` ops checked)."""
    ops = next(p.ops for p in decision.patches if p.pod == pod["metadata"]["name"])
    return dict(jsonpatch.apply_patch(pod, ops))


def test_the_new_template_waits_for_the_statefulset_controller_to_name_its_revision() -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    pods = [_pod(old, i, OLD) for i in range(3)]
    d = _decide(new, _live(old, OLD, OLD), pods)  # the live StatefulSet has the old template
    assert d.update_strategy == {"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}
    assert d.patches == () and d.status is not None and d.status["method"] == "InPlace"
    assert "revision" not in d.status and d.status["reason"] == \
        "engine image engine:1 -> engine:2"


def test_pods_are_updated_in_place_highest_ordinal_first_one_at_a_time() -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    pods = [_pod(old, i, OLD) for i in range(3)]
    d = _decide(new, _live(new, NEW, OLD), pods)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-2"]
    patched = _applied(pods[2], d)
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
    restarting = _applied(pods[2], d)
    restarting["status"]["conditions"][0]["status"] = "False"
    assert _decide(new, _live(new, NEW, OLD), [*pods[:2], restarting]).patches == ()
    # ... a new container that is not ready yet is not done either ...
    restarting["status"]["containerStatuses"][0]["containerID"] = "c-2"
    assert _decide(new, _live(new, NEW, OLD), [*pods[:2], restarting]).patches == ()
    # ... and once it serves, the next pod goes.
    restarting["status"]["conditions"][0]["status"] = "True"
    d = _decide(new, _live(new, NEW, OLD), [*pods[:2], restarting])
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-1"]


def test_max_unavailable_and_partition_are_honoured() -> None:
    old, new = _sts("engine:1", replicas=4), _sts("engine:2", replicas=4)
    pods = [_pod(old, i, OLD) for i in range(4)]
    d = _decide(new, _live(new, NEW, OLD), pods, max_unavailable=2)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-3", "tiny-llama-sa-2"]
    d = _decide(new, _live(new, NEW, OLD), pods, max_unavailable="50%", partition=3)
    assert [p.pod for p in d.patches] == ["tiny-llama-sa-3"]
    # A pod that is unavailable anyway (here: not ready) uses up the budget of ready ones.
    pods[0]["status"]["conditions"][0]["status"] = "False"
    assert _decide(new, _live(new, NEW, OLD), pods).patches[0].pod == "tiny-llama-sa-0"


@pytest.mark.parametrize(("waiting", "why"), [
    ("ImagePullBackOff", "ImagePullBackOff"), ("CrashLoopBackOff", "CrashLoopBackOff")])
def test_a_failed_restart_stops_the_rollout_and_names_the_pod(waiting: str, why: str) -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    pods = [_pod(old, i, OLD) for i in range(3)]
    failed = _applied(pods[2], _decide(new, _live(new, NEW, OLD), pods))
    failed["status"] = _pod(new, 2, NEW, ready=False, container_id="c-9", restarts=2,
                            waiting=waiting)["status"]
    d = _decide(new, _live(new, NEW, OLD), [*pods[:2], failed], max_unavailable=3)
    assert d.patches == () and d.failure is not None
    assert d.failure.pod == "tiny-llama-sa-2" and why in d.failure.message
    assert d.status is not None and d.status["failedPod"] == "tiny-llama-sa-2"


def test_an_engine_that_never_restarts_fails_after_the_timeout() -> None:
    old, new = _sts("engine:1"), _sts("engine:1", engine={
        **load_example("cpu/tiny-llama-standalone.yaml")["spec"]["engine"], "pageSize": 32})
    pods = [_pod(old, i, OLD) for i in range(3)]
    first = _decide(new, _live(new, NEW, OLD), pods)
    assert first.status is not None and "engine configuration" in first.status["reason"]
    stuck = _applied(pods[2], first)
    stuck["status"]["conditions"][0]["status"] = "False"
    assert _decide(new, _live(new, NEW, OLD), [*pods[:2], stuck], now=NOW + 299).failure is None
    late = _decide(new, _live(new, NEW, OLD), [*pods[:2], stuck], now=NOW + 301)
    assert late.failure is not None and "not restarted within 300 s" in late.failure.message


def test_a_change_that_cannot_be_done_in_place_lets_the_statefulset_replace_pods() -> None:
    old = _sts("engine:1")
    new = _sts("engine:1", resources={"cpu": 4, "memory": "12Gi", "shmSize": "1Gi"})
    assert old["spec"]["template"]["metadata"]["annotations"][POD_HASH_ANNOTATION] != \
        new["spec"]["template"]["metadata"]["annotations"][POD_HASH_ANNOTATION]
    pods = [_pod(old, i, OLD) for i in range(3)]
    before = _decide(new, _live(old, OLD, OLD), pods, partition=1, max_unavailable=2)
    assert before.update_strategy == {"type": "RollingUpdate",
                                      "rollingUpdate": {"partition": 1, "maxUnavailable": 2}}
    assert before.patches == () and before.status is not None
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


def test_a_serving_check_holds_the_next_pod_until_the_restarted_one_is_back() -> None:
    """The extension point for a router's worker set: a Ready pod that a check does not list
    yet is not done, so the next pod waits; the checks are asked only while a rollout runs."""
    import asyncio

    from hicache_operator.controller import inplace

    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["metadata"]["namespace"] = "ns"
    cr["spec"].update(replicas=3, image="engine:2", updateStrategy={"type": "InPlaceIfPossible"})
    cr["spec"]["l3"]["image"] = "engine:1"
    planned = plan(cr, OperatorConfig())
    new = next(o for o in planned.objects if o["kind"] == "StatefulSet")
    old = _sts("engine:1")
    restarted = _pod(new, 2, NEW, container_id="c-2")
    restarted["metadata"]["annotations"][IN_PLACE_ANNOTATION] = json.dumps(
        {"revision": NEW, "containerID": "c-1", "requestedAt": "2027-01-15T08:00:00Z"})
    pods = [_pod(old, 0, OLD), _pod(old, 1, OLD), restarted]
    asked: list[list[str]] = []
    workers = {"tiny-llama-sa-0", "tiny-llama-sa-1"}

    class Router:
        async def __call__(self, cr: Mapping[str, Any],
                           pods: Sequence[Mapping[str, Any]]) -> set[str]:
            asked.append(sorted(p["metadata"]["name"] for p in pods))
            return workers

    router = Router()

    def run(pods: list[dict[str, Any]]) -> Decision | None:
        desired = {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o
                   for o in planned.objects}
        live = {(new["apiVersion"], "StatefulSet", new["metadata"]["name"]):
                _live(new, NEW, OLD)}
        return asyncio.run(inplace.decide(planned, cr, desired, live, pods, [router], 300,
                                          clock=lambda: NOW))

    held = run(pods)
    assert held is not None and held.patches == () and held.status is not None
    assert held.status["restarting"] == ["tiny-llama-sa-2"]
    workers.add("tiny-llama-sa-2")  # the router routes to it again
    moved = run(pods)
    assert moved is not None and [p.pod for p in moved.patches] == ["tiny-llama-sa-1"]
    asked.clear()
    done = [_pod(new, i, NEW) for i in range(3)]
    assert run(done) is not None and asked == []  # no rollout: the router is not asked
