"""A minimal Deployment controller (the router's), beside the StatefulSet one in ``workloads``.

What it does after each Deployment or owned Pod change, on the emulator's loop: pods
``<deployment>-<template hash>-<n>`` for ``spec.replicas``, labelled from the pod template plus
``pod-template-hash`` and owned by the Deployment; pods of an older template, and extra ones,
are deleted; ``status`` (replicas, readyReplicas, availableReplicas, updatedReplicas,
observedGeneration) follows the pods. Tests move pods with ``WorkloadSimulator.pod_ready`` and
friends (optionally with a ``podIP`` where a real router process listens).

Gaps versus the real controller: no ReplicaSets (pods are owned by the Deployment itself), the
rolling update replaces every outdated pod at once (no maxSurge/maxUnavailable pacing),
``minReadySeconds`` and progress deadlines are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json

from .admission import record_failed_create
from .store import ApiError, Obj, Store, WatchEvent
from .workloads import workload_key


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class DeploymentSimulator:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.deployments = store.find_type("apps", "v1", "deployments")
        self.pods = store.find_type("", "v1", "pods")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[tuple[str, str]] = set()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.listeners.append(self._on_event)

    def _on_event(self, event: WatchEvent) -> None:
        key = workload_key(event, self.deployments.key, self.pods.key, "Deployment")
        if key is None:
            return
        if key not in self._pending and self._loop is not None:
            self._pending.add(key)
            self._loop.call_soon(self._reconcile, key)

    def _owned(self, deployment: Obj) -> list[Obj]:
        uid = deployment["metadata"]["uid"]
        return [p for p in self.store.list(self.pods, deployment["metadata"]["namespace"],
                                           copy_out=False)
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    def _reconcile(self, key: tuple[str, str]) -> None:
        self._pending.discard(key)
        namespace, name = key
        dep = self.store.objects.get(("apps", "deployments", namespace, name))
        if dep is None or dep["metadata"].get("deletionTimestamp"):
            return
        dep = copy.deepcopy(dep)
        template = dep["spec"].get("template") or {}
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        replicas = int(dep["spec"].get("replicas", 1))
        current = []
        for pod in self._owned(dep):
            labels = pod["metadata"].get("labels") or {}
            if labels.get("pod-template-hash") != digest or \
                    pod["metadata"].get("deletionTimestamp"):
                with contextlib.suppress(ApiError):
                    self.store.delete(self.pods, namespace, pod["metadata"]["name"])
            else:
                current.append(pod)
        current.sort(key=lambda p: p["metadata"]["name"])
        for pod in current[replicas:]:
            with contextlib.suppress(ApiError):
                self.store.delete(self.pods, namespace, pod["metadata"]["name"])
        current = current[:replicas]
        taken = {p["metadata"]["name"] for p in current}
        n = 0
        while len(current) < replicas:
            pod_name = f"{name}-{digest[:9]}-{n:05x}"
            n += 1
            if pod_name in taken or ("", "pods", namespace, pod_name) in self.store.objects:
                continue
            try:
                current.append(self._create_pod(dep, pod_name, digest))
            except ApiError as exc:  # e.g. Pod Security Admission: 403 (on its ReplicaSet)
                record_failed_create(self.store, dep, f"Error creating: {exc.message}")
                break
        ready = sum(1 for p in current if _ready(p))
        status = {"observedGeneration": dep["metadata"].get("generation", 1),
                  "replicas": len(current), "updatedReplicas": len(current),
                  "readyReplicas": ready, "availableReplicas": ready,
                  "unavailableReplicas": len(current) - ready}
        if dep.get("status") != status:
            with contextlib.suppress(ApiError):
                self.store.replace(self.deployments, namespace, name, {**dep, "status": status},
                                   "status")

    def _create_pod(self, dep: Obj, pod_name: str, digest: str) -> Obj:
        template = copy.deepcopy(dep["spec"].get("template") or {})
        meta = template.get("metadata") or {}
        owner = {"apiVersion": "apps/v1", "kind": "Deployment",
                 "name": dep["metadata"]["name"], "uid": dep["metadata"]["uid"],
                 "controller": True, "blockOwnerDeletion": True}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": dep["metadata"]["namespace"],
                            "labels": {**(meta.get("labels") or {}),
                                       "pod-template-hash": digest},
                            "annotations": meta.get("annotations") or {},
                            "ownerReferences": [owner]},
               "spec": template.get("spec") or {}}
        created = self.store.create(self.pods, None, pod)
        return self.store.replace(self.pods, created["metadata"]["namespace"], pod_name,
                                  {**created, "status": {"phase": "Pending"}}, "status")
