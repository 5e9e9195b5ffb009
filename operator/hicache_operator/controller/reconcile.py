"""One reconcile of one SGLangHiCache: plan, apply children, prune, observe, write status.

Kopf-free: the handlers call ``Reconciler.reconcile(body, trigger)`` and post the returned
events. Reads are one LIST per child kind (by the instance label) plus pods and PVCs; writes
happen only for what differs (see ``diff``), so an unchanged world costs zero writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import API_VERSION, KIND
from ..planner.errors import SpecError
from . import diff, metrics, status
from .kube import CHILD_KINDS, KubeClient, KubeError

Obj = dict[str, Any]
ChildKey = tuple[str, str, str]  # apiVersion, kind, name
INSTANCE_LABEL = "app.kubernetes.io/instance"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
APP_NAME = "sglang-hicache"
SSD_CLAIM_COMPONENT = "cache"  # the component label of the SSD volumeClaimTemplates
# A CR that sets this (spec.l3.ssd.volume.claimTemplate.<field>) has its SSD PVCs deleted with it.
DELETE_VOLUMES_FIELD = "deleteWithResource"
log = logging.getLogger("hicache_operator.controller")


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Result:
    valid: bool
    writes: int = 0
    events: list[Event] = field(default_factory=list)
    status: Obj = field(default_factory=dict)


@dataclass
class _CrState:
    uid: str
    desired: dict[ChildKey, Obj] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queued: bool = False  # a status/drift refresh is already waiting for the lock
    deleting: bool = False  # the delete handler runs: nothing may recreate children
    phase: str = ""  # last computed status.phase (for the resources-by-phase gauge)


def _claim_template(body: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = body.get("spec") or {}
    ssd = ((spec.get("l3") or {}).get("ssd") or {})
    return ((ssd.get("volume") or {}).get("claimTemplate") or {})


def delete_volumes_with_cr(body: Mapping[str, Any]) -> bool:
    return bool(_claim_template(body).get(DELETE_VOLUMES_FIELD, False))


def instance_selector(name: str) -> str:
    """The label selector of one CR's objects. Both labels, not the instance label alone: other
    tools (Helm releases, for one) set ``app.kubernetes.io/instance`` too, and a same-named
    release's pods or PVCs must neither count in this CR's status nor be deleted with it."""
    return f"{NAME_LABEL}={APP_NAME},{INSTANCE_LABEL}={name}"


# StatefulSet spec fields the API server refuses to update (everything but replicas, ordinals,
# template, updateStrategy, revisionHistoryLimit, persistentVolumeClaimRetentionPolicy and
# minReadySeconds). Changing one means: delete the StatefulSet orphaning its pods, create it
# anew; the new one adopts the running pods and rolls them if the template changed too.
STATEFULSET_UPDATABLE = frozenset({"replicas", "ordinals", "template", "updateStrategy",
                                   "revisionHistoryLimit", "persistentVolumeClaimRetentionPolicy",
                                   "minReadySeconds"})


def needs_recreate(kind: str, patch: Mapping[str, Any]) -> list[str]:
    """The immutable fields a patch would change (empty: a patch is enough)."""
    if kind != "StatefulSet":
        return []
    return sorted(set(patch.get("spec") or {}) - STATEFULSET_UPDATABLE)


def _key(obj: Mapping[str, Any]) -> ChildKey:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def _default_plan(body: Mapping[str, Any], config: Any) -> Any:
    from ..planner import plan  # imported lazily: the planner is heavier than the handlers

    return plan(body, config)


class Reconciler:
    """Holds the per-CR memory of what was last applied (for cheap drift checks)."""

    def __init__(self, kube: KubeClient, config: Any,
                 plan_fn: Callable[[Mapping[str, Any], Any], Any] = _default_plan) -> None:
        self.kube, self.config, self.plan_fn = kube, config, plan_fn
        self.crs: dict[tuple[str, str], _CrState] = {}

    def _state(self, namespace: str, name: str, uid: str) -> _CrState:
        state = self.crs.get((namespace, name))
        if state is None or state.uid != uid:
            state = self.crs[(namespace, name)] = _CrState(uid)
        return state

    def begin_delete(self, namespace: str, name: str, uid: str) -> asyncio.Lock:
        """Stop reconciles of this CR for good; returns the lock to hold while deleting."""
        state = self._state(namespace, name, uid)
        state.deleting = True
        return state.lock

    def forget(self, namespace: str, name: str) -> None:
        self.crs.pop((namespace, name), None)
        self._update_gauges()

    def _update_gauges(self) -> None:
        counts: dict[str, int] = {}
        for state in self.crs.values():
            for _, kind, _ in state.desired:
                counts[kind] = counts.get(kind, 0) + 1
        for kind in {k for _, k in CHILD_KINDS} | set(counts):
            metrics.MANAGED_OBJECTS.labels(kind).set(counts.get(kind, 0))
        phases: dict[str, int] = {}
        for state in self.crs.values():
            if state.phase:
                phases[state.phase] = phases.get(state.phase, 0) + 1
        for phase in ("Pending", "Progressing", "Ready", "Degraded", "Invalid"):
            metrics.RESOURCES.labels(phase).set(phases.get(phase, 0))

    # ------------------------------------------------------------------ drift checks
    def owner_of(self, child: Mapping[str, Any]) -> tuple[str, str] | None:
        meta = child.get("metadata") or {}
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == KIND and ref.get("controller"):
                return (meta.get("namespace", ""), ref.get("name", ""))
        return None

    def drifted(self, child: Mapping[str, Any], event_type: str | None) -> tuple[str, str] | None:
        """The owner to reconcile when this child event shows drift from what was applied."""
        owner = self.owner_of(child)
        state = self.crs.get(owner) if owner else None
        if owner is None or state is None:
            return None
        refs = (child.get("metadata") or {}).get("ownerReferences") or []
        if not any(r.get("uid") == state.uid for r in refs):
            return None
        wanted = state.desired.get(_key(child))
        if wanted is None:
            return owner if event_type != "DELETED" else None  # an unwanted child lingers
        if event_type == "DELETED" or not diff.covers(child, wanted):
            return owner
        return None

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, body: Mapping[str, Any], trigger: str) -> Result:
        """Reconcile the CR ``body`` names; its current state is read afresh under the lock
        (kopf's copy may lag behind: a stale status would cause needless writes)."""
        meta = body["metadata"]
        state = self._state(meta["namespace"], meta["name"], meta["uid"])
        async with state.lock:
            started = time.perf_counter()
            fresh = await self.kube.get(API_VERSION, KIND, meta["namespace"], meta["name"])
            if fresh is None or fresh["metadata"].get("uid") != meta["uid"] or state.deleting \
                    or fresh["metadata"].get("deletionTimestamp"):
                return Result(valid=True, status=dict(body.get("status") or {}))
            try:
                result = await self._reconcile(fresh, state)
            except (KubeError, OSError, asyncio.TimeoutError):
                metrics.RECONCILES.labels(trigger, "retry").inc()
                raise
            except Exception:
                metrics.RECONCILES.labels(trigger, "error").inc()
                raise
            finally:
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
            metrics.RECONCILES.labels(trigger, "ok" if result.valid else "invalid").inc()
            self._update_gauges()
            return result

    async def _reconcile(self, body: Mapping[str, Any], state: _CrState) -> Result:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        spec = body.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        previous = dict(body.get("status") or {})
        events: list[Event] = []
        writes = 0
        try:
            planned = self.plan_fn(body, self.config)
        except SpecError as exc:
            planned = None
            outcome = status.Outcome(replicas=replicas, problems=list(exc.problems))
        else:
            outcome = status.Outcome(replicas=replicas, status_plan=planned.status_plan,
                                     warnings=list(planned.warnings))

        selector = instance_selector(name)
        live: dict[ChildKey, Obj] = {}
        for api_version, kind in CHILD_KINDS:
            for obj in await self.kube.list(api_version, kind, namespace, selector):
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                live[_key(obj)] = obj

        if planned is not None:
            desired = {_key(d): d for d in (self._desired(obj, body) for obj in planned.objects)}
            state.desired = desired
            applied: list[str] = []
            for key, want in desired.items():
                have = live.get(key)
                if have is not None and not diff.owned_by(have, meta["uid"]):
                    events.append(Event("Warning", "ObjectConflict",
                                        f"{key[1]} {key[2]} exists and is not owned by this "
                                        "SGLangHiCache; not touching it"))
                    continue
                live[key], verb = await self._apply(want, have)
                if verb:
                    writes += 1
                    applied.append(f"{verb} {key[1]} {key[2]}")
            for key, have in list(live.items()):
                if key not in desired and diff.owned_by(have, meta["uid"]):
                    await self.kube.delete(key[0], key[1], namespace, key[2])
                    metrics.WRITES.labels("delete", key[1]).inc()
                    live.pop(key)
                    writes += 1
                    applied.append(f"deleted {key[1]} {key[2]}")
            if applied:
                events.append(Event("Normal", "Applied", "; ".join(applied)))

        sts = next((obj for (_, kind, _), obj in live.items() if kind == "StatefulSet"), None)
        pods = await self.kube.list("v1", "Pod", namespace, selector)
        pvcs = await self.kube.list("v1", "PersistentVolumeClaim", namespace, selector)
        observed = status.Observed(statefulset=sts, pods=pods, pvcs=pvcs)
        new_status = status.compute_status(generation=int(meta.get("generation") or 1),
                                           outcome=outcome, observed=observed, previous=previous)
        state.phase = str(new_status.get("phase", ""))
        events.extend(_transition_events(previous, new_status, planned))
        if not status.same_status(previous, new_status):
            patch: Obj = {k: None for k in previous if k not in new_status}
            patch.update(new_status)
            await self.kube.merge_patch(API_VERSION, KIND, namespace, name, {"status": patch},
                                        subresource="status")
            metrics.WRITES.labels("patch", f"{KIND}/status").inc()
            writes += 1
        return Result(valid=planned is not None, writes=writes, events=events, status=new_status)

    def _desired(self, obj: Mapping[str, Any], owner: Mapping[str, Any]) -> Obj:
        out = dict(obj)
        meta = dict(out.get("metadata") or {})
        meta["namespace"] = owner["metadata"]["namespace"]
        meta["ownerReferences"] = [diff.owner_reference(owner)]
        out["metadata"] = meta
        return diff.with_last_applied(out)

    async def _apply(self, want: Obj, have: Obj | None) -> tuple[Obj, str]:
        meta = want["metadata"]
        if have is None:
            try:
                created = await self.kube.create(want)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                fetched = await self.kube.get(want["apiVersion"], want["kind"],
                                              meta["namespace"], meta["name"])
                if fetched is None:
                    raise
                have = fetched  # created meanwhile (another reconcile or a restarted operator)
            else:
                metrics.WRITES.labels("create", want["kind"]).inc()
                return created, "created"
        patch = diff.apply_patch(want, have)
        if patch is None:
            return have, ""
        immutable = needs_recreate(want["kind"], patch)
        if immutable:
            await self.kube.delete(want["apiVersion"], want["kind"], meta["namespace"],
                                   meta["name"], propagation="Orphan")
            metrics.WRITES.labels("delete", want["kind"]).inc()
            created = await self.kube.create(want)
            metrics.WRITES.labels("create", want["kind"]).inc()
            return created, f"recreated (immutable {', '.join(immutable)} changed; pods kept)"
        patched = await self.kube.merge_patch(want["apiVersion"], want["kind"],
                                              meta["namespace"], meta["name"], patch)
        metrics.WRITES.labels("patch", want["kind"]).inc()
        return patched, "updated"


def _transition_events(before: Mapping[str, Any], after: Mapping[str, Any],
                       planned: Any) -> list[Event]:
    """Events for what changed, so an unchanged world posts nothing (no event storms)."""
    events: list[Event] = []
    old_spec, new_spec = status.condition(before, "SpecValid"), status.condition(after,
                                                                                 "SpecValid")
    if new_spec.get("status") == "False" and old_spec.get("message") != new_spec.get("message"):
        events.append(Event("Warning", "InvalidSpec", str(new_spec.get("message"))))
    if planned is not None and before.get("plan") != after.get("plan"):
        summary = planned.summary() if hasattr(planned, "summary") else "planned"
        events.append(Event("Normal", "Sized", str(summary)[:1000]))
        for warning in planned.warnings:
            events.append(Event("Warning", "PlanWarning", str(warning)))
    old_deg, new_deg = status.condition(before, "Degraded"), status.condition(after, "Degraded")
    if new_deg.get("status") == "True" and (old_deg.get("status"), old_deg.get("reason")) != (
            "True", new_deg.get("reason")):
        events.append(Event("Warning", str(new_deg.get("reason")), str(new_deg.get("message"))))
    old_ready, new_ready = status.condition(before, "Ready"), status.condition(after, "Ready")
    if new_ready.get("status") == "True" and old_ready.get("status") != "True":
        events.append(Event("Normal", "Ready", str(new_ready.get("message"))))
    return events
