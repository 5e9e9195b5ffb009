"""The HTTP face of the emulator: kmock's Kubernetes scaffold (server, discovery, error
rendering) in front of our ``Store``.

Requests for a registered resource (``/api/v1/...``, ``/apis/<group>/<version>/...``) are
served from the store: list (``lists``: resourceVersion semantics, consistent ``limit``/
``continue`` pages, label and field selectors), watch
(history replay from ``resourceVersion``, ``410 Gone`` for compacted versions, bookmarks,
``timeoutSeconds``, ``sendInitialEvents``), get, create, replace (PUT), patch (merge, JSON,
strategic-merge approximated, apply approximated), delete (finalizers, propagation), and the
``status`` subresource. Everything else (discovery, ``/version``) falls through to kmock.
Every request is logged, so tests and benchmarks count writes at the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from .faults import Fault, FaultPlan
from .lists import serve_list
from .store import ApiError, ResourceType, Store
from .validation import SchemaValidator

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_ALL_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}

BUILTIN_TYPES = (
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, subresources=frozenset(
        {"status"})),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, subresources=frozenset({"status"})),
    ResourceType("", "v1", "pods", "Pod", short_names=("po",), subresources=frozenset({"status"})),
    ResourceType("", "v1", "services", "Service", short_names=("svc",),
                 subresources=frozenset({"status"}), dns_label_names=True),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    ResourceType("", "v1", "events", "Event", short_names=("ev",)),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim",
                 short_names=("pvc",), subresources=frozenset({"status"})),
    ResourceType("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False,
                 short_names=("pv",), subresources=frozenset({"status"})),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", short_names=("sts",),
                 subresources=frozenset({"status", "scale"})),
    ResourceType("apps", "v1", "controllerrevisions", "ControllerRevision"),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget",
                 short_names=("pdb",), subresources=frozenset({"status"})),
    ResourceType("apps", "v1", "deployments", "Deployment", short_names=("deploy",),
                 subresources=frozenset({"status", "scale"})),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ResourceType("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False,
                 short_names=("sc",)),
    ResourceType("events.k8s.io", "v1", "events", "Event"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                 "CustomResourceDefinition", namespaced=False, short_names=("crd",),
                 subresources=frozenset({"status"})),
    ResourceType("kopf.dev", "v1", "kopfpeerings", "KopfPeering"),
    ResourceType("kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering",
                 namespaced=False),
)


@dataclass(frozen=True)
class RequestRecord:
    method: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None
    watch: bool
    code: int = 0
    # Where a write's body puts values: dotted key paths down to the changed leaves (or to the
    # first list), e.g. ``metadata.annotations.example.com/key``; empty for reads and deletes.
    body_keys: tuple[str, ...] = ()
    # The query parameters (labelSelector, limit, resourceVersion, ...): which client asked.
    query: tuple[tuple[str, str], ...] = ()

    @property
    def path(self) -> str:
        """``plural[/name[/subresource]]`` with the namespace, for reports."""
        parts = [p for p in (self.namespace, self.plural, self.name, self.subresource) if p]
        return "/".join(parts)


def body_key_paths(body: Any, prefix: str = "", depth: int = 6) -> tuple[str, ...]:
    """Dotted paths of the leaves a JSON body sets (lists and deep subtrees count as leaves)."""
    if isinstance(body, list) and not prefix:  # a JSON patch: its operations' paths
        return tuple(sorted(f"{op.get('op')} {op.get('path')}" for op in body
                            if isinstance(op, dict)))
    if not isinstance(body, dict) or not body or depth == 0:
        return (prefix,) if prefix else ()
    out: list[str] = []
    for key, value in body.items():
        out.extend(body_key_paths(value, f"{prefix}.{key}" if prefix else str(key), depth - 1))
    return tuple(sorted(out))


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesScaffold):
    """A Kubernetes API emulator. Use ``load_crd`` for custom resources; ``faults`` to inject."""

    store: Store = attrs.field(factory=Store)
    faults: FaultPlan = attrs.field(factory=FaultPlan)
    bookmark_interval: float = 1.0
    log: list[RequestRecord] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rtype in BUILTIN_TYPES:
            self.register(rtype)

    # ---------------------------------------------------------------- setup
    def register(self, rtype: ResourceType) -> ResourceType:
        self.store.register(rtype)
        self.resources[kmock.resource(rtype.group, rtype.version, rtype.plural)] = \
            kmock.ResourceInfo(kind=rtype.kind, namespaced=rtype.namespaced,
                               singular=rtype.singular or rtype.kind.lower(),
                               verbs=_ALL_VERBS, shortnames=set(rtype.short_names),
                               subresources=set(rtype.subresources))
        return rtype

    def load_crd(self, crd: dict[str, Any] | str) -> ResourceType:
        """Serve the CRD's storage version, validating CRs with its schema and CEL rules."""
        if isinstance(crd, str):
            crd = yaml.safe_load(crd)
        assert isinstance(crd, dict)
        spec = crd["spec"]
        version = next(v for v in spec["versions"] if v.get("storage", True))
        names = spec["names"]
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        rtype = self.register(ResourceType(
            spec["group"], version["name"], names["plural"], names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular", ""), short_names=tuple(names.get("shortNames", [])),
            subresources=frozenset((version.get("subresources") or {}).keys()),
            validator=SchemaValidator(schema) if schema else None))
        crds = self.store.find_type("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        stored = self.store.create(crds, None, crd)
        stored["status"] = {"acceptedNames": names, "storedVersions": [version["name"]],
                            "conditions": [{"type": "Established", "status": "True"}]}
        self.store.replace(crds, None, stored["metadata"]["name"], stored, "status")
        return rtype

    # ---------------------------------------------------------------- counting
    def writes(self, *, exclude: tuple[str, ...] = ()) -> list[RequestRecord]:
        """Write requests received so far (whatever their outcome), minus excluded plurals."""
        return [r for r in self.log if r.method in WRITE_METHODS and r.plural not in exclude]

    # ---------------------------------------------------------------- dispatch
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Resource URLs are parsed here; discovery and the rest go through kmock.

        kmock 0.8's own path parser fails on ``/api/v1/namespaces`` (it reads ``namespaces``
        as the namespace segment), and kopf lists namespaces; so this parser handles every
        registered resource URL itself.
        """
        found = self._parse_resource_path(raw_request.path)
        if found is None:
            return await super().__call__(raw_request)
        rtype, namespace, name, subresource = found
        body = await raw_request.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        request = kmock.Request(
            method=raw_request.method, url=raw_request.url, params=dict(raw_request.query),
            headers=dict(raw_request.headers), body=body, data=data,
            resource=kmock.resource(rtype.group, rtype.version, rtype.plural),
            namespace=namespace, name=name, subresource=subresource, raw_request=raw_request)
        return await self._serve_resource(request, rtype)

    def _parse_resource_path(
            self, path: str) -> tuple[ResourceType, str | None, str | None, str | None] | None:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and \
                (group, version, rest[2]) in self.store.types:
            namespace, rest = rest[1], rest[2:]
        rtype = self.store.types.get((group, version, rest[0]))
        if rtype is None or len(rest) > 3:
            return None
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        return rtype, namespace, name, subresource

    async def _serve_resource(self, request: kmock.Request,
                              rtype: ResourceType) -> aiohttp.web.StreamResponse:
        method = request.method.value.upper()
        watch = method == "GET" and request.params.get("watch") in ("true", "1")
        fault = self.faults.take("WATCH" if watch else method, rtype.plural, request.name,
                                 request.subresource)
        # Creations and replacements name only their top-level keys (whole objects).
        keys = (body_key_paths(request.data) if method == "PATCH" else
                body_key_paths(request.data, depth=1) if method in ("POST", "PUT") else ())
        record = RequestRecord(method, rtype.plural, request.namespace, request.name,
                               request.subresource, watch, body_keys=keys,
                               query=tuple(sorted(request.params.items())))
        try:
            if fault is not None and fault.delay:
                await asyncio.sleep(fault.delay)
            if fault is not None and fault.status:
                raise ApiError(fault.status, fault.reason, f"injected fault: HTTP {fault.status}")
            if watch:
                self.log.append(record)
                return await self._serve_watch(request, rtype, fault)
            status, payload = 200, self._serve_plain(request, rtype, method)
            if method == "POST":
                status = 201
        except ApiError as exc:
            status, payload = exc.status, exc.to_status()
        if method == "POST" and status == 201:  # creations are logged under the new name
            record = dataclasses.replace(record, name=payload["metadata"]["name"])
        self.log.append(dataclasses.replace(record, code=status))
        return aiohttp.web.json_response(payload, status=status)

    def _serve_plain(self, request: kmock.Request, rtype: ResourceType,
                     method: str) -> dict[str, Any]:
        store, ns, name, sub = self.store, request.namespace, request.name, request.subresource
        if method == "GET":
            if name is None:
                return self._list(request, rtype)
            return store.get(rtype, ns, name, copy_out=False)  # only serialized
        body = request.data if isinstance(request.data, (dict, list)) else None
        if body is None and method != "DELETE":
            raise ApiError(400, "BadRequest", "the request body must be JSON")
        if method == "POST" and name is None:
            assert isinstance(body, dict)
            return store.create(rtype, ns, body)
        if method == "PUT" and name is not None:
            assert isinstance(body, dict)
            return store.replace(rtype, ns, name, body, sub)
        if method == "PATCH" and name is not None:
            content_type = request.headers.get("Content-Type", "")
            return store.patch(rtype, ns, name, content_type, body, sub)
        if method == "DELETE" and name is not None:
            options = body if isinstance(body, dict) else {}
            propagation = request.params.get("propagationPolicy") or \
                options.get("propagationPolicy") or "Background"
            return store.delete(rtype, ns, name, propagation, options.get("preconditions"))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on this URL "
                       "(collection deletes are an emulator gap)")

    def _list(self, request: kmock.Request, rtype: ResourceType) -> dict[str, Any]:
        return serve_list(self.store, rtype, request.namespace, request.params)

    async def _serve_watch(self, request: kmock.Request, rtype: ResourceType,
                           fault: Fault | None) -> aiohttp.web.StreamResponse:
        params = request.params
        raw = request._raw_request
        assert raw is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        deadline = time.monotonic() + float(params.get("timeoutSeconds") or 1e9)
        bookmarks = params.get("allowWatchBookmarks") == "true"
        budget = fault.drop_after if fault is not None and fault.drop_after is not None else None
        lag = fault.event_delay if fault is not None else 0.0

        async def send(event_type: str, obj: dict[str, Any], at: float | None = None) -> bool:
            """Write one event; False when the stream must end (a drop fault ran out)."""
            nonlocal budget
            if lag and at is not None:
                await asyncio.sleep(max(0.0, at + lag - time.monotonic()))
            await response.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")
            if budget is not None:
                budget -= 1
                return budget > 0
            return True

        if budget is not None and budget <= 0:  # drop before the first event
            await response.write_eof()
            return response
        try:
            initial, watcher = self.store.watch(
                rtype, request.namespace, params.get("resourceVersion"),
                params.get("labelSelector", ""), params.get("fieldSelector", ""))
        except ApiError as exc:
            await response.write(json.dumps({"type": "ERROR", "object": exc.to_status()}).encode()
                                 + b"\n")
            await response.write_eof()
            return response
        try:
            for event in initial:
                if not await send(event.type, event.object, event.at):
                    return response
            if params.get("sendInitialEvents") == "true" and bookmarks:
                mark = self._bookmark(rtype, {"k8s.io/initial-events-end": "true"})
                if not await send("BOOKMARK", mark):
                    return response
            while time.monotonic() < deadline:
                timeout = min(self.bookmark_interval, max(0.0, deadline - time.monotonic()))
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), timeout=timeout)
                except asyncio.TimeoutError:
                    if bookmarks and not await send("BOOKMARK", self._bookmark(rtype)):
                        return response
                    continue
                if item is None:  # dropped by drop_watches()
                    return response
                if not await send(item.type, item.object, item.at):
                    return response
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watcher)
            if raw.transport is not None and not raw.transport.is_closing():
                with contextlib.suppress(ConnectionResetError):
                    await response.write_eof()
        return response

    def _bookmark(self, rtype: ResourceType,
                  annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {"apiVersion": rtype.api_version, "kind": rtype.kind, "metadata": meta}
