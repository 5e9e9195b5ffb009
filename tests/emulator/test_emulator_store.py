"""The emulator's store semantics, without HTTP (fast, unit tier).

Everything here is real emulator code; nothing is faked. A small CRD fixture exercises pruning,
defaults, OpenAPI validation and CEL rules; the chart's generated CRD is covered by the e2e tier.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from emulator.patching import merge_patch
from emulator.selectors import matches_fields, matches_labels
from emulator.server import BUILTIN_TYPES
from emulator.store import ApiError, ResourceType, Store
from emulator.validation import SchemaValidator

WIDGET_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer", "minimum": 1, "default": 3},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "volume": {"type": "object", "properties": {
                    "emptyDir": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "hostPath": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                }, "x-kubernetes-validations": [{
                    "rule": "(has(self.emptyDir) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) == 1",
                    "message": "exactly one volume kind"}]},
                "quantity": {"x-kubernetes-int-or-string": True,
                             "anyOf": [{"type": "integer"}, {"type": "string"}]},
            },
            "x-kubernetes-validations": [
                {"rule": "self.mode != 'b' || self.size > 2", "message": "mode b needs size > 2"},
                {"rule": "self.size >= oldSelf.size", "message": "size cannot shrink"},
            ],
        },
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
    },
}


def _store() -> tuple[Store, ResourceType]:
    store = Store(history_limit=50)
    for rtype in BUILTIN_TYPES:
        store.register(rtype)
    widgets = store.register(ResourceType(
        "example.com", "v1", "widgets", "Widget", subresources=frozenset({"status"}),
        validator=SchemaValidator(WIDGET_SCHEMA)))
    return store, widgets


def _widget(name: str = "w", **spec: object) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"mode": "a", **spec}}


def test_create_assigns_identity_prunes_unknown_fields_and_applies_defaults() -> None:
    store, widgets = _store()
    created = store.create(widgets, "ns", {**_widget(junk=1), "status": {"phase": "x"}})
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] == "1" and meta["generation"] == 1
    assert created["spec"] == {"mode": "a", "size": 3}  # junk pruned, size defaulted
    assert "status" not in created  # a CR's status is only written through /status
    with pytest.raises(ApiError) as dup:
        store.create(widgets, "ns", _widget())
    assert dup.value.status == 409 and dup.value.reason == "AlreadyExists"


def test_schema_and_cel_violations_are_422_with_every_cause() -> None:
    store, widgets = _store()
    with pytest.raises(ApiError) as bad:
        store.create(widgets, "ns", _widget(size=0, mode="c"))
    assert bad.value.status == 422
    fields = sorted(f for f, _ in bad.value.causes)
    assert fields == ["spec.mode", "spec.size"]
    with pytest.raises(ApiError) as cel:
        store.create(widgets, "ns", _widget(mode="b", size=1, volume={"emptyDir": {},
                                                                      "hostPath": {}}))
    messages = {m for _, m in cel.value.causes}
    assert messages == {"mode b needs size > 2", "exactly one volume kind"}
    assert store.create(widgets, "ns", _widget(quantity="10Gi", volume={"emptyDir": {}}))


def test_transition_rules_run_on_update_only() -> None:
    store, widgets = _store()
    store.create(widgets, "ns", _widget(size=5))
    with pytest.raises(ApiError) as shrink:
        store.patch(widgets, "ns", "w", "application/merge-patch+json", {"spec": {"size": 4}})
    assert shrink.value.causes == [("spec", "size cannot shrink")]


def test_stale_resource_version_conflicts_and_noop_writes_change_nothing() -> None:
    store, widgets = _store()
    first = store.create(widgets, "ns", _widget())
    updated = store.patch(widgets, "ns", "w", "application/merge-patch+json",
                          {"spec": {"size": 4}})
    assert updated["metadata"]["generation"] == 2
    stale = copy.deepcopy(first)
    stale["spec"]["size"] = 9
    with pytest.raises(ApiError) as conflict:
        store.replace(widgets, "ns", "w", stale)
    assert conflict.value.status == 409
    rv = store.rv
    same = store.patch(widgets, "ns", "w", "application/merge-patch+json", {"spec": {"size": 4}})
    assert store.rv == rv and same["metadata"]["resourceVersion"] == updated["metadata"][
        "resourceVersion"]


def test_status_subresource_is_separate_from_the_main_resource() -> None:
    store, widgets = _store()
    store.create(widgets, "ns", _widget())
    store.patch(widgets, "ns", "w", "application/merge-patch+json",
                {"status": {"phase": "ignored"}, "metadata": {"labels": {"a": "b"}}})
    assert "status" not in store.get(widgets, "ns", "w")
    after = store.patch(widgets, "ns", "w", "application/merge-patch+json",
                        {"status": {"phase": "Ready", "unknown": 1}, "spec": {"size": 7}},
                        subresource="status")
    assert after["status"] == {"phase": "Ready"} and after["spec"]["size"] == 3
    assert after["metadata"]["generation"] == 1  # status writes never bump the generation


def test_json_patch_test_op_failure_is_422() -> None:
    store, widgets = _store()
    store.create(widgets, "ns", _widget())
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "999"},
           {"op": "replace", "path": "/spec/size", "value": 8}]
    with pytest.raises(ApiError) as failed:
        store.patch(widgets, "ns", "w", "application/json-patch+json", ops)
    assert failed.value.status == 422


def test_finalizers_hold_deletion_until_released() -> None:
    store, widgets = _store()
    store.create(widgets, "ns", {**_widget(), "metadata": {"name": "w", "finalizers": ["x/y"]}})
    marked = store.delete(widgets, "ns", "w")
    assert marked["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiError):  # no new finalizers once deleting
        store.patch(widgets, "ns", "w", "application/merge-patch+json",
                    {"metadata": {"finalizers": ["x/y", "x/z"]}})
    store.patch(widgets, "ns", "w", "application/merge-patch+json",
                {"metadata": {"finalizers": None}})
    assert ("example.com", "widgets", "ns", "w") not in store.objects
    assert [e.type for e in store.history][-1] == "DELETED"


def test_owner_reference_garbage_collection_cascades() -> None:
    store, widgets = _store()
    owner = store.create(widgets, "ns", _widget())
    ref = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w",
           "uid": owner["metadata"]["uid"], "controller": True}
    configmaps = store.find_type("", "v1", "configmaps")
    cm = store.create(configmaps, "ns", {"metadata": {"name": "c", "ownerReferences": [ref]}})
    pods = store.find_type("", "v1", "pods")
    cm_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": cm["metadata"]["uid"]}
    store.create(pods, "ns", {"metadata": {"name": "p", "ownerReferences": [cm_ref]}})
    store.create(pods, "ns", {"metadata": {"name": "free"}})
    store.delete(widgets, "ns", "w")
    assert sorted(k[3] for k in store.objects) == ["free"]


def test_watch_replays_history_and_expires_compacted_versions() -> None:
    store, widgets = _store()
    store.create(widgets, "ns", _widget("a"))
    since = str(store.rv)
    store.create(widgets, "ns", _widget("b"))
    store.create(widgets, "other", _widget("c"))
    initial, watcher = store.watch(widgets, "ns", since)
    assert [e.object["metadata"]["name"] for e in initial] == ["b"]
    store.delete(widgets, "ns", "a")
    assert watcher.queue.get_nowait().type == "DELETED"
    store.unwatch(watcher)
    for i in range(60):  # overflow the 50-event history
        store.create(widgets, "ns", _widget(f"x{i}"))
    with pytest.raises(ApiError) as gone:
        store.watch(widgets, "ns", since)
    assert gone.value.status == 410


def test_generate_name_and_name_format() -> None:
    store, _ = _store()
    events = store.find_type("", "v1", "events")
    first = store.create(events, "ns", {"metadata": {"generateName": "shc-"}})
    second = store.create(events, "ns", {"metadata": {"generateName": "shc-"}})
    assert first["metadata"]["name"] != second["metadata"]["name"]
    services = store.find_type("", "v1", "services")
    with pytest.raises(ApiError) as bad:
        store.create(services, "ns", {"metadata": {"name": "9starts.with.digit"}})
    assert bad.value.status == 422


def test_merge_patch_and_selectors() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {
        "a": {"c": 2}, "l": [2]}
    labels = {"app": "x", "tier": "cache"}
    assert matches_labels("app=x,tier in (cache,db)", labels)
    assert not matches_labels("app=x,!tier", labels)
    assert matches_labels("app!=y,tier", labels)
    assert not matches_labels("tier notin (cache)", labels)
    assert matches_fields("metadata.name=n", {"metadata": {"name": "n"}})
    assert not matches_fields("metadata.name!=n", {"metadata": {"name": "n"}})


def _sts(name: str = "s", **pod: Any) -> dict[str, Any]:
    """A StatefulSet the API server accepts; ``pod`` overrides pod spec fields."""
    labels = {"app": name}
    container = {"name": "c", "image": "busybox",
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": 1, "serviceName": "a", "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "containers": [container],
                         "volumes": [{"name": "data", "emptyDir": {}}], **pod}}}}


def test_statefulset_immutable_spec_fields_are_422() -> None:
    store, _ = _store()
    sts = store.find_type("apps", "v1", "statefulsets")
    store.create(sts, "ns", _sts())
    store.patch(sts, "ns", "s", "application/merge-patch+json", {"spec": {"replicas": 3}})
    with pytest.raises(ApiError) as forbidden:
        store.patch(sts, "ns", "s", "application/merge-patch+json",
                    {"spec": {"serviceName": "b"}})
    assert forbidden.value.status == 422 and "serviceName" in forbidden.value.message


@pytest.mark.parametrize(("pod", "field"), [
    ({"nodeSelector": {"bad key!": "x"}}, "spec.template.spec.nodeSelector"),
    ({"priorityClassName": "Bad_Name!"}, "spec.template.spec.priorityClassName"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": "oops"}]}}}}, "matchExpressions"),
    ({"affinity": {"nodeAffinity": "x"}}, "nodeAffinity"),
    ({"containers": [{"name": "c", "image": "i", "volumeMounts": [
        {"name": "data", "mountPath": "/d"}, {"name": "data", "mountPath": "/d"}]}]},
     "volumeMounts.mountPath"),
    ({"containers": [{"name": "c", "image": "i", "env": [
        {"name": "X", "valueFrom": {"secretKeyRef": "nope"}}]}]}, "secretKeyRef"),
], ids=["label-key", "priority-class", "match-expressions", "node-affinity", "mount-path",
        "secret-key-ref"])
def test_invalid_builtin_objects_are_422_like_a_real_api_server(
        pod: dict[str, Any], field: str) -> None:
    store, _ = _store()
    sts = store.find_type("apps", "v1", "statefulsets")
    with pytest.raises(ApiError) as invalid:
        store.create(sts, "ns", _sts(**pod))
    assert invalid.value.status == 422
    assert any(field in f for f, _ in invalid.value.causes), invalid.value.causes
    assert store.list(sts) == []


def test_disabled_feature_gate_fields_are_dropped_silently() -> None:
    store = Store(feature_gates={"MaxUnavailableStatefulSet": False})
    for rtype in BUILTIN_TYPES:
        store.register(rtype)
    sts = store.find_type("apps", "v1", "statefulsets")
    body = _sts()
    body["spec"]["updateStrategy"] = {"type": "RollingUpdate",
                                      "rollingUpdate": {"maxUnavailable": 2, "partition": 1}}
    created = store.create(sts, "ns", body)
    assert created["spec"]["updateStrategy"]["rollingUpdate"] == {"partition": 1}


def test_pvc_resize_needs_a_bound_claim_growing_on_an_expandable_storage_class() -> None:
    store, _ = _store()
    pvcs = store.find_type("", "v1", "persistentvolumeclaims")
    classes = store.find_type("storage.k8s.io", "v1", "storageclasses")
    store.create(classes, None, {"metadata": {"name": "fixed"}, "provisioner": "x"})
    store.create(classes, None, {"metadata": {"name": "grows"}, "provisioner": "x",
                                 "allowVolumeExpansion": True})
    merge = "application/merge-patch+json"

    def claim(name: str, cls: str) -> None:
        made = store.create(pvcs, "ns", {"metadata": {"name": name}, "spec": {
            "storageClassName": cls, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}}}})
        store.replace(pvcs, "ns", name, {**made, "status": {"phase": "Bound"}}, "status")

    def grow(name: str, size: str) -> dict[str, Any]:
        return store.patch(pvcs, "ns", name, merge,
                           {"spec": {"resources": {"requests": {"storage": size}}}})

    claim("a", "fixed")
    claim("b", "grows")
    with pytest.raises(ApiError) as refused:
        grow("a", "20Gi")
    assert refused.value.status == 403 and "must support resize" in refused.value.message
    assert grow("b", "20Gi")["spec"]["resources"]["requests"]["storage"] == "20Gi"
    with pytest.raises(ApiError) as shrink:
        grow("b", "5Gi")
    assert shrink.value.status == 422
    with pytest.raises(ApiError) as other:
        store.patch(pvcs, "ns", "b", merge, {"spec": {"storageClassName": "fixed"}})
    assert other.value.status == 422
