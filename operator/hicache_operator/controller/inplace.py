"""One reconcile's part of an in-place rollout: shape the desired StatefulSet and ConfigMap
from the rollout decision, then send its pod patches.

``rollout.decide`` is pure; this module feeds it (which pods are serving: Ready, plus every
:class:`ServingCheck`) and carries its decision out through the one API module.

``ServingCheck`` is the extension point for "ready to take traffic" beyond the pod's Ready
condition: where a router serves the CR, the reconciler adds one returning the pods the router
routes to (``Reconciler._serving_checks``), and a rollout then waits for each restarted pod to be
back in that set before the next.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hicache_umbp.contract.revisions import CONFIG_KEY_PREFIX, CONFIG_REVISION_ENV, config_key

from ..api.k8s import IN_PLACE
from . import metrics, rollout, status
from .apply import ChildKey
from .kube import KubeClient, KubeError
from .logs import cr_logger
from .transitions import Event

Obj = dict[str, Any]


class ServingCheck(Protocol):
    """Which of a CR's pods serve, by one more criterion than their Ready condition."""

    async def __call__(self, cr: Mapping[str, Any],
                       pods: Sequence[Mapping[str, Any]]) -> set[str]: ...


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
                       checks: Sequence[ServingCheck]) -> set[str]:
    names = {str(p["metadata"]["name"]) for p in pods if rollout.pod_ready(p)}
    for check in checks:
        if not names:
            break
        names &= await check(cr, [p for p in pods if p["metadata"]["name"] in names])
    return names


async def decide(planned: Any, cr: Mapping[str, Any], desired: dict[ChildKey, Obj],
                 live: Mapping[ChildKey, Obj], pods: Sequence[Mapping[str, Any]],
                 checks: Sequence[ServingCheck], restart_timeout_s: float,
                 clock: Callable[[], float] = time.time) -> rollout.Decision | None:
    """The rollout decision, with ``desired`` rewritten to match it: the StatefulSet's
    ``updateStrategy`` and the ConfigMap revisions to keep. None: not InPlaceIfPossible."""
    strategy = planned.spec.update_strategy
    if strategy.type != IN_PLACE:
        return None
    sts_key = next(k for k in desired if k[1] == "StatefulSet")
    cm_key = next(k for k in desired if k[1] == "ConfigMap")
    rolling = strategy.rolling_update
    target = rollout.target_of(desired[sts_key], rolling.partition if rolling else 0,
                               rolling.max_unavailable if rolling else None)
    live_cm = live.get(cm_key)
    previous = (cr.get("status") or {}).get("rollout")

    def decide_with(serving: set[str]) -> rollout.Decision:
        return rollout.decide(
            target, live.get(sts_key), pods, serving=lambda p: p["metadata"]["name"] in serving,
            live_configs=live_configs(live_cm), previous=previous, now=clock(),
            restart_timeout_s=restart_timeout_s)

    decision = decide_with(await serving_pods(cr, pods, ()))
    if decision.status is not None and checks:  # a rollout runs: ask the serving checks too
        decision = decide_with(await serving_pods(cr, pods, checks))
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


async def send_patches(kube: KubeClient, namespace: str, name: str,
                       decision: rollout.Decision | None) -> Step:
    """Send the decision's pod patches; a refused ``test`` (the pod changed meanwhile) or a
    vanished pod is skipped: the next reconcile decides again from what it reads."""
    step = Step(decision)
    if decision is None:
        return step
    for patch in decision.patches:
        try:
            step.patched[patch.pod] = await kube.json_patch("v1", "Pod", namespace, patch.pod,
                                                            patch.ops)
        except KubeError as exc:
            if exc.status not in (404, 409, 422):
                raise
            cr_logger(namespace, name).info("in-place update of pod %s skipped (%s); "
                                            "deciding again on the next event", patch.pod, exc)
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
