"""A StatefulSet controller and a kubelet, so the operator sees pods and PVCs behave as on a
cluster.

The StatefulSet controller (after each StatefulSet or Pod change, on the emulator's loop), as
``pkg/controller/statefulset`` does it:
- a ``ControllerRevision`` per distinct pod template (``<sts>-<hash>``, owned by the
  StatefulSet, the template in ``data``, ``revision`` numbers; an equal template reuses its
  revision); ``status.updateRevision`` is the current template's, ``status.currentRevision``
  moves to it only when a RollingUpdate has every pod updated and ready
  (``completeRollingUpdate``; never under OnDelete);
- pods ``<sts>-<ordinal>`` for ``spec.replicas``, labelled from the template plus
  ``controller-revision-hash`` and owned by the StatefulSet (orphans of the same name are
  adopted, as after an ``Orphan`` delete and re-create); a missing pod below a RollingUpdate's
  ``partition`` is made from ``currentRevision``'s template, any other from
  ``updateRevision``'s; extra ordinals are deleted;
- a pod counts as updated by its ``controller-revision-hash`` label alone (so a pod updated in
  place and relabelled is never replaced); RollingUpdate replaces pods of another revision with
  ordinal >= ``partition``, highest first, at most ``maxUnavailable`` (default 1) unavailable
  at a time (the MaxUnavailableStatefulSet rule of Kubernetes 1.35: nothing is replaced while
  that many pods are unavailable); OnDelete never replaces one;
- one PVC ``<template>-<sts>-<ordinal>`` per ``volumeClaimTemplates`` entry, ``Bound`` with the
  requested capacity, never deleted on scale-down unless
  ``persistentVolumeClaimRetentionPolicy.whenScaled`` is ``Delete``; owned by the StatefulSet
  (so collected with it) only when ``whenDeleted`` is ``Delete``;
- ``status`` (replicas, readyReplicas, currentReplicas, updatedReplicas, availableReplicas,
  observedGeneration, currentRevision/updateRevision).
The kubelet is ``kubelet.Kubelet`` (container states, in-place restarts on an image change).
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

from .admission import record_failed_create
from .kubelet import Kubelet
from .store import ApiError, Obj, Store, WatchEvent, now_iso

REVISION_LABEL = "controller-revision-hash"


def _revision(sts: Obj) -> str:
    template = json.dumps(sts["spec"].get("template", {}), sort_keys=True)
    return f"{sts['metadata']['name']}-{hashlib.sha256(template.encode()).hexdigest()[:10]}"


def _owner(obj: Obj, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": controller, "blockOwnerDeletion": True}


def workload_key(event: WatchEvent, workload_rkey: tuple[str, str], pods_rkey: tuple[str, str],
                 kind: str) -> tuple[str, str] | None:
    """(namespace, name) of the ``kind`` workload an event concerns: the workload itself, or
    the one owning the pod; None for anything else."""
    meta = event.object["metadata"]
    if event.rtype.key == workload_rkey:
        return meta["namespace"], meta["name"]
    if event.rtype.key == pods_rkey:
        owner = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == kind),
                     None)
        return None if owner is None else (meta["namespace"], owner["name"])
    return None


def _pod_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _max_unavailable(strategy: Obj, replicas: int, gate: bool) -> int:
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable")
    if value is None or not gate:
        return 1
    if isinstance(value, str) and value.endswith("%"):
        return max(1, int(replicas * int(value[:-1]) / 100))
    return max(1, int(value))


class WorkloadSimulator:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.sts = store.find_type("apps", "v1", "statefulsets")
        self.pods = store.find_type("", "v1", "pods")
        self.pvcs = store.find_type("", "v1", "persistentvolumeclaims")
        self.revisions = store.find_type("apps", "v1", "controllerrevisions")
        self.kubelet = Kubelet(store, self.pods)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[tuple[str, str]] = set()
        self._highest: dict[tuple[str, str], int] = {}  # ordinals ever created, per StatefulSet
        self._history: dict[tuple[str, str], set[str]] = {}  # ControllerRevision names
        # Nodes a new pod is bound to (ordinal modulo their number), as the scheduler would;
        # empty: pods stay unbound (``spec.nodeName`` unset).
        self.nodes: tuple[str, ...] = ()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.kubelet.attach(loop)
        self.store.listeners.append(self._on_event)
        self.store.listeners.append(self.kubelet.on_event)

    def _on_event(self, event: WatchEvent) -> None:
        key = workload_key(event, self.sts.key, self.pods.key, "StatefulSet")
        if key is None:
            return
        if key not in self._pending and self._loop is not None:
            self._pending.add(key)
            self._loop.call_soon(self._reconcile, key)

    # ---------------------------------------------------------------- revisions
    def _revision_objects(self, sts: Obj) -> dict[str, Obj]:
        """This StatefulSet's ControllerRevisions (looked up by the names it made: no scan of
        every object)."""
        namespace, uid = sts["metadata"]["namespace"], sts["metadata"]["uid"]
        names = self._history.setdefault((namespace, sts["metadata"]["name"]), set())
        found = {}
        for name in sorted(names):
            obj = self.store.objects.get(("apps", "controllerrevisions", namespace, name))
            refs = [] if obj is None else obj["metadata"].get("ownerReferences") or []
            if obj is not None and not any(o.get("controller") for o in refs):
                # orphaned with its StatefulSet (Orphan delete): the new one adopts it
                obj = self.store.patch(self.revisions, namespace, name,
                                       "application/merge-patch+json",
                                       {"metadata": {"ownerReferences": [_owner(sts)]}})
                refs = obj["metadata"]["ownerReferences"]
            if obj is not None and any(o.get("uid") == uid for o in refs):
                found[name] = obj
        names.intersection_update(found)
        return found

    def _ensure_revision(self, sts: Obj, history: dict[str, Obj]) -> str:
        """The ControllerRevision of the current template (created, or an equal older one
        renumbered as the newest), as the StatefulSet controller keeps its history."""
        name = _revision(sts)
        newest = max((int(r.get("revision", 0)) for r in history.values()), default=0)
        namespace = sts["metadata"]["namespace"]
        found = history.get(name)
        if found is None:
            self._history.setdefault((namespace, sts["metadata"]["name"]), set()).add(name)
            stale = self.store.objects.get(("apps", "controllerrevisions", namespace, name))
            if stale is not None:  # another owner's (a StatefulSet being collected)
                self.store.delete(self.revisions, namespace, name)
            history[name] = self.store.create(self.revisions, namespace, {
                "apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": dict((sts["spec"].get("selector") or {}).get(
                                 "matchLabels") or {}),
                             "ownerReferences": [_owner(sts)]},
                "data": {"spec": {"template": copy.deepcopy(sts["spec"].get("template", {}))}},
                "revision": newest + 1})
        elif int(found.get("revision", 0)) != newest:
            history[name] = self.store.patch(self.revisions, namespace, name,
                                             "application/merge-patch+json",
                                             {"revision": newest + 1})
        return name

    def _prune_revisions(self, sts: Obj, history: dict[str, Obj], keep: set[str]) -> None:
        limit = int(sts["spec"].get("revisionHistoryLimit", 10))
        spare = sorted((r for n, r in history.items() if n not in keep),
                       key=lambda r: int(r.get("revision", 0)))
        for old in spare[:max(0, len(spare) - limit)]:
            with contextlib.suppress(ApiError):
                self.store.delete(self.revisions, sts["metadata"]["namespace"],
                                  old["metadata"]["name"])

    # ---------------------------------------------------------------- the controller
    def _reconcile(self, key: tuple[str, str]) -> None:
        self._pending.discard(key)
        namespace, name = key
        sts = self.store.objects.get(("apps", "statefulsets", namespace, name))
        if sts is None or sts["metadata"].get("deletionTimestamp"):
            return
        sts = copy.deepcopy(sts)
        replicas = int(sts["spec"].get("replicas", 1))
        history = self._revision_objects(sts)
        update = self._ensure_revision(sts, history)
        current = (sts.get("status") or {}).get("currentRevision")
        if current not in history:
            current = update
        policy = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        strategy = sts["spec"].get("updateStrategy") or {}
        rolling = strategy.get("type", "RollingUpdate") == "RollingUpdate"
        partition = int((strategy.get("rollingUpdate") or {}).get("partition") or 0)
        pods: dict[int, Obj] = {}
        for ordinal in range(replicas):
            pod_name = f"{name}-{ordinal}"
            pod = self.store.objects.get(("", "pods", namespace, pod_name))
            if pod is not None and not any(r.get("controller") for r in
                                           pod["metadata"].get("ownerReferences") or []):
                pod = self.store.patch(self.pods, namespace, pod_name,  # adopt an orphan
                                       "application/merge-patch+json",
                                       {"metadata": {"ownerReferences": [_owner(sts)]}})
            if pod is None:
                revision = current if rolling and ordinal < partition else update
                try:
                    pod = self._create_pod(sts, ordinal, revision, history[revision])
                except ApiError as exc:  # e.g. Pod Security Admission: 403
                    record_failed_create(self.store, sts, f"create Pod {pod_name} in "
                                         f"StatefulSet {name} failed error: {exc.message}")
                    continue
            pods[ordinal] = pod
            self._ensure_pvcs(sts, ordinal, policy)
        for ordinal, pod in self._owned_pods(sts):
            if ordinal >= replicas:
                self.store.delete(self.pods, namespace, pod["metadata"]["name"])
                if policy.get("whenScaled") == "Delete":
                    self._delete_pvcs(sts, ordinal)
        self._highest[key] = replicas
        if rolling:
            self._roll(sts, pods, update, partition, strategy, replicas)
        self._update_status(sts, replicas, update, current)
        in_use = {str((p["metadata"].get("labels") or {}).get(REVISION_LABEL)) for p in
                  pods.values()}
        self._prune_revisions(sts, history, in_use | {update, current})

    def _roll(self, sts: Obj, pods: dict[int, Obj], update: str, partition: int,
              strategy: Obj, replicas: int) -> None:
        """RollingUpdate: replace pods of another revision, highest ordinal first, while fewer
        than maxUnavailable pods are unavailable (the replaced pod comes back on the next
        pass, from updateRevision)."""
        budget = _max_unavailable(strategy, replicas,
                                  self.store.feature_gates["MaxUnavailableStatefulSet"])
        unavailable = sum(1 for p in pods.values() if not _pod_ready(p))
        if unavailable >= budget:
            return
        for ordinal in sorted(pods, reverse=True):
            if ordinal < partition or unavailable >= budget:
                break
            pod = pods[ordinal]
            if (pod["metadata"].get("labels") or {}).get(REVISION_LABEL) != update:
                self.store.delete(self.pods, sts["metadata"]["namespace"],
                                  pod["metadata"]["name"])
                unavailable += 1

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

    def _create_pod(self, sts: Obj, ordinal: int, revision: str, history: Obj) -> Obj:
        template = copy.deepcopy(((history.get("data") or {}).get("spec") or {}).get(
            "template") or sts["spec"].get("template", {}))
        meta = template.get("metadata") or {}
        name = f"{sts['metadata']['name']}-{ordinal}"
        labels = dict(meta.get("labels") or {})
        labels.update({REVISION_LABEL: revision,
                       "statefulset.kubernetes.io/pod-name": name})
        spec = template.get("spec") or {}
        # As the real controller (updateStorage): each claim template becomes a volume of the
        # pod naming its claim, in place of a template volume of the same name.
        claims = {t["metadata"]["name"]: {"name": t["metadata"]["name"], "persistentVolumeClaim": {
            "claimName": f"{t['metadata']['name']}-{name}"}}
            for t in sts["spec"].get("volumeClaimTemplates") or []}
        if claims:
            spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") not in
                               claims] + list(claims.values())
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": sts["metadata"]["namespace"],
                            "labels": labels, "annotations": meta.get("annotations") or {},
                            "ownerReferences": [_owner(sts)]},
               "spec": spec}
        if self.nodes:
            pod["spec"] = {**spec,
                           "nodeName": self.nodes[ordinal % len(self.nodes)]}
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

    def _update_status(self, sts: Obj, replicas: int, update: str, current: str) -> None:
        namespace = sts["metadata"]["namespace"]
        pods = [pod for _, pod in self._owned_pods(sts)]
        ready = sum(1 for p in pods if _pod_ready(p))
        revisions = [(p["metadata"].get("labels") or {}).get(REVISION_LABEL) for p in pods]
        updated = sum(1 for r in revisions if r == update)
        status = {"observedGeneration": sts["metadata"].get("generation", 1),
                  "replicas": len(pods), "readyReplicas": ready, "availableReplicas": ready,
                  "currentReplicas": sum(1 for r in revisions if r == current),
                  "updatedReplicas": updated,
                  "currentRevision": current, "updateRevision": update}
        strategy = (sts["spec"].get("updateStrategy") or {}).get("type", "RollingUpdate")
        if strategy == "RollingUpdate" and updated == replicas and ready == replicas and \
                len(pods) == replicas:  # completeRollingUpdate
            status.update(currentReplicas=updated, currentRevision=update)
        with contextlib.suppress(ApiError):  # deleted in the meantime
            self.store.replace(self.sts, namespace, sts["metadata"]["name"],
                               {**sts, "status": status}, "status")

    def bind_local_volume(self, namespace: str, claim: str, node: str) -> Obj:
        """The volume controller binding ``claim`` to a new local PersistentVolume on
        ``node`` (``spec.nodeAffinity`` on its hostname label, as local-NVMe provisioners
        create them); returns the PersistentVolume."""
        pvs = self.store.find_type("", "v1", "persistentvolumes")
        pvc = self.store.get(self.pvcs, namespace, claim)
        size = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {})
        pv = self.store.create(pvs, None, {
            "metadata": {"name": f"local-pv-{pvc['metadata']['uid'][:8]}"},
            "spec": {"capacity": {"storage": size.get("storage", "1Gi")},
                     "accessModes": ["ReadWriteOnce"], "storageClassName":
                     (pvc.get("spec") or {}).get("storageClassName") or "local-nvme",
                     "local": {"path": "/mnt/nvme0"},
                     "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": namespace, "name": claim,
                                  "uid": pvc["metadata"]["uid"]},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In",
                          "values": [node]}]}]}}}})
        self.store.patch(self.pvcs, namespace, claim, "application/merge-patch+json",
                         {"spec": {"volumeName": pv["metadata"]["name"]}})
        return pv

    # ---------------------------------------------------------------- kubelet/scheduler verdicts
    def _set_pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        pod = self.store.get(self.pods, namespace, name)
        return self.store.replace(self.pods, namespace, name, {**pod, "status": status}, "status")

    def pod_ready(self, namespace: str, name: str, pod_ip: str | None = None) -> Obj:
        return self.kubelet.set_ready(namespace, name, {
            **({"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]} if pod_ip else {}),
            "phase": "Running", "startTime": now_iso(),
            "conditions": [{"type": "PodScheduled", "status": "True"}]})

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
