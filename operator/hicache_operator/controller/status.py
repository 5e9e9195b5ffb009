"""The CR's status, computed from what the operator planned and what the cluster reports.

Pure: inputs are plain dicts (the StatefulSet, its pods and PVCs as read from the API) and the
planning outcome; the output is the whole ``status`` block. Conditions keep their
``lastTransitionTime`` while their status is unchanged, so recomputing an unchanged world yields
an identical status and the operator writes nothing.

Conditions (``docs/operations.md`` explains each reason and what to do):

- ``SpecValid``: ``True``/``Planned``, or ``False`` listing every problem: ``InvalidSpec``,
  ``PlanningFailed`` (the planner itself failed on this spec), ``VolumeExpansionRefused``,
  ``PodSecurityRejects`` (the namespace's Pod Security level refuses the pods).
- ``Ready``: ``True``/``AllReplicasReady`` when every pod is ready on the revision the update
  strategy asks for.
- ``Progressing``: ``True`` while pods are created or rolled (``Creating``, ``RollingOut``,
  ``RollingOutInPlace`` and ``ReplacingPods`` for updateStrategy InPlaceIfPossible,
  ``WaitingForPods``); ``False`` when ``Available``, when pods are held on the previous
  template by the update strategy (``UpdateHeld``) or when blocked (``Stalled``).
- ``Degraded``: ``True`` with the most important failure: ``ObjectRejected`` (the API server
  refused a child), ``InPlaceUpdateFailed`` (a pod's engine did not come back from an in-place
  update; the rollout stops), ``TopologyAffinityError``, ``HugepagesUnavailable``,
  ``GpusUnavailable``, ``SsdVolumeLost`` (an SSD claim bound to a lost node: deleted after
  ``rebindAfterSeconds``), ``SsdVolumePending``, ``Unschedulable``, ``ImagePullError``,
  ``CrashLoopBackOff``, ``PodFailed``, ``RouterUnavailable``, ``RouterMissingPods``
  (``router_status``); else ``False``/``NoFailures``.

``replicas`` counts the pods that exist (the scale subresource reads it); ``cache`` is
``cachestats.status_block.cache_block``; ``rollout`` is ``rollout.Decision.status``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cachestats.observer import CacheObservation
from ..cachestats.status_block import cache_block
from .router_status import ROUTER_REASONS

Obj = dict[str, Any]
CONDITION_TYPES = ("SpecValid", "Ready", "Progressing", "Degraded")

# Most severe first: the first one found becomes the Degraded reason.
DEGRADED_REASONS = ("ObjectRejected", "InPlaceUpdateFailed", "TopologyAffinityError",
                    "HugepagesUnavailable", "GpusUnavailable", "SsdVolumeLost",
                    "SsdVolumePending", "Unschedulable", "ImagePullError", "CrashLoopBackOff",
                    "PodFailed", *ROUTER_REASONS)
SPEC_REASONS = ("InvalidSpec", "PlanningFailed", "VolumeExpansionRefused", "PodSecurityRejects")
# Every reason this module writes, per condition (docs/operations.md explains each).
REASONS: dict[str, tuple[str, ...]] = {
    "SpecValid": ("Planned", *SPEC_REASONS),
    "Ready": ("AllReplicasReady", "ReplicasNotReady", "InvalidSpec"),
    "Progressing": ("Creating", "RollingOut", "RollingOutInPlace", "ReplacingPods",
                    "WaitingForPods", "Available", "UpdateHeld", "Stalled", "InvalidSpec"),
    "Degraded": (*DEGRADED_REASONS, "NoFailures"),
}
_IMAGE_PULL = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})


@dataclass(frozen=True)
class Observed:
    """What the API reported for one CR's workload (and its engines' cache metrics)."""

    statefulset: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    pvcs: Sequence[Mapping[str, Any]] = ()
    cache: CacheObservation | None = None
    router: Mapping[str, Any] | None = None  # status.router (router_status.router_block)
    router_issues: Sequence[tuple[str, str]] = ()  # its Degraded (reason, message)
    volume_issues: Sequence[tuple[str, str]] = ()  # SSD claims on lost nodes (claims.py)


@dataclass(frozen=True)
class Outcome:
    """What planning and applying produced: a plan (status block, cache tiers, strategy) or the
    spec problems, and the children the API server refused."""

    replicas: int
    status_plan: Mapping[str, Any] | None = None
    problems: Sequence[tuple[str, str]] = ()
    warnings: Sequence[str] = field(default_factory=tuple)
    spec_reason: str = "InvalidSpec"
    rejections: Sequence[str] = ()
    cache_tiers: Sequence[Mapping[str, Any]] | None = None
    on_delete: bool = False  # updateStrategy OnDelete
    partition: int = 0  # updateStrategy.rollingUpdate.partition
    min_ratio_change: float = 0.02
    window_seconds: int | None = None  # cache metrics on: the scrape window (status.cache)
    rollout: Mapping[str, Any] | None = None  # status.rollout (controller/rollout.py)
    rollout_progress: tuple[str, str] | None = None  # Progressing (reason, message)
    rollout_failure: tuple[str, str] | None = None  # (pod, why): Degraded InPlaceUpdateFailed


@dataclass(frozen=True)
class PodIssue:
    reason: str
    pod: str
    message: str


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _unschedulable_reason(message: str, pvc_pending: bool) -> str:
    text = message.lower()
    if "hugepages" in text:
        return "HugepagesUnavailable"
    if "amd.com/gpu" in text or "gpu" in text:
        return "GpusUnavailable"
    if pvc_pending or "persistentvolumeclaim" in text or "volume" in text:
        return "SsdVolumePending"
    return "Unschedulable"


def _failed_reason(reason: str) -> str:
    """The Degraded reason of a ``Failed`` pod. Besides ``TopologyAffinityError``, the kubelet
    rejects a pod at admission with ``OutOf<resource>`` when the node is short of a resource the
    scheduler counted on (e.g. ``OutOfhugepages-2Mi`` when the pre-allocated pool shrank)."""
    if reason in DEGRADED_REASONS:
        return reason
    if reason.startswith("OutOf"):
        resource = reason[len("OutOf"):].lower()
        if resource.startswith("hugepages-"):
            return "HugepagesUnavailable"
        if "gpu" in resource:
            return "GpusUnavailable"
    return "PodFailed"


def pod_issues(observed: Observed) -> list[PodIssue]:
    """Every pod-level failure, most severe first (stable order within a reason)."""
    pvc_pending = any((p.get("status") or {}).get("phase") == "Pending" for p in observed.pvcs)
    issues: list[PodIssue] = []
    for pod in observed.pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        if status.get("phase") == "Failed":
            reason = status.get("reason") or "PodFailed"
            issues.append(PodIssue(_failed_reason(reason), name, status.get("message") or reason))
            continue
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                message = cond.get("message") or cond.get("reason") or "unschedulable"
                issues.append(PodIssue(_unschedulable_reason(message, pvc_pending), name,
                                       message))
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            why = waiting.get("reason", "")
            if why in _IMAGE_PULL:
                issues.append(PodIssue("ImagePullError", name,
                                       f"{container.get('name')}: {waiting.get('message', why)}"))
            elif why == "CrashLoopBackOff":
                issues.append(PodIssue("CrashLoopBackOff", name,
                                       f"{container.get('name')} restarted "
                                       f"{container.get('restartCount', 0)} times: "
                                       f"{waiting.get('message', why)}"))
    if pvc_pending and not any(i.reason == "SsdVolumePending" for i in issues) and \
            any(not _pod_ready(p) for p in observed.pods):
        claim = next(p for p in observed.pvcs if (p.get("status") or {}).get("phase") == "Pending")
        issues.append(PodIssue("SsdVolumePending", (claim.get("metadata") or {}).get("name", "?"),
                               "the SSD PersistentVolumeClaim is not bound yet"))
    issues.sort(key=lambda i: (DEGRADED_REASONS.index(i.reason), i.pod))
    return issues


def _condition(kind: str, ok: bool, reason: str, message: str,
               previous: Mapping[str, Mapping[str, Any]], generation: int) -> Obj:
    status = "True" if ok else "False"
    before = previous.get(kind) or {}
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since or now_iso()}


def _rollout(sts: Mapping[str, Any], outcome: Outcome) -> tuple[bool, int]:
    """Whether the StatefulSet rolled every pod the update strategy lets it roll, and how many
    pods the strategy keeps on the previous template (OnDelete, or below the partition)."""
    if not sts:
        return False, 0
    sts_status = sts.get("status") or {}
    seen = int(sts_status.get("observedGeneration") or 0) >= int(
        (sts.get("metadata") or {}).get("generation") or 1)
    updated = int(sts_status.get("updatedReplicas") or 0)
    current = sts_status.get("currentRevision") == sts_status.get("updateRevision")
    if outcome.on_delete or outcome.partition:
        expected = 0 if outcome.on_delete else max(0, outcome.replicas - outcome.partition)
        held = 0 if current else max(0, outcome.replicas - updated)
        return seen and updated >= expected, held
    return seen and updated >= outcome.replicas and current, 0


def compute_status(*, generation: int, outcome: Outcome, observed: Observed,
                   previous: Mapping[str, Any] | None = None) -> Obj:
    """The full ``status`` block for one CR."""
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or []}

    def cond(kind: str, ok: bool, reason: str, message: str) -> Obj:
        return _condition(kind, ok, reason, message, before, generation)

    ready_pods = sum(1 for p in observed.pods if _pod_ready(p))
    existing = len(observed.pods)
    previous_cache = (previous or {}).get("cache")
    if outcome.problems:
        listed = "; ".join(f"{path}: {message}" for path, message in outcome.problems)
        conditions = [
            cond("SpecValid", False, outcome.spec_reason, listed),
            cond("Ready", False, "InvalidSpec", "the spec is invalid; nothing was changed"),
            cond("Progressing", False, "InvalidSpec", "fix the spec to continue"),
            cond("Degraded", False, "NoFailures", "no pod-level failures"),
        ]
        out: Obj = {"observedGeneration": generation, "phase": "Invalid",
                    "replicas": existing, "readyReplicas": ready_pods,
                    "conditions": conditions}
        if previous and previous.get("plan") is not None:
            out["plan"] = previous["plan"]  # the last valid plan still describes running pods
        if previous_cache is not None:
            out["cache"] = previous_cache
        return out

    sts = observed.statefulset or {}
    rolled, held = _rollout(sts, outcome)
    ready = rolled and ready_pods >= outcome.replicas and existing == outcome.replicas
    issues = [PodIssue("ObjectRejected", "", r) for r in outcome.rejections]
    if outcome.rollout_failure is not None:
        pod, why = outcome.rollout_failure
        issues.append(PodIssue("InPlaceUpdateFailed", pod,
                               f"{why}; the in-place rollout is stopped (fix the image or the "
                               "configuration, or revert the change)"))
    issues += [PodIssue(reason, "", message) for reason, message in observed.volume_issues]
    issues += pod_issues(observed)
    issues += [PodIssue(reason, "", message) for reason, message in observed.router_issues]
    degraded = issues[0] if issues else None
    if degraded is not None:
        extra = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        where = f"pod {degraded.pod}: " if degraded.pod else ""
        degraded_cond = cond("Degraded", True, degraded.reason,
                             f"{where}{degraded.message}{extra}")
    else:
        degraded_cond = cond("Degraded", False, "NoFailures", "no pod-level failures")
    ready_msg = f"{ready_pods}/{outcome.replicas} pods ready"
    if ready and held:
        how = ("updateStrategy OnDelete: delete them to update them" if outcome.on_delete else
               f"updateStrategy partition {outcome.partition}: lower it to update them")
        progressing = cond("Progressing", False, "UpdateHeld",
                           f"{ready_msg}; {held} pod(s) run the previous template ({how})")
        phase = "Ready"
    elif ready:
        progressing = cond("Progressing", False, "Available", ready_msg)
        phase = "Ready"
    elif degraded is not None:
        progressing = cond("Progressing", False, "Stalled",
                           f"{ready_msg}; blocked by {degraded.reason}")
        phase = "Degraded"
    elif outcome.rollout_progress is not None:
        reason, message = outcome.rollout_progress
        progressing = cond("Progressing", True, reason, f"{ready_msg}; {message}")
        phase = "Progressing" if ready_pods else "Pending"
    else:
        reason = "Creating" if not sts else ("RollingOut" if not rolled else "WaitingForPods")
        progressing = cond("Progressing", True, reason, ready_msg)
        phase = "Progressing" if ready_pods else "Pending"
    summary = "planned" + (f" with {len(outcome.warnings)} warning(s): "
                           + "; ".join(outcome.warnings) if outcome.warnings else "")
    conditions = [cond("SpecValid", True, "Planned", summary),
                  cond("Ready", ready, "AllReplicasReady" if ready else "ReplicasNotReady",
                       ready_msg),
                  progressing, degraded_cond]
    out = {"observedGeneration": generation, "phase": phase, "replicas": existing,
           "readyReplicas": ready_pods, "conditions": conditions}
    if outcome.status_plan is not None:
        out["plan"] = dict(outcome.status_plan)
    cache = cache_block(outcome.cache_tiers, observed.cache, previous_cache,
                        outcome.min_ratio_change, outcome.window_seconds)
    if cache is not None:
        out["cache"] = cache
    if observed.router is not None:
        out["router"] = dict(observed.router)
    if outcome.rollout is not None:
        out["rollout"] = dict(outcome.rollout)
    return out


def condition(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def same_status(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Equal, ignoring nothing: timestamps are carried over by ``compute_status`` already."""
    return dict(a or {}) == dict(b or {})
