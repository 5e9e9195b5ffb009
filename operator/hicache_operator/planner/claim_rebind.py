"""SSD claims bound to a lost node: which pods to free (``claimTemplate.rebindAfterSeconds``).

Pure: inputs are the objects as read from the API and the clock. A local-NVMe PersistentVolume
carries ``spec.nodeAffinity`` (the node its disk is in); a claim bound to it pins the pod to that
node. When the node is deleted, drained (``unschedulable``) or not Ready, the StatefulSet's pod
stays ``Pending`` for good: the scheduler cannot place it anywhere else, and the StatefulSet
controller recreates it with the same claim. The SSD tier is a cache (mori 1.2.4 even discards
its segment files at start), so after ``rebindAfterSeconds`` the operator deletes the claim and
the pod; the StatefulSet recreates both and the new claim binds where the pod is scheduled.

A pod is *stranded* when all hold:

* it has no node (``spec.nodeName`` empty), is ``Pending`` and is not being deleted;
* its SSD claim (``<volume>-<pod>``, the StatefulSet's name for a volumeClaimTemplate) is bound
  to a PersistentVolume (``spec.volumeName``) with required node affinity;
* no node that is Ready and schedulable matches that affinity (``nodeSelectorTerms`` are ORed,
  the expressions and fields of one term ANDed; operators In, NotIn, Exists, DoesNotExist,
  Gt, Lt; fields: ``metadata.name``).

It is *due* once it has been Pending for ``after`` seconds, counted from its ``PodScheduled``
condition's ``lastTransitionTime`` (else its creation).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Stranded:
    pod: str
    claim: str
    volume: str  # the PersistentVolume
    why: str  # what is wrong with the node(s) it may run on
    pending_since: float  # epoch seconds
    due_at: float  # epoch seconds: when the claim and pod are deleted

    def due(self, now: float) -> bool:
        return now >= self.due_at


def claim_of(pod: Obj, volume: str) -> str:
    """The claim name of the pod's SSD volume, as the pod spec names it (the StatefulSet
    names it ``<volume>-<pod>``)."""
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if v.get("name") == volume and v.get("persistentVolumeClaim"):
            return str(v["persistentVolumeClaim"].get("claimName", ""))
    return ""


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def pending_since(pod: Obj) -> float | None:
    """When the pod became (and stayed) Pending without a node; ``None``: it is not."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or spec.get("nodeName") or \
            status.get("phase", "Pending") != "Pending":
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            since = _epoch(cond.get("lastTransitionTime"))
            if since is not None:
                return since
    return _epoch(meta.get("creationTimestamp"))


def bound_volumes(pods: Sequence[Obj], claims: Sequence[Obj], volume: str) -> dict[str, str]:
    """{pod: PersistentVolume} for the Pending, unscheduled pods whose SSD claim is bound: the
    PersistentVolumes worth reading (none in a healthy cluster, so no read at all)."""
    by_name = {(c.get("metadata") or {}).get("name"): c for c in claims}
    out: dict[str, str] = {}
    for pod in pods:
        if pending_since(pod) is None:
            continue
        claim = by_name.get(claim_of(pod, volume))
        pv = ((claim or {}).get("spec") or {}).get("volumeName")
        if pv and ((claim or {}).get("status") or {}).get("phase") == "Bound":
            out[str(pod["metadata"]["name"])] = str(pv)
    return out


def _matches(expr: Obj, values: Mapping[str, str]) -> bool:
    key, op, want = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    have = values.get(key)
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and want:
        try:
            a, b = int(have), int(want[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_matches(affinity: Obj, node: Obj) -> bool:
    """Whether ``node`` satisfies a PersistentVolume's ``spec.nodeAffinity``."""
    terms = ((affinity.get("required") or {}).get("nodeSelectorTerms")) or []
    if not terms:
        return True
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    fields = {"metadata.name": str(meta.get("name", ""))}
    return any(
        all(_matches(e, labels) for e in t.get("matchExpressions") or [])
        and all(_matches(e, fields) for e in t.get("matchFields") or [])
        and (t.get("matchExpressions") or t.get("matchFields"))
        for t in terms)


def usable(node: Obj) -> bool:
    """Ready and schedulable (not cordoned or drained)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _why(affinity: Obj, nodes: Sequence[Obj]) -> str:
    named = [n for n in nodes if node_matches(affinity, n)]
    if not named:
        return "its node no longer exists"
    states = []
    for n in named:
        name = n["metadata"]["name"]
        states.append(f"node {name} is " + ("cordoned (unschedulable)"
                                            if (n.get("spec") or {}).get("unschedulable")
                                            else "not Ready"))
    return "; ".join(states)


def stranded(pods: Sequence[Obj], claims: Sequence[Obj], volumes: Mapping[str, Obj],
             nodes: Sequence[Obj], volume: str, after_s: int) -> list[Stranded]:
    """Every stranded pod (module docstring), due or not, by pod name. ``volumes``: the
    PersistentVolumes of :func:`bound_volumes`, by name (a missing one is skipped)."""
    pending = bound_volumes(pods, claims, volume)
    out: list[Stranded] = []
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        name = str(pod["metadata"]["name"])
        pv = volumes.get(pending.get(name, ""))
        if pv is None:
            continue
        affinity = (pv.get("spec") or {}).get("nodeAffinity") or {}
        if not (affinity.get("required") or {}).get("nodeSelectorTerms"):
            continue  # not pinned to a node
        if any(usable(n) and node_matches(affinity, n) for n in nodes):
            continue
        since = pending_since(pod)
        assert since is not None
        out.append(Stranded(pod=name, claim=claim_of(pod, volume),
                            volume=str(pv["metadata"]["name"]), why=_why(affinity, nodes),
                            pending_since=since, due_at=since + after_s))
    return out
