"""One reconcile of one SGLangHiCache: plan, grow SSD claims, apply children, prune, observe,
write status.

Kopf-free: the handlers call ``Reconciler.reconcile(body, trigger)`` and post the returned
events. Reads are one LIST per child kind (by the instance label) plus pods and PVCs; writes
happen only for what differs (see ``diff`` and ``apply``), so an unchanged world costs zero
writes. A spec the planner refuses, or on which it fails, becomes ``SpecValid=False`` (written
once: an unchanged status is not rewritten); a child the API server refuses becomes
``Degraded``/``ObjectRejected`` with a backoff; neither is ever retried in a hot loop.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from ..api import API_VERSION, KIND
from ..cachestats.observer import CacheObservation, CacheObserver
from ..planner.errors import SpecError
from . import diff, inplace, kubectl, metrics, status, volumes
from .apply import ChildKey, ChildMemory, ChildWriter
from .claims import check_claims
from .kube import CHILD_KINDS, KubeClient, KubeError
from .logs import cr_logger
from .namespaces import pod_security_label
from .router_status import RouterReader, router_block, router_pod_selector, router_serving
from .slots import PrioritySlots
from .transitions import Event, transition_events

Obj = dict[str, Any]
INSTANCE_LABEL = "app.kubernetes.io/instance"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
APP_NAME = "sglang-hicache"
SSD_CLAIM_COMPONENT = "cache"  # the component label of the SSD volumeClaimTemplates
# Reconciles in flight at once (200 CRs at once would hold 200 plans and bodies in memory for
# no throughput gain in one CPU-bound process); new and changed CRs first (``slots``).
MAX_CONCURRENT_RECONCILES = 16


@dataclass
class Result:
    valid: bool
    writes: int = 0
    events: list[Event] = field(default_factory=list)
    status: Obj = field(default_factory=dict)
    recheck_s: float | None = None  # an in-place rollout waits for time to pass (a grace, a pull)


@dataclass
class _CrState:
    uid: str
    desired: dict[ChildKey, Obj] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queued: bool = False  # a status/drift refresh is already waiting for the lock
    deleting: bool = False  # the delete handler runs: nothing may recreate children
    phase: str = ""  # last computed status.phase (for the resources-by-phase gauge)
    # (state.desired: what was applied, minus the last-applied annotation; for drift checks)
    generation: int | None = None  # the last generation reconciled without API trouble
    failures: int = 0  # consecutive reconciles that hit API trouble
    children: ChildMemory = field(default_factory=ChildMemory)
    planner_failure: str = ""  # the unexpected planner error last logged (logged once)
    freed: dict[str, str] = field(default_factory=dict)  # pod -> why its SSD claim was deleted


def instance_selector(name: str) -> str:
    """The label selector of one CR's objects. Both labels, not the instance label alone: other
    tools (Helm releases, for one) set ``app.kubernetes.io/instance`` too, and a same-named
    release's pods or PVCs must neither count in this CR's status nor be deleted with it."""
    return f"{NAME_LABEL}={APP_NAME},{INSTANCE_LABEL}={name}"


def _key(obj: Mapping[str, Any]) -> ChildKey:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def _default_plan(body: Mapping[str, Any], config: Any, router_serving: bool = True,
                  pod_security: str | None = None) -> Any:
    from ..plan import plan  # imported lazily: the planner is heavier than the handlers

    return plan(body, config, router_serving=router_serving, pod_security=pod_security)


class Reconciler:
    """Holds the per-CR memory of what was last applied (for cheap drift checks)."""

    def __init__(self, kube: KubeClient, config: Any,
                 plan_fn: Callable[[Mapping[str, Any], Any, bool, str | None], Any]
                 = _default_plan,
                 serving_checks: Sequence[inplace.ServingCheck] = ()) -> None:
        self.kube, self.config, self.plan_fn = kube, config, plan_fn
        # Beyond a pod's Ready condition, what "serving" means to an in-place rollout (e.g. a
        # router's worker set); each restarted pod must pass them all before the next.
        self.serving_checks: list[inplace.ServingCheck] = list(serving_checks)
        self.crs: dict[tuple[str, str], _CrState] = {}
        self.writer = ChildWriter(kube)
        self.observer = CacheObserver(config.cache_metrics, on_scrape=metrics.record_scrape)
        self.router_reader = RouterReader(config.cache_metrics.timeout_seconds)
        self._slots: PrioritySlots | None = None

    def _state(self, namespace: str, name: str, uid: str) -> _CrState:
        state = self.crs.get((namespace, name))
        if state is None or state.uid != uid:
            state = self.crs[(namespace, name)] = _CrState(uid)
            self.observer.forget((namespace, name))
            self.router_reader.forget((namespace, name))
        return state

    async def close(self) -> None:
        await self.observer.close()
        await self.router_reader.close()

    def trigger_for(self, meta: Mapping[str, Any], listed: bool) -> str | None:
        """Why an event of the CR needs a reconcile (None: its generation was reconciled)."""
        state = self.crs.get((meta["namespace"], meta["name"]))
        if state is None or state.uid != meta.get("uid"):
            return "resume" if listed else "create"
        if state.generation != meta.get("generation"):
            return "update"
        return None

    def succeeded(self, key: tuple[str, str]) -> None:
        state = self.crs.get(key)
        if state is not None:
            state.failures = 0

    def failed(self, key: tuple[str, str]) -> int:
        """Count a reconcile that hit API trouble; returns the consecutive failures."""
        state = self.crs.get(key)
        if state is None:
            return 1
        state.failures += 1
        return state.failures

    def begin_delete(self, namespace: str, name: str, uid: str) -> asyncio.Lock:
        """Stop reconciles of this CR for good; returns the lock to hold while deleting."""
        state = self._state(namespace, name, uid)
        state.deleting = True
        return state.lock

    def forget(self, namespace: str, name: str) -> None:
        self.crs.pop((namespace, name), None)
        self.observer.forget((namespace, name))
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
        if self._slots is None:
            self._slots = PrioritySlots(MAX_CONCURRENT_RECONCILES)
        changed = meta.get("generation") != (body.get("status") or {}).get("observedGeneration")
        async with state.lock, self._slots.slot(urgent=changed):
            started = time.perf_counter()
            fresh = await self.kube.get(API_VERSION, KIND, meta["namespace"], meta["name"])
            if fresh is None or fresh["metadata"].get("uid") != meta["uid"] or state.deleting \
                    or fresh["metadata"].get("deletionTimestamp"):
                return Result(valid=True, status=dict(body.get("status") or {}))
            try:
                result = await self._reconcile(fresh, state, trigger)
            except (KubeError, aiohttp.ClientError, asyncio.TimeoutError):
                metrics.RECONCILES.labels(trigger, "retry").inc()
                raise
            except Exception:
                metrics.RECONCILES.labels(trigger, "error").inc()
                raise
            finally:
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
            state.generation = fresh["metadata"].get("generation")
            metrics.RECONCILES.labels(trigger, "ok" if result.valid else "invalid").inc()
            self._update_gauges()
            return result

    def _plan(self, body: Mapping[str, Any], state: _CrState, router_serving: bool = True,
              pod_security: str | None = None) -> tuple[Any, status.Outcome]:
        """The plan, or the outcome saying why there is none. Never raises for a bad spec: an
        unexpected planner error is a spec problem too (logged with its traceback once)."""
        spec = body.get("spec") or {}
        replicas = int(spec.get("replicas", 1)) if isinstance(spec.get("replicas", 1), int) else 0
        cfg = self.config.cache_metrics
        try:
            planned = self.plan_fn(body, self.config, router_serving, pod_security)
        except SpecError as exc:
            return None, status.Outcome(replicas=replicas, problems=list(exc.problems),
                                        spec_reason=exc.reason)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if state.planner_failure != text:
                state.planner_failure = text
                meta = body["metadata"]
                cr_logger(meta["namespace"], meta["name"]).error(
                    "the planner failed on this spec (reported as SpecValid=False):\n%s",
                    "".join(traceback.format_exception(exc)))
            return None, status.Outcome(
                replicas=replicas, spec_reason="PlanningFailed",
                problems=[("spec", f"the operator could not plan this spec ({text}); "
                           "please report it with the CR")])
        state.planner_failure = ""
        strategy = planned.spec.update_strategy
        return planned, status.Outcome(
            replicas=planned.spec.replicas, status_plan=planned.status_plan,
            warnings=list(planned.warnings), cache_tiers=planned.cache_tiers(),
            on_delete=strategy.type == "OnDelete",
            partition=strategy.rolling_update.partition if strategy.rolling_update else 0,
            min_ratio_change=cfg.min_ratio_change,
            window_seconds=cfg.window_seconds if cfg.enabled else None)

    async def _grow_claims(self, planned: Any, pvcs: list[Obj], namespace: str,
                           outcome: status.Outcome) -> tuple[status.Outcome, list[str]]:
        """Expand the SSD claims the plan outgrew, or turn the outcome into a refusal."""
        sizes = planned.ssd_claim_sizes
        small = volumes.claims_to_grow(sizes, planned.name, pvcs)  # StatefulSet = CR name
        if not small:
            return outcome, []
        classes: dict[str, Obj | None] = {}
        for name in {volumes.storage_class_of(p) for p, _size in small} - {""}:
            classes[name] = await self.kube.get("storage.k8s.io/v1", "StorageClass", None, name)
        expansion = volumes.plan_expansion(small, classes)
        if expansion.refusal is not None:
            where = (volumes.SIZE_FIELD if planned.spec.l3.ssd.volume is not None
                     else volumes.SIZES_FIELD)
            return status.Outcome(replicas=outcome.replicas, spec_reason="VolumeExpansionRefused",
                                  problems=[(where, expansion.refusal)]), []
        done = []
        for claim, patch in sorted(expansion.patches.items()):
            await self.kube.merge_patch("v1", "PersistentVolumeClaim", namespace, claim, patch)
            metrics.WRITES.labels("patch", "PersistentVolumeClaim").inc()
            done.append(f"expanded PersistentVolumeClaim {claim}")
        return outcome, done

    async def _reconcile(self, body: Mapping[str, Any], state: _CrState,
                         trigger: str) -> Result:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        previous = dict(body.get("status") or {})
        events: list[Event] = []
        writes = 0
        selector = instance_selector(name)
        live: dict[ChildKey, Obj] = {}
        for api_version, kind in CHILD_KINDS:
            for obj in await self.kube.list(api_version, kind, namespace, selector):
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                live[_key(obj)] = obj
        planned, outcome = self._plan(body, state, router_serving(live, name),
                                      await pod_security_label(self.kube, namespace))

        pvcs = await self.kube.list("v1", "PersistentVolumeClaim", namespace, selector)
        applied: list[str] = []
        if planned is not None:
            outcome, applied = await self._grow_claims(planned, pvcs, namespace, outcome)
            writes += len(applied)
            if outcome.problems:
                planned = None
        pods = await self.kube.list("v1", "Pod", namespace, selector)
        claims = await check_claims(self.kube, namespace, planned, pods, pvcs, state.freed)
        writes += claims.writes
        events.extend(claims.events)

        rejections: list[str] = []
        decision = None
        if planned is not None:
            planned_objects = {_key(o): o for o in planned.objects}
            events.extend(kubectl.outside_events(live.values(), meta["uid"]))
            decision = await inplace.decide(
                planned, body, planned_objects, live, pods,
                self._serving_checks(planned, live, (namespace, name)),
                self.config.rollout, list_pulls=inplace.pull_lister(self.kube, namespace, name),
                leaving_check=inplace.router_leaving(self.kube, self.router_reader, planned,
                                                     live, (namespace, name)))
            desired = {k: self._desired(o, body) for k, o in planned_objects.items()}
            # Drift checks need no copy of the last-applied annotation (it repeats the object).
            state.desired = {k: diff.without_last_applied(v) for k, v in desired.items()}
            for key, want in desired.items():
                have = live.get(key)
                if have is not None and not diff.owned_by(have, meta["uid"]):
                    events.append(Event("Warning", "ObjectConflict",
                                        f"{key[1]} {key[2]} exists and is not owned by this "
                                        "SGLangHiCache; not touching it"))
                    continue
                done = await self.writer.apply(key, want, have, state.children)
                if done.obj is not None:
                    live[key] = done.obj
                if done.rejection is not None:
                    rejections.append(done.rejection.describe(key))
                if done.verb:
                    writes += 1 + done.verb.startswith("recreated")
                    applied.append(f"{done.verb} {key[1]} {key[2]}")
                if done.dropped:
                    events.append(Event("Warning", "FieldsNotPersisted",
                                        f"the API server did not keep {', '.join(done.dropped)}"
                                        f" of {key[1]} {key[2]} (a feature gate of this "
                                        "cluster may be off); not re-sending them"))
            for key, have in list(live.items()):
                if key not in desired and diff.owned_by(have, meta["uid"]):
                    await self.kube.delete(key[0], key[1], namespace, key[2])
                    metrics.WRITES.labels("delete", key[1]).inc()
                    live.pop(key)
                    writes += 1
                    applied.append(f"deleted {key[1]} {key[2]}")
            outcome = _with_rejections(outcome, rejections)
        if applied:
            events.append(Event("Normal", "Applied", "; ".join(applied)))
        events.extend(await inplace.drain_router(self.kube, self.router_reader, planned, live,
                                                 pods, (namespace, name)))
        step = await inplace.send_patches(self.kube, body, decision)
        writes += step.writes
        events.extend(step.events)
        pods = step.pods(pods)
        outcome = inplace.with_rollout(outcome, decision)

        sts = next((obj for (_, kind, _), obj in live.items() if kind == "StatefulSet"), None)
        cache = await self._observe_cache(planned, trigger, (namespace, name), pods)
        router_status, router_issues = await self._observe_router(
            planned, trigger, (namespace, name), live, pods)
        observed = status.Observed(statefulset=sts, pods=pods, pvcs=pvcs, cache=cache,
                                   router=router_status, router_issues=tuple(router_issues),
                                   volume_issues=tuple(claims.issues))
        new_status = status.compute_status(generation=int(meta.get("generation") or 1),
                                           outcome=outcome, observed=observed, previous=previous)
        state.phase = str(new_status.get("phase", ""))
        events.extend(transition_events(previous, new_status, planned))
        if not status.same_status(previous, new_status):
            patch = _with_removals(previous, new_status)
            await self.kube.merge_patch(API_VERSION, KIND, namespace, name, {"status": patch},
                                        subresource="status")
            metrics.WRITES.labels("patch", f"{KIND}/status").inc()
            writes += 1
        return Result(valid=planned is not None, writes=writes, events=events, status=new_status,
                      recheck_s=decision.recheck_s if decision is not None else None)

    async def _observe_cache(self, planned: Any, trigger: str, key: tuple[str, str],
                             pods: list[Obj]) -> CacheObservation | None:
        """Scrape the engines' metrics: on the resync timer only (bounded, once a period)."""
        if planned is None or trigger != "timer" or not self.config.cache_metrics.enabled:
            return None
        return await self.observer.observe(key, pods, planned.spec.engine.port)

    def _serving_checks(self, planned: Any, live: Mapping[ChildKey, Obj],
                        key: tuple[str, str]) -> list[inplace.ServingCheck]:
        """What "serving" means to an in-place rollout of this CR: Ready, plus the router's
        worker set (read afresh) where a router serves the CR's Service."""
        routed = inplace.router_routed(self.kube, self.router_reader, planned, live, key)
        return [*self.serving_checks, *([routed] if routed is not None else [])]

    async def _observe_router(self, planned: Any, trigger: str, key: tuple[str, str],
                              live: Mapping[ChildKey, Obj], pods: list[Obj],
                              ) -> tuple[Obj | None, list[tuple[str, str]]]:
        """``status.router``: the Deployment's pods and, on the resync timer, the router's own
        worker list (``router_status``)."""
        if planned is None or getattr(planned, "router", None) is None:
            self.router_reader.forget(key)
            return None, []
        namespace, name = key
        deployment = live.get(("apps/v1", "Deployment", f"{name}-router"))
        if trigger == "timer" or self.router_reader.last(key) is None:  # first: steady status
            router_pods = await self.kube.list("v1", "Pod", namespace,
                                               router_pod_selector(name))
            await self.router_reader.observe(key, router_pods, planned.spec.router.port)
        hc = planned.spec.router.health_check
        grace = hc.interval_seconds * (hc.success_threshold + hc.failure_threshold) + 30
        return router_block(deployment=deployment, serving=router_serving(live, name),
                            engine_pods=pods, observation=self.router_reader.last(key),
                            grace_s=grace)

    def _desired(self, obj: Mapping[str, Any], owner: Mapping[str, Any]) -> Obj:
        out = dict(obj)
        meta = dict(out.get("metadata") or {})
        meta["namespace"] = owner["metadata"]["namespace"]
        meta["ownerReferences"] = [diff.owner_reference(owner)]
        out["metadata"] = meta
        return diff.with_last_applied(out)


def _with_removals(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """A JSON merge patch from ``old`` to ``new``: a merge patch keeps keys it does not name,
    so keys gone from ``new`` (at any depth of nested objects) are sent as null."""
    out: Obj = dict(new)
    for key, value in old.items():
        if key not in new:
            out[key] = None
        elif isinstance(value, Mapping) and isinstance(new[key], Mapping):
            out[key] = _with_removals(value, new[key])
    return out


def _with_rejections(outcome: status.Outcome, rejections: list[str]) -> status.Outcome:
    return replace(outcome, rejections=tuple(rejections)) if rejections else outcome
