"""Kopf handlers: thin glue between kopf's triggers and ``Reconciler``.

- every event of an SGLangHiCache (listing at start, create, spec change): reconcile when its
  ``metadata.generation`` was not reconciled yet (our own status writes do not re-trigger);
- a timer (the operator configuration's ``resyncSeconds``, default 60) re-reconciles: drift
  correction, status and the cache figures scraped from the pods; an unchanged world writes nothing;
- API trouble is retried in memory with a backoff (1 s ... 60 s), never by writing to the CR;
- child events (StatefulSet, Services, ConfigMap, PDB, the router's Deployment, ServiceAccount,
  Role and RoleBinding) reconcile the owner when they show drift from what was last applied;
  pod, StatefulSet and Deployment events refresh the owner's status (the router's Deployment
  becoming available points the CR's Service at it);
- delete: children go (PVCs only when the CR asks), then kopf releases the finalizer.

Why ``on.event`` and not kopf's create/update/resume handlers: those keep handler progress and
the last-handled spec in annotations of the CR, and under load kopf can handle an event older
than its own annotation patch (after ``consistency_timeout``), treat it as a new creation and
write the annotations again: ``PATCH sglanghicaches`` in a resync where nothing changed. The
reconcile is level-triggered (it reads the CR afresh and writes only differences), so it needs
no diff-base; kopf's only write to the CR is the finalizer, once (``settings.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import kopf

from ..api import API_VERSION as CR_API_VERSION
from ..api import GROUP, KIND, PLURAL, VERSION, OperatorConfig
from . import settings as operator_settings
from .kube import CHILD_KINDS, KubeClient, KubeError
from .logs import cr_logger, log
from .reconcile import (
    APP_NAME,
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    NAME_LABEL,
    SSD_CLAIM_COMPONENT,
    Reconciler,
    Result,
    instance_selector,
)
from .volumes import delete_volumes_with_cr

# kopf takes a timer's interval when the handler is registered, i.e. when this module is
# imported: the configuration is read here once (a changed configuration restarts the operator:
# the chart's checksum annotation).
RESYNC_SECONDS = OperatorConfig.from_env().resync_seconds
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # per consecutive failure of one CR
TRANSIENT = (KubeError, aiohttp.ClientError, asyncio.TimeoutError)


@dataclass
class Runtime:
    kube: KubeClient
    reconciler: Reconciler


_info: kopf.ConnectionInfo | None = None
_runtime: Runtime | None = None
_retries: dict[tuple[str, str], asyncio.Task[None]] = {}
_rechecks: dict[tuple[str, str], asyncio.Task[None]] = {}


def runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        if _info is None:
            raise kopf.TemporaryError("not logged in to the Kubernetes API yet", delay=1)
        kube = KubeClient(_info)
        _runtime = Runtime(kube, Reconciler(kube, OperatorConfig.from_env()))
    return _runtime


# ---------------------------------------------------------------------- operator lifecycle
@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    global _runtime
    _runtime = None  # a fresh reconciler per operator run (KopfRunner reuses the process)
    config = OperatorConfig.from_env()  # fail fast on a bad configuration file
    log.setLevel(config.log_level)
    operator_settings.configure(settings)
    logger.info("sglang-hicache operator configured: resync every %ss, image %s, cache "
                "metrics %s", RESYNC_SECONDS, config.default_image,
                "on" if config.cache_metrics.enabled else "off")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    global _info
    _info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    return _info


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    global _runtime
    for task in [*_retries.values(), *_rechecks.values()]:
        task.cancel()
    _retries.clear()
    _rechecks.clear()
    if _runtime is not None:
        await _runtime.reconciler.close()
        await _runtime.kube.close()
    _runtime = None


# ---------------------------------------------------------------------- the custom resource
def _post(body: Mapping[str, Any], result: Result) -> None:
    for event in result.events:
        kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason,
                   message=event.message)


async def _reconcile(body: Mapping[str, Any], trigger: str) -> None:
    """One reconcile; transient API trouble schedules a retry with backoff instead."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    try:
        result = await runtime().reconciler.reconcile(body, trigger)
    except TRANSIENT as exc:
        _schedule_retry(key, exc)
        return
    runtime().reconciler.succeeded(key)
    _post(body, result)
    if result.recheck_s is not None:
        _schedule_recheck(key, result.recheck_s)


def _schedule_recheck(key: tuple[str, str], delay: float) -> None:
    """An in-place rollout waits for time, not an event (a pod's drain grace, a pull pod,
    which no watch of ours sees): reconcile again then, not only at the next resync."""
    if key in _rechecks and not _rechecks[key].done():
        return  # the earliest pending one reconciles afresh and schedules the next

    async def recheck() -> None:
        await asyncio.sleep(delay)
        _rechecks.pop(key, None)
        await _refresh(key, "rollout")

    _rechecks[key] = asyncio.create_task(recheck())


def _schedule_retry(key: tuple[str, str], exc: BaseException) -> None:
    attempt = runtime().reconciler.failed(key)
    delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS)) - 1]
    if isinstance(exc, KubeError) and exc.status == 429:
        delay = max(delay, 5.0)
    cr_logger(*key).warning("Kubernetes API trouble (attempt %d), retrying in %gs: %s",
                            attempt, delay, exc)
    if key in _retries and not _retries[key].done():
        return  # one pending retry per CR is enough: it reads the CR afresh

    async def retry() -> None:
        await asyncio.sleep(delay)
        _retries.pop(key, None)
        await _refresh(key, "retry")

    _retries[key] = asyncio.create_task(retry())


@kopf.on.event(GROUP, VERSION, PLURAL)
async def cr_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    meta = body["metadata"]
    reconciler = runtime().reconciler
    if type == "DELETED":
        reconciler.forget(meta["namespace"], meta["name"])
        return
    if meta.get("deletionTimestamp"):
        return  # the delete handler owns it from here
    if operator_settings.FINALIZER not in (meta.get("finalizers") or []):
        return  # kopf adds the finalizer first (the timer needs it); its event comes next
    trigger = reconciler.trigger_for(meta, listed=type is None)
    if trigger is not None:
        await _reconcile(body, trigger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(body: kopf.Body, **_: Any) -> None:
    await _reconcile(body, "timer")


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(body: kopf.Body, **_: Any) -> None:
    kube = runtime().kube
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    selector = instance_selector(name)
    # SSD claims carry no owner reference to the CR (the StatefulSet controller makes them from
    # volumeClaimTemplates): they are found by all three of the template's labels instead.
    claim_selector = f"{selector},{COMPONENT_LABEL}={SSD_CLAIM_COMPONENT}"
    kinds = [(api_version, kind, selector) for api_version, kind in CHILD_KINDS]
    if delete_volumes_with_cr(body):
        kinds.append(("v1", "PersistentVolumeClaim", claim_selector))
    try:
        async with runtime().reconciler.begin_delete(namespace, name, uid):
            for api_version, kind, kind_selector in kinds:
                for obj in await kube.list(api_version, kind, namespace, kind_selector):
                    refs = obj["metadata"].get("ownerReferences") or []
                    owned = any(r.get("uid") == uid for r in refs)
                    if owned or kind == "PersistentVolumeClaim":
                        await kube.delete(api_version, kind, namespace, obj["metadata"]["name"])
    except TRANSIENT as exc:
        raise kopf.TemporaryError(f"Kubernetes API trouble while deleting children: {exc}",
                                  delay=5) from exc
    runtime().reconciler.forget(namespace, name)
    cr_logger(namespace, name).info("deleted the children")


# ---------------------------------------------------------------------- children and pods
async def _refresh(owner: tuple[str, str] | None, trigger: str) -> None:
    if owner is None:
        return
    reconciler = runtime().reconciler
    state = reconciler.crs.get(owner)
    if state is None or state.queued:
        return  # unknown here (its own event will reconcile it) or a refresh is already waiting
    state.queued = True
    try:
        async with state.lock:  # let the in-flight reconcile finish; then read the CR afresh
            pass
    finally:
        state.queued = False
    try:
        body = await runtime().kube.get(CR_API_VERSION, KIND, owner[0], owner[1])
    except TRANSIENT as exc:
        _schedule_retry(owner, exc)
        return
    if body is not None:
        await _reconcile(body, trigger)


_CHILD_LABELS = {NAME_LABEL: APP_NAME}


@kopf.on.event("apps", "v1", "statefulsets", labels=_CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=_CHILD_LABELS)
@kopf.on.event("", "v1", "configmaps", labels=_CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_CHILD_LABELS)
@kopf.on.event("apps", "v1", "deployments", labels=_CHILD_LABELS)
@kopf.on.event("", "v1", "serviceaccounts", labels=_CHILD_LABELS)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=_CHILD_LABELS)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=_CHILD_LABELS)
async def child_changed(body: kopf.Body, type: str, **_: Any) -> None:
    reconciler = runtime().reconciler
    owner = reconciler.drifted(body, type)
    if owner is not None:
        await _refresh(owner, "drift")
    elif body.get("kind") in ("StatefulSet", "Deployment"):  # their status feeds the CR's
        await _refresh(reconciler.owner_of(body), "status")


@kopf.on.event("", "v1", "pods", labels=_CHILD_LABELS)
async def pod_changed(body: kopf.Body, **_: Any) -> None:
    labels = body["metadata"].get("labels") or {}
    instance = labels.get(INSTANCE_LABEL)
    if instance:
        await _refresh((body["metadata"]["namespace"], instance), "pods")
