"""Rollouts under ``updateStrategy: InPlaceIfPossible``: restart engine containers in place.

Pure: inputs are the desired StatefulSet (from the plan), the live one, the CR's pods, their
pre-pull pods and what the controller knows about them (which are serving, or that it cannot
tell); the output is a :class:`Decision`: the ``updateStrategy`` to render, the ConfigMap
revisions to keep, the writes to send now (readiness-gate conditions, pull pods, engine
patches) and the ``status.rollout`` block. The reconcile sends them (``inplace.py``); nothing
here talks to the API.

How it works with the StatefulSet controller (whose bookkeeping stays true throughout):

- between rollouts the StatefulSet is rendered ``RollingUpdate`` with ``partition: replicas``:
  its controller takes a new template as ``updateRevision`` but touches no pod;
- while pods are updated in place the controller must still make any pod it (re)creates (a
  deleted or evicted pod, a scale-up) from the new template, or that pod starts on the old
  image and is updated again (a second model load). The controller creates ordinal ``o`` from
  ``currentRevision`` when ``RollingUpdate`` has ``o < partition`` and from ``updateRevision``
  otherwise (``newVersionedStatefulSetPod``), and it *replaces* every pod of another revision
  at ``o >= partition``. So during a rollout the strategy is ``OnDelete`` (no replacement, every
  new pod from ``updateRevision``; ``kubectl rollout status`` then refuses instead of reporting
  "partitioned roll out complete"), or with a user's ``partition`` p > 0 (whose lower pods must
  keep the old template) ``RollingUpdate`` with the lowest partition >= p above which every
  existing pod is on the new revision. Once every pod is on it the user's partition lets the
  controller move ``currentRevision`` (nothing left to replace), then the partition is held again;
- a pod made from a template that differs from the desired one only in the engine image, the
  configuration revision or kubectl's ``restartedAt`` annotation (equal ``pod-hash``) is updated
  in place, in steps, highest ordinal first, only ordinals >= ``partition``:
  1. a new image is pulled on the pod's node first by a pull pod (``builders.prepull``), while
     the old engine serves; a pull that fails or times out stops the rollout;
  2. the pod's readiness gate (``hicache.sglang.ai/in-place-ready``) is set False, so the pod
     leaves the Endpoints and the router, and the operator waits ``drainGraceSeconds`` and,
     where a router serves the CR, until the router has let the pod go (``leaving``: smg
     1.13.0 removes a drained worker 5 s after the drain, by URL; an engine restarted sooner
     comes back under that URL and is removed again, and the next pod may then go while the
     router has no worker at all);
  3. one JSON patch: the engine image (the kubelet restarts that container), the template's
     labels and annotations (the ``config-hash`` one makes the launcher's watcher restart the
     engine, ``hicache_umbp.launch.revision``), the ``controller-revision-hash`` label set to
     ``updateRevision`` (so the controller counts the pod as updated) and an ``in-place-update``
     annotation recording the old engine container (progress survives an operator restart);
  4. once the new engine container is ready the gate is set True again; the pod is done when it
     is serving (Ready, and whatever :class:`ServingCheck` the controller adds, e.g. a router's
     worker set);
- unavailable pods are counted as the StatefulSet controller counts them
  (``podsToUpdate = maxUnavailable - unavailablePods``): every pod in a step 2-4 or not serving
  uses the budget; an outdated pod that is down anyway (not Ready) may still go, as restarting it
  costs no availability and a broken pod would otherwise block its own fix;
- when whether pods are serving cannot be known (the router's worker list cannot be read), the
  rollout waits: no new step starts, ``status.rollout.waiting`` says why;
- a pod whose new engine fails (image pull, crash loop, pod failed, or still the old container
  ``restartTimeoutSeconds`` after the update, by default the pod's grace period plus the time to
  start a container) stops the rollout: ``Degraded`` ``InPlaceUpdateFailed`` names it; no other
  pod is touched until it recovers or the spec changes;
- any other difference (resources, volumes, sidecars and their image, probes, ...) cannot be
  done in place: the partition drops to the user's and the StatefulSet replaces the pods
  (``method: Replace``), and ``status.rollout.reason`` lists what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..builders.context import CONFIG_HASH_ANNOTATION, POD_HASH_ANNOTATION, RESTARTED_AT_ANNOTATION
from ..builders.prepull import build_prepull_pod, prepull_name
from ..planner.pod_overhead import in_place_restart_timeout_seconds
from . import diff
from .rollout_pods import (
    ENGINE,
    IN_PLACE_ANNOTATION,
    REVISION_LABEL,
    annotation,
    containers_ready,
    engine_image,
    gate,
    has_gate,
    in_place_state,
    label,
    meta,
    name_of,
    ordinal,
    parse_time,
    pod_ready,
)
from .rollout_steps import (
    FAILED_WAITING,
    GatePatch,
    PodPatch,
    engine_patch,
    failure,
    gate_patch,
    restarted,
)
from .rollout_target import Target, scaled, target_of, template_changes, what_changes, why_replace

__all__ = ["ENGINE", "IN_PLACE_ANNOTATION", "REVISION_LABEL", "Decision", "Failure",
           "GatePatch", "Pacing", "PodPatch", "Target", "decide", "engine_image", "ordinal",
           "pod_ready", "scaled", "target_of", "template_changes"]

Obj = dict[str, Any]
# How often a running pull pod is looked at (the operator watches no pull pod).
PULL_POLL_S = 5.0
# How often a router that still lists a draining pod is asked again (nothing watches it).
LEAVE_POLL_S = 1.0
# Pull pod states that say the image is on the node (the container was created or ran).
_PULLED_WAITING = frozenset({"CreateContainerConfigError", "CreateContainerError",
                             "RunContainerError"})


@dataclass(frozen=True)
class Pacing:
    """The operator's rollout settings (operator configuration ``rollout``)."""

    drain_grace_s: float = 0.0  # readiness gate False -> the engine's restart
    prepull_timeout_s: float = 0.0  # 0: no pull ahead
    namespace: str = ""  # where pull pods are made
    cr_name: str = ""


@dataclass(frozen=True)
class Failure:
    pod: str
    message: str


@dataclass(frozen=True)
class Decision:
    update_strategy: Obj  # rendered into the StatefulSet
    keep_configs: frozenset[str]  # configuration revisions the ConfigMap keeps besides ours
    patches: tuple[PodPatch, ...] = ()
    status: Obj | None = None  # status.rollout (None: nothing to roll)
    failure: Failure | None = None
    gates: tuple[GatePatch, ...] = ()  # readiness-gate conditions to write, before the patches
    pulls: tuple[Obj, ...] = ()  # pull pods to create
    pull_deletes: tuple[str, ...] = ()  # pull pods done with
    recheck_s: float | None = None  # decide again this soon (a drain grace ends, a pull runs)

    @property
    def progressing(self) -> tuple[str, str] | None:
        """(Progressing reason, message) while a rollout runs."""
        if self.status is None or self.failure is not None:
            return None
        s = self.status
        done = f"{s['updatedPods']}/{s['pods']} pod(s) on the new template"
        if s["method"] == "Replace":
            return "ReplacingPods", f"{done}; the StatefulSet replaces pods: {s['reason']}"
        restarting = f"; restarting: {', '.join(s['restarting'])}" if s.get("restarting") else ""
        preparing = f"; preparing: {', '.join(s['preparing'])}" if s.get("preparing") else ""
        waiting = f"; waiting: {s['waiting']}" if s.get("waiting") else ""
        return "RollingOutInPlace", (f"{done}{restarting}{preparing}{waiting}; engine restarts "
                                     f"in place: {s['reason']}")


def _up_to_date(pod: Mapping[str, Any], target: Target, revision: str | None) -> bool:
    if revision is not None:
        return label(pod, REVISION_LABEL) == revision
    return (engine_image(pod.get("spec") or {}) == target.image
            and annotation(pod, CONFIG_HASH_ANNOTATION) == target.config_hash
            and annotation(pod, POD_HASH_ANNOTATION) == target.pod_hash
            and annotation(pod, RESTARTED_AT_ANNOTATION) == target.restarted_at)


def _gates(owned: Sequence[Mapping[str, Any]], outdated: set[str], in_flight: set[str],
           now: float) -> list[GatePatch]:
    """Readiness gates to open: a pod without the condition (new pods: without it they never
    become Ready), and a pod held out for an update it no longer needs or whose new engine
    is ready (its containers pass their probes)."""
    out = []
    for pod in owned:
        if not has_gate(pod):
            continue
        name, cond = name_of(pod), gate(pod)
        if cond is None:
            out.append(gate_patch(pod, True, now, "no in-place update in progress"))
        elif cond.get("status") != "True" and name not in outdated and (
                name not in in_flight or (restarted(pod, in_place_state(pod))
                                          and containers_ready(pod))):
            out.append(gate_patch(pod, True, now, "the engine is ready"))
    return out


def _during(target: Target, owned: Mapping[int, Mapping[str, Any]], revision: str) -> Obj:
    """The StatefulSet's strategy while pods are updated in place (module docstring)."""
    if not target.partition:
        return {"type": "OnDelete"}
    lowest = target.replicas
    for o in range(target.replicas - 1, target.partition - 1, -1):
        pod = owned.get(o)
        if pod is not None and label(pod, REVISION_LABEL) != revision:
            break
        lowest = o
    return {"type": "RollingUpdate", "rollingUpdate": {"partition": lowest}}


def _pull_state(pull: Mapping[str, Any] | None, now: float,
                timeout_s: float) -> tuple[str, str]:
    """(``missing`` | ``pulling`` | ``pulled`` | ``failed``, why) of a pull pod."""
    if pull is None:
        return "missing", ""
    status = pull.get("status") or {}
    states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
    if status.get("phase") == "Succeeded" or any(s.get("running") or s.get("terminated")
                                                 for s in states):
        return "pulled", ""
    waiting = [s["waiting"] for s in states if s.get("waiting")]
    if any(w.get("reason") in _PULLED_WAITING for w in waiting):
        return "pulled", ""
    failed = [w for w in waiting if w.get("reason") in FAILED_WAITING]
    if failed:
        return "failed", f"{failed[0].get('reason')}: {failed[0].get('message') or ''}"
    created = parse_time(meta(pull).get("creationTimestamp"))
    if status.get("phase") == "Failed" or (created is not None and now - created > timeout_s):
        return "failed", f"the pull did not finish within {timeout_s:.0f} s"
    return "pulling", ""


def decide(target: Target, live_sts: Mapping[str, Any] | None,
           pods: Sequence[Mapping[str, Any]], *, serving: Callable[[Mapping[str, Any]], bool],
           live_configs: frozenset[str], previous: Mapping[str, Any] | None, now: float,
           restart_timeout_s: float | None = None, hold: str | None = None,
           pacing: Pacing = Pacing(),
           pulls: Mapping[str, Mapping[str, Any]] | None = None,
           leaving: frozenset[str] = frozenset()) -> Decision:
    """What to do now for one CR's pods (see the module docstring). ``serving`` is asked only
    when ``hold`` is None (a ``hold`` says why serving cannot be known now); ``pulls`` are the
    CR's pull pods by name; ``leaving`` the pods a router has not let go yet (their engines do
    not restart yet); ``restart_timeout_s`` None: the pod's grace period plus the time to start a
    container (``planner.pod_overhead``)."""
    timeout = restart_timeout_s if restart_timeout_s is not None else float(
        in_place_restart_timeout_seconds(target.grace_seconds))
    pulls = pulls or {}
    owned = {o: p for p in pods if (o := ordinal(p, target.name)) is not None}
    referenced = frozenset(annotation(p, CONFIG_HASH_ANNOTATION) for p in owned.values()) - {
        "", target.config_hash}
    stale_pulls = tuple(sorted(pulls))
    if live_sts is None:
        return Decision(target.held, referenced, gates=tuple(_gates(
            list(owned.values()), set(), set(), now)), pull_deletes=stale_pulls)
    live_spec = live_sts.get("spec") or {}
    live_template = live_spec.get("template") or {}
    applied = diff.covers(live_template, target.template)
    sts_status = live_sts.get("status") or {}
    seen = applied and int(sts_status.get("observedGeneration") or 0) >= int(
        meta(live_sts).get("generation") or 1)
    revision = (str(sts_status.get("updateRevision") or "") or None) if seen else None
    complete = seen and revision is not None and sts_status.get("currentRevision") == revision
    # Until the StatefulSet controller has moved every pod's revision, a pod it (re)creates
    # from its currentRevision may need any configuration the ConfigMap has held.
    keep = referenced if complete else referenced | (live_configs - {target.config_hash})
    in_scope = [owned[o] for o in sorted(owned) if target.partition <= o < target.replicas]
    outdated = [p for p in in_scope if not _up_to_date(p, target, revision)]
    in_flight = [p for p in in_scope if revision is not None and p not in outdated
                 and in_place_state(p).get("revision") == revision
                 and not (restarted(p, in_place_state(p)) and serving(p))]
    gates = _gates(list(owned.values()), {name_of(p) for p in outdated},
                   {name_of(p) for p in in_flight}, now)
    if not outdated and not in_flight:
        settled = target.held if complete or revision is None else target.settling
        return Decision(settled, keep, gates=tuple(gates), pull_deletes=stale_pulls)
    status: Obj = {"image": target.image, "configHash": target.config_hash,
                   "updatedPods": len(in_scope) - len(outdated), "pods": len(in_scope)}
    if revision is not None:
        status["revision"] = revision
    if any(annotation(p, POD_HASH_ANNOTATION) != target.pod_hash for p in outdated):
        status.update(method="Replace",
                      reason=why_replace(target, live_template, outdated, previous))
        return Decision(dict(target.replace_strategy), keep, status=status, gates=tuple(gates),
                        pull_deletes=stale_pulls)
    prev = previous or {}
    same = prev.get("method") == "InPlace" and prev.get("image") == target.image and \
        prev.get("configHash") == target.config_hash
    status.update(method="InPlace", reason=what_changes(target, outdated) if outdated else
                  str(prev.get("reason") if same else "") or "engine restarts in place")
    if revision is None:  # the StatefulSet controller has not named the new revision yet
        return Decision(target.held, keep, status=status, gates=tuple(gates),
                        pull_deletes=stale_pulls)
    fail = None
    for pod in in_flight:
        why = failure(pod, in_place_state(pod), now, timeout)
        if why is not None:
            fail = Failure(name_of(pod), why)
            break
    step = _Steps(target, revision, pacing, pulls, now, leaving)
    if fail is None and hold is None:
        fail = step.run(owned, outdated, in_flight, serving)
    if hold is not None:
        status["waiting"] = hold
    elif step.leaving_router:
        status["waiting"] = (f"{', '.join(sorted(step.leaving_router))}: not let go by the "
                             "router yet (it removes a drained worker some seconds after the "
                             "drain, by URL); the engine restarts once it has")
    restarting = sorted({name_of(p) for p in in_flight} | {p.pod for p in step.patches})
    status["restarting"] = restarting
    if step.preparing:
        status["preparing"] = sorted(step.preparing)
    status["updatedPods"] += len(step.patches)  # the patch moves each to the new revision
    if fail is not None:
        status.update(failedPod=fail.pod, failure=fail.message)
    keep_pulls = {p["metadata"]["name"] for p in step.pulls} | step.waiting_pulls
    return Decision(_during(target, owned, revision), keep, tuple(step.patches), status, fail,
                    tuple([*gates, *step.gates]), tuple(step.pulls),
                    tuple(sorted(set(pulls) - keep_pulls)), step.recheck_s)


class _Steps:
    """The next step of each outdated pod the budget lets go (module docstring, 1-3)."""

    def __init__(self, target: Target, revision: str, pacing: Pacing,
                 pulls: Mapping[str, Mapping[str, Any]], now: float,
                 leaving: frozenset[str] = frozenset()) -> None:
        self.target, self.revision, self.pacing, self.now = target, revision, pacing, now
        self.existing_pulls, self.leaving = pulls, leaving
        self.leaving_router: set[str] = set()
        self.patches: list[PodPatch] = []
        self.gates: list[GatePatch] = []
        self.pulls: list[Obj] = []
        self.waiting_pulls: set[str] = set()
        self.preparing: set[str] = set()
        self.recheck_s: float | None = None

    def _recheck(self, seconds: float) -> None:
        self.recheck_s = seconds if self.recheck_s is None else min(self.recheck_s, seconds)

    def run(self, owned: Mapping[int, Mapping[str, Any]], outdated: Sequence[Mapping[str, Any]],
            in_flight: Sequence[Mapping[str, Any]],
            serving: Callable[[Mapping[str, Any]], bool]) -> Failure | None:
        unavailable = {name_of(p) for p in owned.values() if not serving(p)}
        unavailable |= {name_of(p) for p in in_flight}
        down = {name_of(p) for p in owned.values() if not pod_ready(p)}
        for pod in sorted(outdated, key=lambda p: -(ordinal(p, self.target.name) or 0)):
            name = name_of(pod)
            if name not in down and len(unavailable) >= self.target.max_unavailable:
                continue  # over budget; a pod that is down anyway may still go
            unavailable.add(name)
            why = self._step(pod)
            if why is not None:
                return Failure(name, why)
        return None

    def _step(self, pod: Mapping[str, Any]) -> str | None:
        name = name_of(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        needs_pull = (self.pacing.prepull_timeout_s > 0 and pod_ready(pod) and bool(node)
                      and engine_image(pod.get("spec") or {}) != self.target.image)
        if needs_pull:
            pull_name = prepull_name(name, self.target.image, node)
            state, why = _pull_state(self.existing_pulls.get(pull_name), self.now,
                                     self.pacing.prepull_timeout_s)
            if state == "failed":
                self.waiting_pulls.add(pull_name)  # kept: a registry back lets it finish
                return (f"the new engine image {self.target.image} could not be pulled on node "
                        f"{node} ahead of the restart ({why}); the engine keeps running "
                        "the old image")
            if state != "pulled":
                self.preparing.add(name)
                self._recheck(PULL_POLL_S)
                if state == "missing":
                    self.pulls.append(build_prepull_pod(
                        cr_name=self.pacing.cr_name, namespace=self.pacing.namespace,
                        engine_pod=pod, image=self.target.image,
                        deadline_s=int(self.pacing.prepull_timeout_s)))
                else:
                    self.waiting_pulls.add(pull_name)
                return None
        cond = gate(pod)
        if has_gate(pod) and (cond or {}).get("status") != "False":
            self.preparing.add(name)
            self.gates.append(gate_patch(pod, False, self.now, (
                f"out of rotation for an in-place update to revision {self.revision}")))
            self._recheck(self.pacing.drain_grace_s)
            return None
        if has_gate(pod):
            since = parse_time((cond or {}).get("lastTransitionTime"))
            waited = int(self.now) - since if since is not None else None  # whole seconds
            if waited is not None and waited < self.pacing.drain_grace_s:
                self.preparing.add(name)
                self._recheck(self.pacing.drain_grace_s - waited)
                return None
        if name in self.leaving:
            self.preparing.add(name)
            self.leaving_router.add(name)
            self._recheck(LEAVE_POLL_S)
            return None
        self.patches.append(engine_patch(pod, self.target, self.revision, self.now))
        return None
