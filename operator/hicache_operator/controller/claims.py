"""SSD claims pinned to a lost node: read what the decision needs, delete claim and pod when due.

The decision is ``planner.claim_rebind`` (pure); this module reads the PersistentVolumes and
nodes only when a pod is Pending with a bound SSD claim (a healthy cluster costs no read), and
deletes the claim, then the pod, so the StatefulSet controller recreates both: the new claim
binds where the scheduler places the new pod.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..planner.claim_rebind import Stranded, bound_volumes, stranded
from . import metrics
from .kube import KubeClient
from .transitions import Event

REASON = "SsdVolumeLost"


@dataclass
class ClaimCheck:
    issues: list[tuple[str, str]] = field(default_factory=list)  # Degraded (reason, message)
    events: list[Event] = field(default_factory=list)
    writes: int = 0
    freed: dict[str, str] = field(default_factory=dict)  # pod -> message, for the memory


def _at(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _describe(s: Stranded) -> str:
    return (f"SSD claim {s.claim} is bound to PersistentVolume {s.volume}, which only a node "
            f"that is gone or unusable can mount ({s.why}), so the pod cannot be scheduled")


async def check_claims(kube: KubeClient, namespace: str, planned: Any,
                       pods: Sequence[Mapping[str, Any]], pvcs: Sequence[Mapping[str, Any]],
                       freed: dict[str, str]) -> ClaimCheck:
    """The plan's SSD claims (``claimTemplate`` only) checked, due ones freed. ``freed`` (the
    CR's memory, updated) keeps a freed pod in the Degraded condition until it is Ready again;
    the Event says it for good."""
    if planned is None or not planned.ssd.claim_templates:
        return ClaimCheck()
    out = ClaimCheck()
    now = time.time()
    # Drive i of the plan is drive i of the spec (planner.ssd keeps their order).
    for drive, volume in zip(planned.ssd.drives, planned.spec.l3.ssd.drive_volumes(),
                             strict=True):
        if drive.claim_template is None or volume.claim_template is None:
            continue
        one = await _check(kube, namespace, pods, pvcs, drive.name,
                           int(volume.claim_template.rebind_after_seconds), now)
        out.issues += one.issues
        out.events += one.events
        out.writes += one.writes
        out.freed.update(one.freed)
    ready = {p["metadata"]["name"] for p in pods if any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (p.get("status") or {}).get("conditions") or [])}
    kept = {p: m for p, m in {**freed, **out.freed}.items() if p not in ready}
    freed.clear()
    freed.update(kept)
    out.issues += [(REASON, f"pod {p}: {m}") for p, m in sorted(kept.items())]
    return out


async def _check(kube: KubeClient, namespace: str, pods: Sequence[Mapping[str, Any]],
                 pvcs: Sequence[Mapping[str, Any]], volume: str, after_s: int,
                 now: float) -> ClaimCheck:
    out = ClaimCheck()
    wanted = bound_volumes(pods, pvcs, volume)
    if not wanted:
        return out
    pvs = {}
    for name in sorted(set(wanted.values())):
        pv = await kube.get("v1", "PersistentVolume", None, name)
        if pv is not None:
            pvs[name] = pv
    nodes = await kube.list("v1", "Node", None)
    for s in stranded(pods, pvcs, pvs, nodes, volume, after_s):
        if after_s == 0 or not s.due(now):
            when = "never deleted (rebindAfterSeconds 0)" if after_s == 0 else \
                f"the claim and the pod are deleted at {_at(s.due_at)} (rebindAfterSeconds " \
                f"{after_s}) so the pod starts elsewhere with a cold SSD tier"
            out.issues.append((REASON, f"pod {s.pod}: {_describe(s)}; {when}"))
            continue
        await kube.delete("v1", "PersistentVolumeClaim", namespace, s.claim)
        metrics.WRITES.labels("delete", "PersistentVolumeClaim").inc()
        await kube.delete("v1", "Pod", namespace, s.pod)
        metrics.WRITES.labels("delete", "Pod").inc()
        out.writes += 2
        message = (f"{_describe(s)}; Pending since {_at(s.pending_since)}: deleted the claim "
                   f"and the pod, the StatefulSet recreates both and the pod starts elsewhere "
                   f"with a cold SSD tier")
        out.events.append(Event("Warning", REASON, f"pod {s.pod}: {message}"))
        out.freed[s.pod] = message
    return out
