"""A minimal StatefulSet controller and kubelet, so the operator sees pods and PVCs.

What it does (after each StatefulSet or Pod change, on the emulator's loop):
- pods ``<sts>-<ordinal>`` for ``spec.replicas``, labelled from the pod template plus
  ``controller-revision-hash`` and owned by the StatefulSet (orphans of the same name are
  adopted, as after an ``Orphan`` delete and re-create); extra ordinals are deleted;
  pods of an older template revision are replaced (all at once: a rolling update gap), except
  under ``updateStrategy`` ``OnDelete`` (never) and below a RollingUpdate ``partition``;
- one PVC ``<template>-<sts>-<ordinal>`` per ``volumeClaimTemplates`` entry, ``Bound`` with the
  requested capacity, never deleted on scale-down unless
  ``persistentVolumeClaimRetentionPolicy.whenScaled`` is ``Delete``; owned by the StatefulSet
  (so collected with it) only when ``whenDeleted`` is ``Delete``;
- ``status`` of the StatefulSet (replicas, readyReplicas, currentReplicas, updatedReplicas,
  availableReplicas, observedGeneration, currentRevision/updateRevision).
New pods start ``Pending``; tests move them with ``pod_ready`` (optionally with a ``podIP``, e.g.
a loopback address where a test serves SGLang metrics), ``pod_failed``,
``pod_unschedulable`` and ``pod_waiting`` (image pull errors, crash loops). Failed pods are left
alone (the real controller recreates them; the kubelet then fails them again).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
from typing import Any

from .store import ApiError, Obj, Store, WatchEvent, now_iso


def _revision(sts: Obj) -> str:
    template = json.dumps(sts["spec"].get("template", {}), sort_keys=True)
    return f"{sts['metadata']['name']}-{hashlib.sha256(template.encode()).hexdigest()[:10]}"


def _owner(obj: Obj, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": controller, "blockOwnerDeletion": True}


def _pod_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class WorkloadSimulator:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.sts = store.find_type("apps", "v1", "statefulsets")
        self.pods = store.find_type("", "v1", "pods")
        self.pvcs = store.find_type("", "v1", "persistentvolumeclaims")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[tuple[str, str]] = set()
        self._highest: dict[tuple[str, str], int] = {}  # ordinals ever created, per StatefulSet

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.listeners.append(self._on_event)

    def _on_event(self, event: WatchEvent) -> None:
        meta = event.object["metadata"]
        if event.rtype.key == self.sts.key:
            key = (meta["namespace"], meta["name"])
        elif event.rtype.key == self.pods.key:
            owner = next((r for r in meta.get("ownerReferences") or []
                          if r.get("kind") == "StatefulSet"), None)
            if owner is None:
                return
            key = (meta["namespace"], owner["name"])
        else:
            return
        if key not in self._pending and self._loop is not None:
            self._pending.add(key)
            self._loop.call_soon(self._reconcile, key)

    def _reconcile(self, key: tuple[str, str]) -> None:
        self._pending.discard(key)
        namespace, name = key
        sts = self.store.objects.get(("apps", "statefulsets", namespace, name))
        if sts is None or sts["metadata"].get("deletionTimestamp"):
            return
        sts = copy.deepcopy(sts)
        replicas = int(sts["spec"].get("replicas", 1))
        revision = _revision(sts)
        policy = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        strategy = sts["spec"].get("updateStrategy") or {}
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        for ordinal in range(replicas):
            pod_name = f"{name}-{ordinal}"
            pod = self.store.objects.get(("", "pods", namespace, pod_name))
            if pod is not None and not any(r.get("controller") for r in
                                           pod["metadata"].get("ownerReferences") or []):
                pod = self.store.patch(self.pods, namespace, pod_name,  # adopt an orphan
                                       "application/merge-patch+json",
                                       {"metadata": {"ownerReferences": [_owner(sts)]}})
            outdated = pod is not None and (pod["metadata"].get("labels") or {}).get(
                "controller-revision-hash") != revision
            if outdated and strategy.get("type") != "OnDelete" and ordinal >= partition:
                self.store.delete(self.pods, namespace, pod_name)
                pod = None
            if pod is None:
                pod = self._create_pod(sts, ordinal, revision)
            self._ensure_pvcs(sts, ordinal, policy)
        for ordinal, pod in self._owned_pods(sts):
            if ordinal >= replicas:
                self.store.delete(self.pods, namespace, pod["metadata"]["name"])
                if policy.get("whenScaled") == "Delete":
                    self._delete_pvcs(sts, ordinal)
        self._highest[key] = replicas
        self._update_status(sts, replicas, revision)

    def _owned_pods(self, sts: Obj) -> list[tuple[int, Obj]]:
        """This StatefulSet's pods by ordinal (looked up by name: no scan of every object)."""
        namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        found = []
        for ordinal in range(max(self._highest.get((namespace, name), 0),
                                 int(sts["spec"].get("replicas", 1)))):
            pod = self.store.objects.get(("", "pods", namespace, f"{name}-{ordinal}"))
            if pod is not None and any(r.get("uid") == sts["metadata"]["uid"]
                                       for r in pod["metadata"].get("ownerReferences") or []):
                found.append((ordinal, pod))
        return found

    def _create_pod(self, sts: Obj, ordinal: int, revision: str) -> Obj:
        template = copy.deepcopy(sts["spec"].get("template", {}))
        meta = template.get("metadata") or {}
        name = f"{sts['metadata']['name']}-{ordinal}"
        labels = dict(meta.get("labels") or {})
        labels.update({"controller-revision-hash": revision,
                       "statefulset.kubernetes.io/pod-name": name})
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": sts["metadata"]["namespace"],
                            "labels": labels, "annotations": meta.get("annotations") or {},
                            "ownerReferences": [_owner(sts)]},
               "spec": template.get("spec") or {}}
        created = self.store.create(self.pods, None, pod)
        return self.store.replace(self.pods, created["metadata"]["namespace"], name,
                                  {**created, "status": {"phase": "Pending"}}, "status")

    def _ensure_pvcs(self, sts: Obj, ordinal: int, policy: dict[str, str]) -> None:
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            claim = f"{template['metadata']['name']}-{sts['metadata']['name']}-{ordinal}"
            namespace = sts["metadata"]["namespace"]
            if ("", "persistentvolumeclaims", namespace, claim) in self.store.objects:
                continue
            owners = []
            if policy.get("whenDeleted") == "Delete":
                owners.append(_owner(sts))
            meta = {"name": claim, "namespace": namespace,
                    # The real controller labels claims with the StatefulSet's selector too.
                    "labels": {**((template.get("metadata") or {}).get("labels") or {}),
                               **((sts["spec"].get("selector") or {}).get("matchLabels") or {})}}
            if owners:
                meta["ownerReferences"] = owners
            created = self.store.create(self.pvcs, None, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
                "spec": copy.deepcopy(template.get("spec"))})
            size = ((template.get("spec") or {}).get("resources") or {}).get("requests", {})
            self.store.replace(self.pvcs, namespace, claim, {**created, "status": {
                "phase": "Bound", "capacity": {"storage": size.get("storage", "0")}}}, "status")

    def _delete_pvcs(self, sts: Obj, ordinal: int) -> None:
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            claim = f"{template['metadata']['name']}-{sts['metadata']['name']}-{ordinal}"
            if ("", "persistentvolumeclaims", sts["metadata"]["namespace"], claim) in \
                    self.store.objects:
                self.store.delete(self.pvcs, sts["metadata"]["namespace"], claim)

    def _update_status(self, sts: Obj, replicas: int, revision: str) -> None:
        namespace = sts["metadata"]["namespace"]
        pods = [pod for _, pod in self._owned_pods(sts)]
        ready = sum(1 for p in pods if _pod_ready(p))
        revisions = [(p["metadata"].get("labels") or {}).get("controller-revision-hash")
                     for p in pods]
        updated = sum(1 for r in revisions if r == revision)
        older = next((r for r in revisions if r != revision), None)
        status = {"observedGeneration": sts["metadata"].get("generation", 1),
                  "replicas": len(pods), "readyReplicas": ready, "availableReplicas": ready,
                  "currentReplicas": len(pods) - updated if older else len(pods),
                  "updatedReplicas": updated,
                  "currentRevision": older or revision, "updateRevision": revision}
        with contextlib.suppress(ApiError):  # deleted in the meantime
            self.store.replace(self.sts, namespace, sts["metadata"]["name"],
                               {**sts, "status": status}, "status")

    # ---------------------------------------------------------------- kubelet/scheduler verdicts
    def _set_pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        pod = self.store.get(self.pods, namespace, name)
        return self.store.replace(self.pods, namespace, name, {**pod, "status": status}, "status")

    def pod_ready(self, namespace: str, name: str, pod_ip: str | None = None) -> Obj:
        return self._set_pod_status(namespace, name, {
            **({"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]} if pod_ip else {}),
            "phase": "Running", "startTime": now_iso(),
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "True"},
                           {"type": "ContainersReady", "status": "True"}],
            "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0,
                                   "state": {"running": {"startedAt": now_iso()}}}]})

    def pod_failed(self, namespace: str, name: str, reason: str, message: str) -> Obj:
        return self._set_pod_status(namespace, name, {
            "phase": "Failed", "reason": reason, "message": message})

    def pod_unschedulable(self, namespace: str, name: str, message: str) -> Obj:
        return self._set_pod_status(namespace, name, {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False",
                            "reason": "Unschedulable", "message": message}]})

    def pod_waiting(self, namespace: str, name: str, reason: str, message: str,
                    restarts: int = 0) -> Obj:
        return self._set_pod_status(namespace, name, {
            "phase": "Pending" if reason != "CrashLoopBackOff" else "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "engine", "ready": False, "restartCount": restarts,
                                   "state": {"waiting": {"reason": reason,
                                                         "message": message}}}]})
