"""The ONE module of the operator that talks to the Kubernetes API (besides kopf itself).

Plain REST over aiohttp with the credentials kopf logged in with (``kopf.ConnectionInfo``):
get, list, create, JSON-merge-patch (main resource or ``/status``) and delete. Errors come back
as ``KubeError`` with the HTTP status and the server's message.

``PERMISSIONS`` declares every (API group, resource, verbs) the operator needs — this module's
calls plus what kopf does for it (watching, finalizers and progress annotations, events,
peering). The chart's RBAC is derived from and tested against this table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from . import metrics

Obj = dict[str, Any]
Permission = tuple[str, str, tuple[str, ...]]

_WRITE = ("get", "list", "watch", "create", "patch", "delete")
PERMISSIONS: tuple[Permission, ...] = (
    # The custom resource: kopf watches it, patches finalizers/annotations, we patch status.
    ("hicache.sglang.ai", "sglanghicaches", ("get", "list", "watch", "patch")),
    ("hicache.sglang.ai", "sglanghicaches/status", ("get", "patch")),
    # Children's ownerReferences set blockOwnerDeletion: where the
    # OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift), that needs
    # update on the owner's finalizers subresource.
    ("hicache.sglang.ai", "sglanghicaches/finalizers", ("update",)),
    # Children the planner renders (apply = get/list/create/patch; prune = delete).
    ("apps", "statefulsets", _WRITE),
    ("", "services", _WRITE),
    ("", "configmaps", _WRITE),
    ("policy", "poddisruptionbudgets", _WRITE),
    # The router (spec.router): its Deployment, and its identity: a ServiceAccount, a Role that
    # reads pods in the CR's namespace and the RoleBinding. The API server lets the operator
    # grant that Role because the operator holds the same pod permissions (no escalate/bind).
    ("apps", "deployments", _WRITE),
    ("", "serviceaccounts", _WRITE),
    ("rbac.authorization.k8s.io", "roles", _WRITE),
    ("rbac.authorization.k8s.io", "rolebindings", _WRITE),
    # Observed for status (and the pod IPs whose SGLang /metrics the operator reads over
    # HTTP: no pods/proxy); patched by in-place rollouts (updateStrategy InPlaceIfPossible:
    # the engine image, labels and annotations; an engine pod is never deleted), which also
    # set their readiness gate's condition (pods/status) and pull a new engine image ahead on
    # each pod's node with a short-lived pull pod they create and delete (builders.prepull: no
    # privileges, no service account token). SSD PVCs are expanded when claimTemplate.size
    # grows (patch) and deleted with the CR only when the CR asks for it. A Pending pod whose
    # SSD claim is bound to a lost node loses both (delete; see controller/claims.py), after
    # reading that claim's PersistentVolume (get) and the nodes (list: which are Ready and
    # schedulable), both cluster-scoped.
    ("", "pods", ("get", "list", "watch", "create", "patch", "delete")),
    ("", "pods/status", ("patch",)),
    ("", "persistentvolumeclaims", ("get", "list", "watch", "patch", "delete")),
    ("", "persistentvolumes", ("get",)),
    ("", "nodes", ("list",)),
    # Whether an SSD claim's StorageClass allows volume expansion (cluster-scoped).
    ("storage.k8s.io", "storageclasses", ("get",)),
    # Events (kopf posts them to core v1).
    ("", "events", ("create",)),
    # kopf: resource scanning and namespace patterns.
    ("apiextensions.k8s.io", "customresourcedefinitions", ("get", "list", "watch")),
    # (get: the namespace's Pod Security Admission level, which the pods are rendered for.)
    ("", "namespaces", ("get", "list", "watch")),
    # kopf peering (two replicas, one active).
    ("kopf.dev", "kopfpeerings", ("get", "list", "watch", "patch")),
    ("kopf.dev", "clusterkopfpeerings", ("get", "list", "watch", "patch")),
)

# apiVersion/kind -> URL plural, for every kind the operator reads or writes.
PLURALS: dict[tuple[str, str], str] = {
    ("hicache.sglang.ai/v1alpha1", "SGLangHiCache"): "sglanghicaches",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("v1", "Pod"): "pods",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("storage.k8s.io/v1", "StorageClass"): "storageclasses",
    ("v1", "Namespace"): "namespaces",
    ("v1", "PersistentVolume"): "persistentvolumes",
    ("v1", "Node"): "nodes",
}
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "StatefulSet"), ("v1", "Service"), ("v1", "ConfigMap"),
    ("policy/v1", "PodDisruptionBudget"), ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apps/v1", "Deployment"))


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def resource_path(api_version: str, kind: str, namespace: str | None = None,
                  name: str | None = None, subresource: str | None = None) -> str:
    try:
        plural = PLURALS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} in {api_version}; known: "
                         f"{sorted(k for _, k in PLURALS)}") from None
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class KubeClient:
    """A small async REST client; one aiohttp session per event loop."""

    def __init__(self, info: kopf.ConnectionInfo, timeout_s: float = 30.0) -> None:
        self.info = info
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self.info.as_ssl_context()),
                headers={**self.info.as_http_headers(),
                         "User-Agent": "sglang-hicache-operator"},
                timeout=self.timeout)
            self._loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def _request(self, method: str, path: str, *, body: Any = None,
                       params: Mapping[str, str] | None = None,
                       content_type: str = "application/json") -> Obj:
        url = self.info.server.rstrip("/") + path
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._get_session().request(method, url, data=data, params=params,
                                               headers=headers) as response:
            text = await response.text()
            metrics.API_CALLS.labels(method, str(response.status)).inc()
            try:
                payload = json.loads(text) if text else {}
            except ValueError:
                payload = {"message": text}
            if response.status >= 400:
                raise KubeError(response.status, str(payload.get("reason", response.reason)),
                                str(payload.get("message", text)))
            return dict(payload)

    async def get(self, api_version: str, kind: str, namespace: str | None,
                  name: str) -> Obj | None:
        try:
            return await self._request("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, api_version: str, kind: str, namespace: str | None,
                   label_selector: str = "") -> list[Obj]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self._request("GET", resource_path(api_version, kind, namespace),
                                     params=params)
        return list(result.get("items") or [])

    async def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return await self._request(
            "POST", resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace")),
            body=obj)

    async def merge_patch(self, api_version: str, kind: str, namespace: str | None, name: str,
                          patch: Obj, subresource: str | None = None) -> Obj:
        return await self._request(
            "PATCH", resource_path(api_version, kind, namespace, name, subresource), body=patch,
            content_type="application/merge-patch+json")

    async def json_patch(self, api_version: str, kind: str, namespace: str | None, name: str,
                         ops: Any, subresource: str | None = None) -> Obj:
        """An RFC 6902 patch: precise list edits (a pod's engine image, one of its status
        conditions) and ``test`` guards (a failed one is HTTP 422; the object changed
        meanwhile)."""
        return await self._request(
            "PATCH", resource_path(api_version, kind, namespace, name, subresource), body=ops,
            content_type="application/json-patch+json")

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str,
                     propagation: str = "Background") -> bool:
        """Delete (``Background`` or ``Orphan`` propagation); ``False`` when already gone."""
        try:
            await self._request("DELETE", resource_path(api_version, kind, namespace, name),
                                body={"propagationPolicy": propagation})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
