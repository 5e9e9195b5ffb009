"""Kopf handlers: thin glue between kopf's triggers and ``Reconciler``.

- create/update(spec)/resume of an SGLangHiCache: reconcile; spec errors are a
  ``PermanentError`` (after ``SpecValid=False`` and an Event), API trouble a ``TemporaryError``
  with a delay (kopf retries it);
- a timer (``SGLANG_HICACHE_RESYNC_SECONDS``, default 60) re-reconciles: drift correction and
  status; an unchanged world writes nothing;
- child events (StatefulSet, Services, ConfigMap, PDB) reconcile the owner when they show drift
  from what was last applied; pod and StatefulSet events refresh the owner's status;
- delete: children go (PVCs only when the CR asks), then kopf releases the finalizer.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import kopf

from ..api import API_VERSION as CR_API_VERSION
from ..api import GROUP, KIND, PLURAL, VERSION, OperatorConfig
from . import settings as operator_settings
from .kube import CHILD_KINDS, KubeClient, KubeError
from .reconcile import (
    APP_NAME,
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    NAME_LABEL,
    SSD_CLAIM_COMPONENT,
    Reconciler,
    Result,
    delete_volumes_with_cr,
    instance_selector,
)

RESYNC_SECONDS = float(os.environ.get("SGLANG_HICACHE_RESYNC_SECONDS", "60"))
log = logging.getLogger("hicache_operator.controller")


@dataclass
class Runtime:
    kube: KubeClient
    reconciler: Reconciler


_info: kopf.ConnectionInfo | None = None
_runtime: Runtime | None = None


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
    logging.getLogger("hicache_operator").setLevel(config.log_level)
    operator_settings.configure(settings)
    logger.info("sglang-hicache operator configured: resync every %ss, image %s",
                RESYNC_SECONDS, config.default_image)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    global _info
    _info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    return _info


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    global _runtime
    if _runtime is not None:
        await _runtime.kube.close()
    _runtime = None


# ---------------------------------------------------------------------- the custom resource
def _post(body: Mapping[str, Any], result: Result) -> None:
    for event in result.events:
        kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason,
                   message=event.message)


def _temporary(exc: Exception) -> kopf.TemporaryError:
    if isinstance(exc, KubeError):
        delay = {409: 1.0, 429: 5.0}.get(exc.status, 2.0 if exc.status >= 500 else 5.0)
    else:
        delay = 2.0
    return kopf.TemporaryError(f"Kubernetes API trouble, retrying in {delay:g}s: {exc}",
                               delay=delay)


async def _reconcile(body: Mapping[str, Any], trigger: str) -> Result:
    try:
        result = await runtime().reconciler.reconcile(body, trigger)
    except (KubeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise _temporary(exc) from exc
    _post(body, result)
    return result


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def apply(body: kopf.Body, reason: str, **_: Any) -> None:
    result = await _reconcile(body, str(reason))
    if not result.valid:
        raise kopf.PermanentError("the spec is invalid; see status.conditions[SpecValid]")


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    try:
        await _reconcile(body, "timer")
    except kopf.TemporaryError as exc:
        logger.warning("resync deferred: %s", exc)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
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
    except (KubeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise _temporary(exc) from exc
    runtime().reconciler.forget(namespace, name)
    logger.info("deleted the children of %s/%s", namespace, name)


# ---------------------------------------------------------------------- children and pods
async def _refresh(owner: tuple[str, str] | None, trigger: str, logger: kopf.Logger) -> None:
    if owner is None:
        return
    reconciler = runtime().reconciler
    state = reconciler.crs.get(owner)
    if state is None or state.queued:
        return  # unknown here (resume will reconcile it) or a refresh is already waiting
    state.queued = True
    try:
        async with state.lock:  # let the in-flight reconcile finish; then read the CR afresh
            pass
    finally:
        state.queued = False
    try:
        body = await runtime().kube.get(CR_API_VERSION, KIND, owner[0], owner[1])
        if body is None:
            return
        result = await runtime().reconciler.reconcile(body, trigger)
    except (KubeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        logger.warning("%s refresh of %s/%s deferred: %s", trigger, *owner, exc)
        return
    _post(body, result)


_CHILD_LABELS = {NAME_LABEL: APP_NAME}


@kopf.on.event("apps", "v1", "statefulsets", labels=_CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=_CHILD_LABELS)
@kopf.on.event("", "v1", "configmaps", labels=_CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=_CHILD_LABELS)
async def child_changed(body: kopf.Body, type: str, logger: kopf.Logger,
                        **_: Any) -> None:
    reconciler = runtime().reconciler
    owner = reconciler.drifted(body, type)
    if owner is not None:
        await _refresh(owner, "drift", logger)
    elif body.get("kind") == "StatefulSet":  # its status feeds the CR's status
        await _refresh(reconciler.owner_of(body), "status", logger)


@kopf.on.event("", "v1", "pods", labels=_CHILD_LABELS)
async def pod_changed(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    labels = body["metadata"].get("labels") or {}
    instance = labels.get(INSTANCE_LABEL)
    if instance:
        await _refresh((body["metadata"]["namespace"], instance), "pods", logger)
