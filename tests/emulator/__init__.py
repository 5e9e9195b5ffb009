"""A Kubernetes API emulator for tests and benchmarks, built on kmock (by kopf's author).

It speaks the Kubernetes REST API over loopback HTTP well enough to run the real operator
(kopf + our API module) against it:

- discovery (``/api``, ``/apis``, group/version resource lists with subresources), ``/version``;
- CRDs loaded from the chart's generated file (``EmulatorThread(crds=[...])`` /
  ``KubeEmulator.load_crd``), stored as ``customresourcedefinitions`` objects too;
- list (label/field selectors, ``limit``/``continue``) and watch (``resourceVersion`` replay
  from a bounded history, ``410 Gone`` beyond it, bookmarks, ``sendInitialEvents``,
  ``timeoutSeconds``);
- create (``generateName``, name format checks), get, replace (PUT), patch (JSON merge, JSON
  patch with ``test`` ops → 422, strategic merge and apply approximated as merge), delete;
- ``uid``/``resourceVersion``/``generation``/``creationTimestamp`` assignment; 409 on stale
  ``resourceVersion`` (PUT, merge patch carrying one, delete preconditions) and on duplicates;
  no-op writes change nothing (same resourceVersion, no event), as on a real server;
- the ``status`` subresource (main-resource writes ignore status and vice versa for CRs);
- finalizers and ``deletionTimestamp``; owner-reference garbage collection (background
  cascade, ``Orphan`` propagation, dependents created for a missing owner);
- the StatefulSet update rule: only replicas, ordinals, template, updateStrategy,
  revisionHistoryLimit, persistentVolumeClaimRetentionPolicy and minReadySeconds may change (422);
- Events (core ``v1`` and ``events.k8s.io/v1``) stored like any object;
- CR validation against the CRD schema (pruning, defaults, OpenAPI keywords) and its CEL
  ``x-kubernetes-validations`` (cel-python), answered with 422 and per-field causes; on updates,
  invalid values left unchanged are let through (validation ratcheting, GA in 1.33), so a CR
  stored under an older CRD (``create_unvalidated``) can still get its status written;
- built-in kinds validated like an API server (``builtins``: kubernetes-validate's schemas of
  1.33 plus label/name/mount/selector rules), PVC resize rules, StorageClasses, feature gates
  (``Store.feature_gates``: fields of a disabled gate are dropped, as the server does);
- fault injection (``Fault``): error statuses (409, 500, ...), delays, dropped watches
  (``drop_after`` events, or ``drop_watches()`` for every open stream);
- a StatefulSet controller (``WorkloadSimulator``) with Kubernetes' revision bookkeeping
  (ControllerRevisions, ``controller-revision-hash``, ``currentRevision``/``updateRevision``,
  partition, RollingUpdate pod by pod within ``maxUnavailable``) creating pods and PVCs whose
  states tests set (ready, failed with a reason, unschedulable, image pull / crash loop), and a
  Deployment controller (``deployments``: the router's pods);
- the Pod update rule (a running pod's spec changes only in images, tolerations, deadlines) and
  a kubelet (``kubelet.Kubelet``) that restarts just the container whose image changed, and the
  engine when its configuration revision changes (what the hicache launcher's watcher does);
- Pod Security Admission's enforce mode on pod creation (``admission``: the namespace's
  ``pod-security.kubernetes.io/enforce`` level, 403 with the plugin's message; the StatefulSet
  and Deployment controllers record ``FailedCreate``);
- the router's kinds: Deployments, ServiceAccounts, Roles, RoleBindings, validated with their
  schemas and the update rules the schemas do not state (``apps_rbac``: selector matches the
  template, immutable Deployment selector and RoleBinding roleRef).

Known gaps versus a real API server (do not rely on these in tests):
- no authentication/authorization/admission webhooks, no RBAC checks; any token is accepted;
  Pod Security Admission has no exemptions, no ``enforce-version`` and no warn/audit modes;
- built-in kinds are not defaulted, and unknown fields are refused (strict) where a real
  server drops them with a warning; the Go validation rules are a subset (``builtins``);
- strategic merge patch and server-side apply are plain JSON merge patches: no list merge
  keys, no managedFields/field ownership, no apply conflicts;
- no ``deletecollection``; ``Foreground`` propagation behaves like ``Background``;
- namespaces need not exist; no namespace deletion cascade; no resource quotas or limits;
- one served version per CRD, no conversion; CEL: no Kubernetes extension libraries
  (quantity, url, ip, strings ext), no ``messageExpression``, no cost limits; formats unchecked;
- watch history is bounded (``Store(history_limit)``); bookmarks every ``bookmark_interval``;
- the StatefulSet simulator never recreates failed pods, ignores ``minReadySeconds`` and
  ``OrderedReady`` (pods are managed in parallel, as the operator renders them), deletes a pod
  at once (no graceful termination), and has no scheduler beyond the states tests set; no
  Deployments/ReplicaSets;
- no server-side field selectors beyond dotted-path equality; no table output (kubectl get).
"""

from .faults import Fault, FaultPlan
from .harness import CHART_CRD, EmulatorThread
from .server import KubeEmulator, RequestRecord
from .store import ApiError, ResourceType, Store
from .workloads import WorkloadSimulator

__all__ = [
    "CHART_CRD",
    "ApiError",
    "EmulatorThread",
    "Fault",
    "FaultPlan",
    "KubeEmulator",
    "RequestRecord",
    "ResourceType",
    "Store",
    "WorkloadSimulator",
]
