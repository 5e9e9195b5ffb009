"""The in-place rollout's time budgets, pulls ahead and kubectl interplay, on plain objects.

Real: the planner on the repository's examples (the DeepSeek-R1 pod: 8 x 200 GiB of host pool,
standalone L3), the env contract the launcher parses, the launcher's own constants, the pure
rollout decision, the pull pod builder and the kubectl helpers. Faked: the pods and the live
StatefulSet, written as the StatefulSet controller and a kubelet leave them
(``test_rollout_decide``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.builders.context import RESTARTED_AT_ANNOTATION
from hicache_operator.builders.prepull import PREPULL_APP_NAME, build_prepull_pod
from hicache_operator.controller import diff, kubectl
from hicache_operator.controller.rollout import Pacing
from hicache_operator.plan import plan
from hicache_operator.planner.pod_overhead import (
    DRAIN_ENDPOINT_DELAY_S,
    in_place_restart_timeout_seconds,
)
from hicache_umbp.contract.revisions import CONFIG_KEY_PREFIX
from hicache_umbp.contract.settings import BY_KEY
from hicache_umbp.drain import L3_CATCH_UP_TIMEOUT_S
from hicache_umbp.launch.revision import STOP_DRAIN_TIMEOUT_S
from shc_testlib import load_example
from test_rollout_decide import NEW, OLD, _decide, _gated, _live, _pod, _sts

Obj = dict[str, Any]
STOP_GRACE_ENV = BY_KEY["engine_stop_grace_s"].env


def _in_place(example: str) -> tuple[Obj, Obj]:
    """(the StatefulSet, the engine env of its configuration revision) for an example CR run
    InPlaceIfPossible."""
    cr = copy.deepcopy(load_example(example))
    cr["metadata"]["namespace"] = "ns"
    cr["spec"]["updateStrategy"] = {"type": "InPlaceIfPossible"}
    objects = plan(cr, OperatorConfig()).objects
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    [config] = [json.loads(v) for k, v in cm["data"].items() if k.startswith(CONFIG_KEY_PREFIX)]
    return sts, config


@pytest.mark.parametrize(("example", "grace", "stop"), [
    ("deepseek-r1-mi355x.yaml", 715, 350), ("cpu/tiny-llama-standalone.yaml", None, None)])
def test_the_stop_budgets_derive_from_one_another(example: str, grace: int | None,
                                                  stop: int | None) -> None:
    """Issue 25, item 8: the grace period, the launcher watcher's SIGKILL and the rollout's
    restart timeout come from one formula (``planner.pod_overhead``). The watcher (a new
    configuration) drains, lets L3 catch up, then allows the engine its stop grace: the same
    time the kubelet allows after its preStop drain (minus the endpoint delay a terminating
    pod needs and a running one does not), never more than the pod's grace period, and the
    rollout waits for all of it before it calls a restart failed."""
    sts, env = _in_place(example)
    pod_grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    stop_grace = int(env[STOP_GRACE_ENV])
    if grace is not None:
        assert (pod_grace, stop_grace) == (grace, stop)  # 1.6 TiB to unpin: 320 s + 30 s
    watcher = STOP_DRAIN_TIMEOUT_S + L3_CATCH_UP_TIMEOUT_S + stop_grace
    assert watcher == pod_grace - DRAIN_ENDPOINT_DELAY_S
    assert in_place_restart_timeout_seconds(pod_grace) == pod_grace + 120 > watcher
    assert OperatorConfig().rollout.restart_timeout_seconds is None  # derived by default


def test_the_stop_grace_is_rendered_only_for_in_place_rollouts() -> None:
    """Other strategies render the engine's env into the pod template: a new variable there
    would replace every pod at an operator upgrade, for a value only the watcher reads."""
    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["metadata"]["namespace"] = "ns"
    sts = next(o for o in plan(cr, OperatorConfig()).objects if o["kind"] == "StatefulSet")
    assert STOP_GRACE_ENV not in json.dumps(sts)
    assert "readinessGates" not in sts["spec"]["template"]["spec"]
    in_place, _ = _in_place("cpu/tiny-llama-standalone.yaml")
    assert in_place["spec"]["template"]["spec"]["readinessGates"] == [
        {"conditionType": "hicache.sglang.ai/in-place-ready"}]


# ---------------------------------------------------------------------------- pulls ahead
def _pacing() -> Pacing:
    return Pacing(prepull_timeout_s=600, namespace="ns", cr_name="tiny-llama-sa")


def test_the_pull_pod_is_pinned_minimal_and_unprivileged() -> None:
    sts = _sts("engine:1")
    pod = _pod(sts, 2, OLD, node="gpu-node-7")
    pod["spec"]["tolerations"] = [{"key": "amd-gpu", "operator": "Exists"}]
    pod["spec"]["imagePullSecrets"] = [{"name": "registry"}]
    pull = build_prepull_pod(cr_name="tiny-llama-sa", namespace="ns", engine_pod=pod,
                             image="engine:2", deadline_s=600)
    spec = pull["spec"]
    assert (spec["nodeName"], spec["restartPolicy"], spec["activeDeadlineSeconds"]) == (
        "gpu-node-7", "Never", 600)
    assert spec["tolerations"] == pod["spec"]["tolerations"]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    [container] = spec["containers"]
    assert container["image"] == "engine:2"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    # Its own name label: no engine selector (Services, PDB, router, the CR's pods) matches.
    assert pull["metadata"]["labels"]["app.kubernetes.io/name"] == PREPULL_APP_NAME
    assert "gpus" not in json.dumps(spec) and "hugepages" not in json.dumps(spec)


def _pull_status(pull: Obj, **status: Any) -> Obj:
    return {**pull, "metadata": {**pull["metadata"], "creationTimestamp": "2027-01-15T08:00:00Z"},
            "status": status}


def test_a_new_image_is_pulled_on_the_node_before_the_pod_leaves_the_rotation() -> None:
    """Issue 25, item 10: the pull pod comes first; the readiness gate closes (and the engine is
    restarted later) only once the image is on the node; the pull pod is then deleted."""
    old, new = _sts("engine:1"), _sts("engine:2")
    live = _live(new, NEW, OLD)
    pods = [_pod(old, i, OLD) for i in range(3)]
    first = _decide(new, live, pods, pacing=_pacing())
    assert first.gates == () and first.patches == ()
    [pull] = first.pulls
    name = pull["metadata"]["name"]
    assert pull["spec"]["nodeName"] == "node-a" and name.startswith("tiny-llama-sa-2-pull-")
    assert first.status is not None and first.status["preparing"] == ["tiny-llama-sa-2"]
    pulling = _pull_status(pull, phase="Pending", containerStatuses=[
        {"name": "pull", "state": {"waiting": {"reason": "ContainerCreating"}}}])
    waiting = _decide(new, live, pods, pacing=_pacing(), pulls={name: pulling})
    assert (waiting.pulls, waiting.gates, waiting.pull_deletes) == ((), (), ())
    assert waiting.recheck_s == 5  # no watch sees a pull pod: the operator looks again
    pulled = _pull_status(pull, phase="Succeeded")
    done = _decide(new, live, pods, pacing=_pacing(), pulls={name: pulled})
    assert [(g.pod, g.ready) for g in done.gates] == [("tiny-llama-sa-2", False)]
    assert done.pull_deletes == (name,) and done.patches == ()
    # Out of rotation, the pod needs no pull: the engine is patched after the grace.
    gated = _gated(pods, done)
    assert [p.pod for p in _decide(new, live, gated, pacing=_pacing()).patches] == [
        "tiny-llama-sa-2"]
    # A configuration-only change pulls nothing.
    config_only = _sts("engine:1", engine={
        **load_example("cpu/tiny-llama-standalone.yaml")["spec"]["engine"], "pageSize": 32})
    d = _decide(config_only, _live(config_only, NEW, OLD), pods, pacing=_pacing())
    assert d.pulls == () and [g.pod for g in d.gates] == ["tiny-llama-sa-2"]


@pytest.mark.parametrize(("status", "why"), [
    ({"phase": "Pending", "containerStatuses": [{"name": "pull", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "not found"}}}]}, "ImagePullBackOff"),
    ({"phase": "Pending"}, "did not finish within 600 s")])
def test_a_pull_that_fails_or_times_out_stops_the_rollout_before_any_restart(
        status: Obj, why: str) -> None:
    old, new = _sts("engine:1"), _sts("engine:2")
    live = _live(new, NEW, OLD)
    pods = [_pod(old, i, OLD) for i in range(3)]
    [pull] = _decide(new, live, pods, pacing=_pacing()).pulls
    name = pull["metadata"]["name"]
    late = 1_800_000_000.0 + 10_000  # well past the pull pod's creation (2027) + 600 s
    d = _decide(new, live, pods, pacing=_pacing(), pulls={name: _pull_status(pull, **status)},
                now=late)
    assert d.failure is not None and d.failure.pod == "tiny-llama-sa-2"
    assert why in d.failure.message and "keeps running the old image" in d.failure.message
    assert d.gates == () and d.patches == () and d.pull_deletes == ()  # kept: it may recover


# ---------------------------------------------------------------------------- kubectl
def test_kubectl_rollout_restart_is_carried_into_the_template_and_restarts_in_place() -> None:
    """Issue 25, item 3: the annotation ``kubectl rollout restart`` adds to the live template
    becomes part of the operator's template, so the new revision restarts each engine in place
    (the pod gets the annotation; the launcher's watcher restarts the engine on it)."""
    sts = _sts("engine:1")
    live = copy.deepcopy(sts)
    stamp = "2027-01-15T09:00:00Z"
    live["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT_ANNOTATION] = stamp
    assert kubectl.carry_restart(sts, None) is sts
    carried = kubectl.carry_restart(sts, live)
    assert carried["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT_ANNOTATION] == \
        "2027-01-15T09:00:00Z"
    pods = [_pod(sts, i, OLD) for i in range(3)]
    d = _decide(carried, _live(carried, NEW, OLD), pods)
    assert d.status is not None and d.status["method"] == "InPlace"
    assert "restart requested at 2027-01-15T09:00:00Z" in d.status["reason"]
    gated = _gated(pods, d)
    [patch] = _decide(carried, _live(carried, NEW, OLD), gated).patches
    assert {"op": "add", "path": "/metadata/annotations/kubectl.kubernetes.io~1restartedAt",
            "value": "2027-01-15T09:00:00Z"} in patch.ops


def test_a_template_changed_outside_the_operator_is_reported() -> None:
    """``kubectl rollout undo`` (or ``kubectl edit``) rewrites the template; the operator puts
    its own back and says to change the CR instead. Added fields (server defaults, kubectl's
    restart request) are not a change."""
    sts = diff.with_last_applied(_sts("engine:1"))
    assert kubectl.outside_change(sts) is None
    restarted = copy.deepcopy(sts)
    restarted["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT_ANNOTATION] = "now"
    restarted["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/x"
    assert kubectl.outside_change(restarted) is None
    undone = copy.deepcopy(sts)
    undone["spec"]["template"]["spec"]["containers"][0]["image"] = "engine:0"
    why = kubectl.outside_change(undone)
    assert why is not None and "kubectl rollout undo" in why and "Change the SGLangHiCache" in why
