"""One reconcile's part of an in-place rollout: shape the desired StatefulSet and ConfigMap
from the rollout decision, then send its pod patches.

``rollout.decide`` is pure; this module feeds it (which pods are serving: Ready, plus every
:class:`ServingCheck`) and carries its decision out through the one API module.

``ServingCheck`` is the extension point for "ready to take traffic" beyond the pod's Ready
condition: where a router serves the CR, the reconciler adds one returning the pods the router
routes to (:func:`router_routed`), and a rollout then waits for each restarted pod to be
back in that set before the next. Its other router check, :func:`router_leaving`, holds a
pod's engine restart until no router pod lists the pod any more (smg drains a removed worker
before it lets it go).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlsplit

from hicache_umbp.contract.revisions import CONFIG_KEY_PREFIX, CONFIG_REVISION_ENV, config_key

from ..api.config import RolloutConfig
from ..api.k8s import IN_PLACE
from ..builders.prepull import PREPULL_FOR, prepull_selector
from . import diff, kubectl, metrics, rollout, status
from .apply import ChildKey
from .kube import KubeClient, KubeError
from .logs import cr_logger
from .rollout_pods import gate, has_gate, pod_ready
from .rollout_steps import GATE_DRAINING
from .router_status import RouterReader, routed_pods, router_pod_selector, router_serving
from .transitions import Event

Obj = dict[str, Any]


class ServingCheck(Protocol):
    """Which of a CR's pods serve, by one more criterion than their Ready condition; a string
    says why that cannot be known now (the rollout then waits)."""

    async def __call__(self, cr: Mapping[str, Any],
                       pods: Sequence[Mapping[str, Any]]) -> set[str] | str: ...


@dataclass
class Step:
    """What the reconcile applies and reports for the rollout (``None`` parts: no rollout)."""

    decision: rollout.Decision | None = None
    events: list[Event] = field(default_factory=list)
    writes: int = 0
    patched: dict[str, Obj] = field(default_factory=dict)  # pods as the patches left them

    def pods(self, listed: Sequence[Obj]) -> list[Obj]:
        """``listed`` with the patched pods as they are now."""
        return [self.patched.get(p["metadata"]["name"], p) for p in listed]


def live_configs(configmap: Mapping[str, Any] | None) -> frozenset[str]:
    data = (configmap or {}).get("data") or {}
    return frozenset(k[len(CONFIG_KEY_PREFIX):] for k in data
                     if k.startswith(CONFIG_KEY_PREFIX) and k != CONFIG_REVISION_ENV)


async def serving_pods(cr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                       checks: Sequence[ServingCheck]) -> tuple[set[str], str | None]:
    """(the pods that serve, why that is unknown or None)."""
    names = {str(p["metadata"]["name"]) for p in pods if rollout.pod_ready(p)}
    for check in checks:
        if not names:
            break
        seen = await check(cr, [p for p in pods if p["metadata"]["name"] in names])
        if isinstance(seen, str):
            return names, seen
        names &= seen
    return names, None


PullLister = Callable[[], Awaitable[list[Obj]]]


def router_routed(kube: KubeClient, reader: RouterReader, planned: Any,
                  live: Mapping[ChildKey, Obj], key: tuple[str, str]) -> ServingCheck | None:
    """The pods a router routes to (``router_status.routed_pods``, the first ready router pod's
    healthy workers): a restarted pod is done only once it is among them. None: no router
    serves the CR."""
    if getattr(planned, "router", None) is None or not router_serving(live, key[1]):
        return None

    async def routed(cr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> set[str] | str:
        router_pods = await kube.list("v1", "Pod", key[0], router_pod_selector(key[1]))
        seen = await reader.observe(key, router_pods, planned.spec.router.port)
        names = routed_pods(pods, seen)
        if names is None:
            return (f"the router's worker list cannot be read ({seen.error}); no pod is "
                    "restarted until it can")
        return names
    return routed


def router_leaving(kube: KubeClient, reader: RouterReader, planned: Any,
                   live: Mapping[ChildKey, Obj], key: tuple[str, str]) -> ServingCheck | None:
    """Which of the given pods (their gate closed) a router has not let go yet; their engines
    do not restart before it has. A pod the kubelet still reports Ready has not been drained
    (:func:`drain_router` waits for it); a drained one is let go ``SMG_LETS_GO_S`` later
    (``RouterReader.letting_go``), unless a ready router pod still lists it (its removal
    failed: ``RouterReader.listed``). None: no router serves the CR."""
    if getattr(planned, "router", None) is None or not router_serving(live, key[1]):
        return None

    async def leaving(cr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> set[str] | str:
        ips = {str((p.get("status") or {}).get("podIP") or ""): str(p["metadata"]["name"])
               for p in pods if not pod_ready(p)}
        ips.pop("", None)
        router_pods = await kube.list("v1", "Pod", key[0], router_pod_selector(key[1]))
        listed = await reader.listed(router_pods, planned.spec.router.port)
        if isinstance(listed, str):
            return listed
        held = reader.letting_go(key, frozenset(ips)) | listed
        return {str(p["metadata"]["name"]) for p in pods if pod_ready(p)} | {
            name for ip, name in ips.items() if ip in held}
    return leaving


def pull_lister(kube: KubeClient, namespace: str, name: str) -> PullLister:
    """Lists the CR's pull pods (``builders.prepull``: their own name label)."""
    selector = ",".join(f"{k}={v}" for k, v in prepull_selector(name).items())

    async def pulls() -> list[Obj]:
        return await kube.list("v1", "Pod", namespace, selector)
    return pulls


async def decide(planned: Any, cr: Mapping[str, Any], desired: dict[ChildKey, Obj],
                 live: Mapping[ChildKey, Obj], pods: Sequence[Mapping[str, Any]],
                 checks: Sequence[ServingCheck], settings: RolloutConfig,
                 clock: Callable[[], float] = time.time,
                 list_pulls: PullLister | None = None,
                 leaving_check: ServingCheck | None = None) -> rollout.Decision | None:
    """The rollout decision, with ``desired`` rewritten to match it: the StatefulSet's
    ``updateStrategy`` (and kubectl's restart request, ``kubectl.carry_restart``) and the
    ConfigMap revisions to keep. None: not InPlaceIfPossible. ``leaving_check``: which pods
    out of rotation a router still lists (:func:`router_leaving`)."""
    strategy = planned.spec.update_strategy
    if strategy.type != IN_PLACE:
        return None
    sts_key = next(k for k in desired if k[1] == "StatefulSet")
    cm_key = next(k for k in desired if k[1] == "ConfigMap")
    desired[sts_key] = kubectl.carry_restart(desired[sts_key], live.get(sts_key))
    rolling = strategy.rolling_update
    target = rollout.target_of(desired[sts_key], rolling.partition if rolling else 0,
                               rolling.max_unavailable if rolling else None)
    live_cm = live.get(cm_key)
    previous = (cr.get("status") or {}).get("rollout")
    meta = cr.get("metadata") or {}
    pacing = rollout.Pacing(
        drain_grace_s=float(settings.drain_grace_seconds),
        prepull_timeout_s=float(settings.prepull_timeout_seconds) if settings.prepull else 0.0,
        namespace=str(meta.get("namespace", "")), cr_name=str(meta.get("name", "")))
    pulls: dict[str, Obj] = {}
    leaving: frozenset[str] = frozenset()

    def decide_with(serving: set[str], hold: str | None = None) -> rollout.Decision:
        return rollout.decide(
            target, live.get(sts_key), pods, serving=lambda p: p["metadata"]["name"] in serving,
            live_configs=live_configs(live_cm), previous=previous, now=clock(),
            restart_timeout_s=settings.restart_timeout_seconds, hold=hold, pacing=pacing,
            pulls=pulls, leaving=leaving)

    ready = (await serving_pods(cr, pods, ()))[0]
    decision = decide_with(ready)
    if list_pulls is not None and (decision.status is not None or previous):
        # a rollout runs or just ended: its pull pods (to wait for, or to delete)
        pulls = {str(p["metadata"]["name"]): p for p in await list_pulls()}
    hold = None
    gated = [p for p in pods if has_gate(p) and (gate(p) or {}).get("status") == "False"]
    if decision.status is not None and leaving_check is not None and gated:
        still = await leaving_check(cr, gated)
        if isinstance(still, str):
            hold = (f"the router's worker list cannot be read ({still}); no pod is restarted "
                    "until it can")
        else:
            leaving = frozenset(still)
    if decision.status is not None and checks:  # a rollout runs: ask the serving checks too
        serving, why = await serving_pods(cr, pods, checks)
        decision = decide_with(serving, why or hold)
    elif pulls or leaving or hold:
        decision = decide_with(ready, hold)
    sts = json.loads(json.dumps(desired[sts_key]))
    sts["spec"]["updateStrategy"] = decision.update_strategy
    desired[sts_key] = sts
    kept = {config_key(r): ((live_cm or {}).get("data") or {}).get(config_key(r))
            for r in sorted(decision.keep_configs)}
    kept = {k: v for k, v in kept.items() if v is not None}
    if kept:
        cm = json.loads(json.dumps(desired[cm_key]))
        cm["data"] = dict(sorted({**kept, **cm["data"]}.items()))
        desired[cm_key] = cm
    return decision


def draining_ips(pods: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The IPs of the pods an in-place update is taking out of rotation: the operator's
    readiness gate False for it and the pod not Ready (the kubelet has seen the gate), so a
    router that re-registers pods on their Ready events does not take them back."""
    return frozenset(
        str(p["status"]["podIP"]) for p in pods
        if has_gate(p) and (p.get("status") or {}).get("podIP") and not pod_ready(p)
        and (gate(p) or {}).get("status") == "False"
        and (gate(p) or {}).get("reason") == GATE_DRAINING)


async def drain_router(kube: KubeClient, reader: RouterReader, planned: Any,
                       live: Mapping[ChildKey, Obj], pods: Sequence[Obj],
                       key: tuple[str, str]) -> list[Event]:
    """Take the pods an in-place update drains (:func:`draining_ips`) out of every router
    replica's worker list before their engines restart (``RouterReader.drain``)."""
    draining = draining_ips(pods)
    if not draining or getattr(planned, "router", None) is None or \
            not router_serving(live, key[1]):
        return []
    router_pods = await kube.list("v1", "Pod", key[0], router_pod_selector(key[1]))
    removed, errors = await reader.drain(router_pods, planned.spec.router.port, draining)
    reader.note_drained(key, {str(urlsplit(url).hostname) for url in removed})
    for error in errors:
        cr_logger(*key).warning("could not take a draining pod out of the router: %s", error)
    if not removed:
        return []
    return [Event("Normal", "RouterDrained", f"took {', '.join(sorted(set(removed)))} out of "
                  f"the router's workers ({len(removed)} removal(s) over the router pods) "
                  "before the in-place restart")]


_SKIPPED = (404, 409, 422)  # the pod changed or went meanwhile: the next reconcile decides again


async def send_patches(kube: KubeClient, cr: Mapping[str, Any],
                       decision: rollout.Decision | None) -> Step:
    """Send the decision's writes in order: readiness gates, pull pods, engine patches. A
    refused ``test`` (the pod changed meanwhile) or a vanished pod is skipped: the next
    reconcile decides again from what it reads."""
    step = Step(decision)
    if decision is None:
        return step
    namespace, name = cr["metadata"]["namespace"], cr["metadata"]["name"]
    log = cr_logger(namespace, name)
    for gate_write in decision.gates:
        try:
            step.patched[gate_write.pod] = await kube.json_patch(
                "v1", "Pod", namespace, gate_write.pod, gate_write.ops, subresource="status")
        except KubeError as exc:
            if exc.status not in _SKIPPED:
                raise
            log.info("readiness gate of pod %s not set (%s)", gate_write.pod, exc)
            continue
        metrics.WRITES.labels("patch", "Pod/status").inc()
        step.writes += 1
    for pull in decision.pulls:
        body = {**pull, "metadata": {**pull["metadata"],
                                     "ownerReferences": [diff.owner_reference(cr)]}}
        try:
            await kube.create(body)
        except KubeError as exc:
            if exc.status != 409:  # made by an earlier reconcile
                raise
        else:
            metrics.WRITES.labels("create", "Pod").inc()
            step.writes += 1
            step.events.append(Event("Normal", "PullingImage", (
                f"pulling {pull['spec']['containers'][0]['image']} on node "
                f"{pull['spec']['nodeName']} before pod "
                f"{pull['metadata']['annotations'][PREPULL_FOR]} restarts its engine")))
    for pull_name in decision.pull_deletes:
        if await kube.delete("v1", "Pod", namespace, pull_name):
            metrics.WRITES.labels("delete", "Pod").inc()
            step.writes += 1
    for patch in decision.patches:
        try:
            step.patched[patch.pod] = await kube.json_patch("v1", "Pod", namespace, patch.pod,
                                                            patch.ops)
        except KubeError as exc:
            if exc.status not in _SKIPPED:
                raise
            log.info("in-place update of pod %s skipped (%s); deciding again on the next "
                     "event", patch.pod, exc)
            continue
        metrics.WRITES.labels("patch", "Pod").inc()
        step.writes += 1
        step.events.append(Event("Normal", "RestartingEngine", patch.message))
    return step


def with_rollout(outcome: status.Outcome, decision: rollout.Decision | None) -> status.Outcome:
    """The outcome with what the status says about the rollout."""
    if decision is None or decision.status is None:
        return outcome
    failure = decision.failure
    return replace(outcome, rollout=decision.status, rollout_progress=decision.progressing,
                   rollout_failure=(failure.pod, failure.message) if failure else None)
