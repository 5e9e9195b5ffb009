"""Child writes that never loop (refusals back off, dropped fields are not re-sent) and the SSD
claim expansion decision.

Real: ``controller.apply`` and ``controller.volumes``. Faked: the API client in the apply tests
(a recorder answering like an API server: a refusal, or a create that drops a field), and the
clock (so the backoff is tested by counting, not by waiting). The e2e tier runs the same code
against the emulator.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from hicache_operator.controller import diff
from hicache_operator.controller.apply import ChildMemory, ChildWriter, leaf_paths
from hicache_operator.controller.kube import KubeError
from hicache_operator.controller.volumes import claims_to_grow, plan_expansion

pytestmark = pytest.mark.unit
GI = 2**30


class _Kube:
    """Records writes; ``refuse`` answers creates with a 422, ``drop`` removes a field."""

    def __init__(self, refuse: bool = False, drop: str | None = None) -> None:
        self.refuse, self.drop, self.calls = refuse, drop, []  # type: ignore[var-annotated]

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        if self.refuse:
            raise KubeError(422, "Invalid", 'StatefulSet "x" is invalid: denied by policy')
        stored = copy.deepcopy(obj)
        if self.drop:
            stored["spec"].pop(self.drop, None)
        return stored

    async def merge_patch(self, *args: Any) -> dict[str, Any]:
        self.calls.append("patch")
        raise AssertionError("no patch expected")


def _want() -> dict[str, Any]:
    return diff.with_last_applied({"apiVersion": "apps/v1", "kind": "StatefulSet",
                                   "metadata": {"name": "x", "namespace": "n"},
                                   "spec": {"replicas": 1, "extra": {"a": 1}}})


def test_a_refused_object_is_resent_only_after_a_backoff_or_when_it_changes() -> None:
    now = [0.0]
    kube = _Kube(refuse=True)
    writer = ChildWriter(kube, clock=lambda: now[0])  # type: ignore[arg-type]
    memory, key = ChildMemory(), ("apps/v1", "StatefulSet", "x")

    def apply(want: dict[str, Any]) -> Any:
        return asyncio.run(writer.apply(key, want, None, memory))

    first = apply(_want())
    assert first.rejection is not None and "denied by policy" in first.rejection.describe(key)
    for second in range(1, 30):  # every resync of the first 30 s: no write
        now[0] = second
        assert apply(_want()).rejection is first.rejection
    assert kube.calls == ["create"]
    now[0] = 30.0  # backoff over: one more try, then twice as long
    assert apply(_want()).rejection.attempts == 2
    now[0] = 60.0
    apply(_want())
    assert kube.calls == ["create"] * 2
    changed = _want()
    changed["spec"]["replicas"] = 2
    apply(diff.with_last_applied({k: v for k, v in changed.items()}))  # a new spec: at once
    assert kube.calls == ["create"] * 3


def test_fields_the_server_drops_are_reported_once_and_not_resent() -> None:
    kube = _Kube(drop="extra")
    writer = ChildWriter(kube)  # type: ignore[arg-type]
    memory, key = ChildMemory(), ("apps/v1", "StatefulSet", "x")
    done = asyncio.run(writer.apply(key, _want(), None, memory))
    assert done.verb == "created" and done.dropped == ["spec.extra.a"]
    again = asyncio.run(writer.apply(key, _want(), done.obj, memory))
    assert again.verb == "" and again.dropped == [] and kube.calls == ["create"]
    assert leaf_paths({"spec": {"a": {"b": 1}, "c": None}}) == ["spec.a.b", "spec.c"]


def _pvc(name: str, size: str, storage_class: str | None = "local-nvme") -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"metadata": {"name": name}, "spec": spec}


def test_claims_grow_where_the_storage_class_allows_it() -> None:
    pvcs = [_pvc("umbp-ssd-x-0", "3500Gi"), _pvc("umbp-ssd-x-1", "4000Gi")]
    small = claims_to_grow({"umbp-ssd": 3700 * GI}, "x", pvcs)
    assert [(p["metadata"]["name"], size) for p, size in small] == [("umbp-ssd-x-0", 3700 * GI)]
    plan = plan_expansion(small, {"local-nvme": {"allowVolumeExpansion": True}})
    assert plan.refusal is None
    assert plan.patches == {
        "umbp-ssd-x-0": {"spec": {"resources": {"requests": {"storage": "3700Gi"}}}}}


def test_each_drive_claim_grows_to_its_own_template_size() -> None:
    """Several drives (claim templates umbp-ssd, umbp-ssd-1): a claim is matched to its
    template by the StatefulSet's naming rule (``<template>-<statefulset>-<ordinal>``), claims
    of other templates are left alone, and each grows to its own size. Pure, no fakes."""
    pvcs = [_pvc("umbp-ssd-x-0", "3500Gi"), _pvc("umbp-ssd-1-x-0", "3500Gi"),
            _pvc("umbp-ssd-1-x-1", "4000Gi"), _pvc("other-x-0", "1Gi")]
    small = claims_to_grow({"umbp-ssd": 3500 * GI, "umbp-ssd-1": 3800 * GI}, "x", pvcs)
    assert [(p["metadata"]["name"], size) for p, size in small] == [
        ("umbp-ssd-1-x-0", 3800 * GI)]


@pytest.mark.parametrize(("classes", "pvc", "why"), [
    ({"local-nvme": {}}, _pvc("a", "3500Gi"), "does not allow volume expansion"),
    ({"local-nvme": {"allowVolumeExpansion": False}}, _pvc("a", "3500Gi"), "does not allow"),
    ({}, _pvc("a", "3500Gi"), "local-nvme does not exist"),
    ({}, _pvc("a", "3500Gi", None), "has no StorageClass"),
])
def test_claims_that_cannot_grow_refuse_the_change_and_say_why(
        classes: dict[str, Any], pvc: dict[str, Any], why: str) -> None:
    plan = plan_expansion([(pvc, 3700 * GI)], {k: v or {"kind": "StorageClass"}
                                               for k, v in classes.items()})
    assert plan.patches == {} and plan.refusal is not None
    assert why in plan.refusal and "claim a (3500Gi)" in plan.refusal
    assert "Revert the size" in plan.refusal


def test_delete_with_resource_counts_on_any_drive() -> None:
    """deleteWithResource on any drive's claim template (the one ``volume`` or one of the
    ``volumes``) asks for the CR's claims to go with it; none asks nothing."""
    from hicache_operator.controller.volumes import delete_volumes_with_cr

    def cr(ssd: dict) -> dict:
        return {"spec": {"l3": {"ssd": ssd}}}

    claim = {"claimTemplate": {"size": "1Ti", "deleteWithResource": True}}
    keep = {"claimTemplate": {"size": "1Ti"}}
    assert delete_volumes_with_cr(cr({"volume": claim}))
    assert delete_volumes_with_cr(cr({"volumes": [keep, claim]}))
    assert not delete_volumes_with_cr(cr({"volumes": [keep, keep]}))
    assert not delete_volumes_with_cr(cr({"volume": {"emptyDir": {"sizeLimit": "1Gi"}}}))
    assert not delete_volumes_with_cr({"spec": {}})
