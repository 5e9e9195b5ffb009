"""The emulator's object store: the semantics of the Kubernetes API server, without HTTP.

One in-memory table of objects keyed by (group, plural, namespace, name); one global
resourceVersion counter; a bounded history of watch events for ``?watch&resourceVersion=N``
replays. All operations are synchronous and run on the emulator's event loop thread, so each one
is atomic, like a single etcd transaction.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import datetime
import itertools
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import admission
from .apps_rbac import immutable_causes
from .builtins import pvc_update_causes, validate_builtin
from .patching import PatchError, apply_patch
from .pods import pod_update_causes
from .selectors import matches_fields, matches_labels
from .validation import Cause, SchemaValidator

Obj = dict[str, Any]
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
STATEFULSET_UPDATABLE = frozenset({"replicas", "ordinals", "template", "updateStrategy",
                                   "revisionHistoryLimit", "persistentVolumeClaimRetentionPolicy",
                                   "minReadySeconds"})
_SYSTEM_META = ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                "deletionGracePeriodSeconds", "name", "namespace")


class ApiError(Exception):
    """An API failure rendered as a ``Status`` object with this HTTP code."""

    def __init__(self, status: int, reason: str, message: str,
                 causes: list[Cause] | None = None, details: Obj | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.causes = causes or []
        self.details = details or {}

    def to_status(self) -> Obj:
        details = dict(self.details)
        if self.causes:
            details["causes"] = [{"reason": "FieldValueInvalid", "field": f, "message": m}
                                 for f, m in self.causes]
        return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": self.status, "reason": self.reason, "message": self.message,
                "details": details}


@dataclass(frozen=True)
class ResourceType:
    """One served resource (what discovery advertises and the URL addresses)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    validator: SchemaValidator | None = field(default=None, compare=False, repr=False)
    # Kinds whose name must be a DNS-1035 label (Services), not a DNS-1123 subdomain.
    dns_label_names: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


@dataclass
class WatchEvent:
    rv: int
    rtype: ResourceType
    type: str  # ADDED | MODIFIED | DELETED
    object: Obj
    at: float = field(default_factory=time.monotonic)  # when it happened
    prev: Obj | None = None  # the object before (MODIFIED, DELETED), as etcd keeps prevKV


@dataclass(eq=False)
class Watcher:
    rtype: ResourceType
    namespace: str | None
    label_selector: str
    field_selector: str
    queue: asyncio.Queue[WatchEvent | None] = field(default_factory=asyncio.Queue)

    def wants(self, event: WatchEvent) -> bool:
        meta = event.object.get("metadata", {})
        return (event.rtype.key == self.rtype.key
                and (self.namespace is None or meta.get("namespace") == self.namespace)
                and matches_labels(self.label_selector, meta.get("labels") or {})
                and matches_fields(self.field_selector, event.object))


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at(obj: Any, path: str) -> Any:
    """The value at a cause's dotted path (``spec.a.0.b``; ``<root>``: the whole body)."""
    if path in ("", "<root>"):
        return {k: v for k, v in obj.items() if k != "metadata"}
    for part in path.replace("[", ".").replace("]", "").split("."):
        if isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            return KeyError  # absent: never equal to a present value
    return obj


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


class Store:
    """Objects, resourceVersions, watch history, finalizers and owner-reference GC."""

    def __init__(self, history_limit: int = 200_000,
                 feature_gates: dict[str, bool] | None = None) -> None:
        # Feature gates the emulated cluster runs with (the defaults of Kubernetes 1.35).
        self.feature_gates = {"MaxUnavailableStatefulSet": True, **(feature_gates or {})}
        self.validate_builtins = True  # schema + semantic checks of built-in kinds (422)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str, str | None, str], Obj] = {}
        self.rv = 0
        self.history: deque[WatchEvent] = deque(maxlen=history_limit)
        self.compacted_rv = 0  # events at or below this rv are no longer replayable (410)
        self.watchers: set[Watcher] = set()
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self._uids: dict[str, tuple[str, str, str | None, str]] = {}
        self._names = itertools.count(1)

    # ---------------------------------------------------------------- resource types
    def register(self, rtype: ResourceType) -> ResourceType:
        self.types[(rtype.group, rtype.version, rtype.plural)] = rtype
        return rtype

    def find_type(self, group: str, version: str, plural: str) -> ResourceType:
        rtype = self.types.get((group, version, plural))
        if rtype is None:
            gv = f"{group}/{version}" if group else version
            raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                           f"({plural} in {gv})")
        return rtype

    def type_by_kind(self, api_version: str, kind: str) -> ResourceType:
        for rtype in self.types.values():
            if rtype.api_version == api_version and rtype.kind == kind:
                return rtype
        raise KeyError(f"no resource of kind {kind} in {api_version}")

    # ---------------------------------------------------------------- reads
    def _key(self, rtype: ResourceType, namespace: str | None,
             name: str) -> tuple[str, str, str | None, str]:
        return (rtype.group, rtype.plural, namespace if rtype.namespaced else None, name)

    def get(self, rtype: ResourceType, namespace: str | None, name: str, *,
            copy_out: bool = True) -> Obj:
        """The stored object; ``copy_out=False`` shares it (callers must not mutate it: stored
        objects are replaced on every write, never changed in place)."""
        obj = self.objects.get(self._key(rtype, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{rtype.plural}.{rtype.group or "core"} "{name}" '
                           "not found", details={"name": name, "kind": rtype.plural})
        return copy.deepcopy(obj) if copy_out else obj

    def list(self, rtype: ResourceType, namespace: str | None = None,
             label_selector: str = "", field_selector: str = "", *,
             copy_out: bool = True) -> list[Obj]:
        found = []
        for (group, plural, ns, _), obj in self.objects.items():
            if (group, plural) != rtype.key or (namespace is not None and ns != namespace):
                continue
            meta = obj["metadata"]
            if matches_labels(label_selector, meta.get("labels") or {}) and \
                    matches_fields(field_selector, obj):
                found.append(copy.deepcopy(obj) if copy_out else obj)
        return found

    def by_uid(self, uid: str) -> Obj | None:
        key = self._uids.get(uid)
        return None if key is None else self.objects.get(key)

    # ---------------------------------------------------------------- writes
    def create(self, rtype: ResourceType, namespace: str | None, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._names):05x}"
        name = meta.get("name") or ""
        self._check_name(rtype, name)
        if rtype.namespaced:
            ns = namespace or meta.get("namespace")
            if not ns:
                raise ApiError(400, "BadRequest", "the namespace of the object is required")
            if meta.get("namespace") not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not "
                               "match the namespace sent on the request")
            meta["namespace"] = ns
        key = self._key(rtype, meta.get("namespace"), name)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{rtype.plural} "{name}" already exists',
                           details={"name": name, "kind": rtype.plural})
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        for system in ("uid", "resourceVersion", "deletionTimestamp", "creationTimestamp"):
            meta.pop(system, None)
        if "status" in rtype.subresources and rtype.validator is not None:
            obj.pop("status", None)  # a CR's status is written through /status only
        obj = self._validated(rtype, obj, None)
        if rtype.group == "" and rtype.plural == "pods":
            namespace_obj = self.objects.get(("", "namespaces", None, meta["namespace"]))
            refused = admission.denial(obj, namespace_obj)
            if refused is not None:  # Pod Security Admission's enforce mode
                raise ApiError(403, "Forbidden", refused)
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        self._commit(key, rtype, obj, "ADDED")
        refs = meta.get("ownerReferences") or []
        if refs and not any(self.by_uid(ref.get("uid", "")) for ref in refs):
            created = copy.deepcopy(obj)
            self.delete(rtype, key[2], name)  # the garbage collector removes orphans at once
            return created
        return copy.deepcopy(obj)

    def replace(self, rtype: ResourceType, namespace: str | None, name: str, body: Obj,
                subresource: str | None = None) -> Obj:
        expected = (body.get("metadata") or {}).get("resourceVersion")
        return self._update(rtype, namespace, name, lambda _: copy.deepcopy(body),
                            subresource, expected_rv=expected)

    def patch(self, rtype: ResourceType, namespace: str | None, name: str, content_type: str,
              patch: Any, subresource: str | None = None) -> Obj:
        def patched(current: Obj) -> Obj:
            try:
                return apply_patch(current, content_type, patch)
            except PatchError as exc:
                raise ApiError(422, "Invalid", str(exc)) from exc
        expected = None
        if isinstance(patch, dict):  # a merge patch carrying a resourceVersion is a precondition
            expected = (patch.get("metadata") or {}).get("resourceVersion")
        return self._update(rtype, namespace, name, patched, subresource, expected_rv=expected)

    def delete(self, rtype: ResourceType, namespace: str | None, name: str,
               propagation: str = "Background", preconditions: Obj | None = None) -> Obj:
        key = self._key(rtype, namespace, name)
        current = self.get(rtype, namespace, name)
        meta = current["metadata"]
        for field_name in ("uid", "resourceVersion"):
            wanted = (preconditions or {}).get(field_name)
            if wanted and wanted != meta.get(field_name):
                raise ApiError(409, "Conflict", f"precondition failed: {field_name} is "
                               f"{meta.get(field_name)}, not {wanted}")
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now_iso()
                meta["deletionGracePeriodSeconds"] = 0
                self._commit(key, rtype, current, "MODIFIED")
            return copy.deepcopy(self.objects[key])
        self._remove(key, rtype)
        return current

    # ---------------------------------------------------------------- internals
    def _check_name(self, rtype: ResourceType, name: str) -> None:
        pattern, what = ((_DNS_LABEL, "a DNS-1035 label") if rtype.dns_label_names
                         else (_SUBDOMAIN, "a DNS-1123 subdomain"))
        limit = 63 if rtype.dns_label_names else 253
        if not name or len(name) > limit or not pattern.match(name):
            raise ApiError(422, "Invalid", f'{rtype.kind} "{name}" is invalid: metadata.name: '
                           f"must be {what} of at most {limit} characters",
                           causes=[("metadata.name", f"must be {what}")])

    def _gated(self, rtype: ResourceType, obj: Obj) -> Obj:
        """Fields of disabled feature gates are dropped silently, as the API server does."""
        if rtype.key == ("apps", "statefulsets") and \
                not self.feature_gates["MaxUnavailableStatefulSet"]:
            rolling = ((obj.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate")
            if isinstance(rolling, dict):
                rolling.pop("maxUnavailable", None)
        return obj

    def _validated(self, rtype: ResourceType, obj: Obj, old: Obj | None) -> Obj:
        if rtype.validator is None:
            obj = self._gated(rtype, obj)
            causes = validate_builtin(obj) if self.validate_builtins else []
            if causes:
                name = obj["metadata"].get("name", "")
                listed = ", ".join(f"{f}: {m}" for f, m in causes)
                raise ApiError(422, "Invalid", f'{rtype.kind} "{name}" is invalid: [{listed}]',
                               causes=causes, details={"name": name, "kind": rtype.plural})
            return obj
        obj = rtype.validator.prune_and_default(obj)
        causes = rtype.validator.validate(obj, old)
        if old is not None:  # validation ratcheting (GA in Kubernetes 1.33)
            causes = [c for c in causes if _at(obj, c[0]) != _at(old, c[0])]
        if causes:
            name = obj["metadata"].get("name", "")
            listed = ", ".join(f"{f}: Invalid value: {m}" for f, m in causes)
            raise ApiError(422, "Invalid",
                           f'{rtype.kind}.{rtype.group} "{name}" is invalid: [{listed}]',
                           causes=causes,
                           details={"name": name, "group": rtype.group, "kind": rtype.kind})
        return obj

    def _check_immutable(self, rtype: ResourceType, new: Obj, old: Obj) -> None:
        """The update rules of StatefulSets (apps/v1 validation), Pods (``pods``) and PVCs
        (resize)."""
        if rtype.key == ("", "persistentvolumeclaims"):
            name = str((old.get("spec") or {}).get("storageClassName") or "")
            sc = self.objects.get(("storage.k8s.io", "storageclasses", None, name))
            status, causes = pvc_update_causes(new, old, sc)
            if causes:
                reason = "Forbidden" if status == 403 else "Invalid"
                raise ApiError(status, reason, f'persistentvolumeclaims "{old["metadata"]["name"]}'
                               f'" is forbidden: {causes[0][1]}' if status == 403 else
                               f'PersistentVolumeClaim "{old["metadata"]["name"]}" is invalid: '
                               f"{causes[0][0]}: {causes[0][1]}", causes=causes)
            return
        frozen = immutable_causes(rtype.kind, new, old)
        if frozen:
            raise ApiError(422, "Invalid", f'{rtype.kind} "{old["metadata"]["name"]}" is '
                           f"invalid: {frozen[0][0]}: {frozen[0][1]}", causes=frozen)
        if rtype.key == ("", "pods"):
            causes = pod_update_causes(new, old)
            if causes:
                raise ApiError(422, "Invalid", f'Pod "{old["metadata"]["name"]}" is invalid: '
                               f"{causes[0][0]}: {causes[0][1]}", causes=causes)
            return
        if rtype.key != ("apps", "statefulsets"):
            return
        changed = sorted(k for k in set(new.get("spec") or {}) | set(old.get("spec") or {})
                         if k not in STATEFULSET_UPDATABLE
                         and (new.get("spec") or {}).get(k) != (old.get("spec") or {}).get(k))
        if changed:
            raise ApiError(422, "Invalid", f'StatefulSet.apps "{old["metadata"]["name"]}" is '
                           "invalid: spec: Forbidden: updates to statefulset spec for fields "
                           f"other than {sorted(STATEFULSET_UPDATABLE)} are forbidden "
                           f"(changed: {changed})", causes=[("spec", "Forbidden")])

    def _update(self, rtype: ResourceType, namespace: str | None, name: str,
                change: Callable[[Obj], Obj], subresource: str | None,
                expected_rv: str | None) -> Obj:
        key = self._key(rtype, namespace, name)
        old = self.get(rtype, namespace, name, copy_out=False)  # read-only below
        old_meta = old["metadata"]
        if expected_rv and expected_rv != old_meta["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rtype.plural} '
                           f'"{name}": the object has been modified; please apply your changes '
                           "to the latest version and try again",
                           details={"name": name, "kind": rtype.plural})
        new = change(old)  # a new object: both change functions copy
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(old)
            new.pop("status", None)
            if status is not None:
                new["status"] = status
        elif subresource:
            raise ApiError(404, "NotFound", f"subresource {subresource!r} is not served")
        elif "status" in rtype.subresources:
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
        meta = new["metadata"]
        for system in _SYSTEM_META:  # the server owns these; clients cannot change them
            if system in old_meta:
                meta[system] = old_meta[system]
            else:
                meta.pop(system, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
        if old_meta.get("deletionTimestamp") and added:
            raise ApiError(422, "Invalid", "metadata.finalizers: Forbidden: no new finalizers "
                           "can be added if the object is being deleted")
        new = self._validated(rtype, new, old)
        self._check_immutable(rtype, new, old)
        if new == old:
            return old  # a no-op write changes nothing: same resourceVersion, no watch event
        if _spec_part(new) != _spec_part(old):
            new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.objects[key] = new
            self._remove(key, rtype)
            return copy.deepcopy(new)
        self._commit(key, rtype, new, "MODIFIED")
        return copy.deepcopy(new)

    def _commit(self, key: tuple[str, str, str | None, str], rtype: ResourceType, obj: Obj,
                event_type: str) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        prev = self.objects.get(key)
        self.objects[key] = obj
        self._uids[obj["metadata"]["uid"]] = key
        self._emit(WatchEvent(self.rv, rtype, event_type, obj,  # shared: never mutated
                              prev=prev if event_type != "ADDED" else None))

    def _remove(self, key: tuple[str, str, str | None, str], rtype: ResourceType) -> None:
        stored = self.objects.pop(key)
        self._uids.pop(stored["metadata"]["uid"], None)
        self.rv += 1
        obj = {**stored, "metadata": {**stored["metadata"], "resourceVersion": str(self.rv)}}
        self._emit(WatchEvent(self.rv, rtype, "DELETED", obj, prev=stored))
        self._collect_dependents(obj["metadata"]["uid"])

    def _emit(self, event: WatchEvent) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        self.history.append(event)
        for watcher in self.watchers:
            if watcher.wants(event):
                watcher.queue.put_nowait(event)
        for listener in self.listeners:
            listener(event)

    def _dependents(self, owner_uid: str) -> Iterator[tuple[tuple[str, str, str | None, str],
                                                           Obj]]:
        for key, obj in list(self.objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in refs):
                yield key, obj

    def _collect_dependents(self, owner_uid: str) -> None:
        """Background cascading deletion: a dependent goes when none of its owners exist."""
        for key, obj in self._dependents(owner_uid):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") in self._uids for ref in refs):
                continue
            rtype = self._type_of_key(key)
            if key in self.objects:
                self.delete(rtype, key[2], key[3])

    def _orphan_dependents(self, owner_uid: str) -> None:
        for key, obj in self._dependents(owner_uid):
            new = copy.deepcopy(obj)
            new["metadata"]["ownerReferences"] = [
                r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            self._commit(key, self._type_of_key(key), new, "MODIFIED")

    def _type_of_key(self, key: tuple[str, str, str | None, str]) -> ResourceType:
        return next(t for t in self.types.values() if t.key == key[:2])

    # ---------------------------------------------------------------- watching
    def watch(self, rtype: ResourceType, namespace: str | None, since: str | None,
              label_selector: str = "", field_selector: str = ""
              ) -> tuple[builtins.list[WatchEvent], Watcher]:
        """Events to send first (current state or history since ``since``) and a live watcher."""
        watcher = Watcher(rtype, namespace, label_selector, field_selector)
        if since in (None, "", "0"):
            initial = [WatchEvent(int(obj["metadata"]["resourceVersion"]), rtype, "ADDED", obj)
                       for obj in self.list(rtype, namespace, label_selector, field_selector,
                                            copy_out=False)]
        else:
            try:
                since_rv = int(since)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from exc
            if since_rv < self.compacted_rv:
                raise ApiError(410, "Expired", f"too old resource version: {since_rv} "
                               f"({self.compacted_rv})")
            initial = [e for e in self.history if e.rv > since_rv and watcher.wants(e)]
        self.watchers.add(watcher)
        return initial, watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def drop_watches(self) -> int:
        """Close every open watch stream (the client sees the connection end)."""
        for watcher in self.watchers:
            watcher.queue.put_nowait(None)
        return len(self.watchers)
