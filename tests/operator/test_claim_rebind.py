"""SSD claims pinned to a lost node (issue 25, item 7): the pure decision and the retention
policy the StatefulSet gets.

Real: ``planner.claim_rebind`` and ``plan()``; the objects are written as the API returns them.
Nothing is faked."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import plan
from hicache_operator.planner.claim_rebind import (
    bound_volumes,
    node_matches,
    pending_since,
    stranded,
)
from shc_testlib import load_example

pytestmark = pytest.mark.unit
VOLUME = "umbp-ssd"
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
STAMP = "2027-01-15T08:00:00Z"


def _pod(name: str = "m-0", node: str = "", phase: str = "Pending",
         scheduled_false_at: str | None = STAMP) -> dict[str, Any]:
    conditions = [] if scheduled_false_at is None else [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "lastTransitionTime": scheduled_false_at}]
    return {"metadata": {"name": name, "creationTimestamp": "2027-01-15T07:00:00Z"},
            "spec": {"nodeName": node, "volumes": [
                {"name": VOLUME, "persistentVolumeClaim": {"claimName": f"{VOLUME}-{name}"}}]},
            "status": {"phase": phase, "conditions": conditions}}


def _claim(pod: str = "m-0", pv: str | None = "pv-1", phase: str = "Bound") -> dict[str, Any]:
    return {"metadata": {"name": f"{VOLUME}-{pod}"},
            "spec": {**({"volumeName": pv} if pv else {})}, "status": {"phase": phase}}


def _pv(name: str = "pv-1", host: str = "gpu-a") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeAffinity": {"required": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}}}


def _node(name: str, ready: bool = True, cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "zone": "z1", "gen": "5"}},
            "spec": {"unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def _stranded(nodes: list[dict[str, Any]], after: int = 300, **pod: Any) -> list[Any]:
    return stranded([_pod(**pod)], [_claim()], {"pv-1": _pv()}, nodes, VOLUME, after)


@pytest.mark.parametrize(("nodes", "why"), [
    ([_node("gpu-b")], "its node no longer exists"),
    ([_node("gpu-a", cordoned=True), _node("gpu-b")], "node gpu-a is cordoned"),
    ([_node("gpu-a", ready=False)], "node gpu-a is not Ready"),
])
def test_a_claim_whose_node_is_gone_cordoned_or_not_ready_strands_its_pod(
        nodes: list[dict[str, Any]], why: str) -> None:
    (s,) = _stranded(nodes)
    assert (s.pod, s.claim, s.volume) == ("m-0", f"{VOLUME}-m-0", "pv-1")
    assert why in s.why
    assert s.pending_since == T0 and s.due_at == T0 + 300
    assert not s.due(T0 + 299) and s.due(T0 + 300)


def test_a_usable_node_for_the_volume_means_the_pod_waits_for_something_else() -> None:
    assert _stranded([_node("gpu-a"), _node("gpu-b", cordoned=True)]) == []


@pytest.mark.parametrize("pod", [
    {"node": "gpu-a"},  # scheduled: the kubelet's business
    {"phase": "Running"},
])
def test_only_pending_unscheduled_pods_are_candidates(pod: dict[str, Any]) -> None:
    assert _stranded([_node("gpu-b")], **pod) == []


def test_unbound_claims_and_unpinned_volumes_are_left_alone() -> None:
    assert bound_volumes([_pod()], [_claim(pv=None)], VOLUME) == {}
    assert bound_volumes([_pod()], [_claim(phase="Pending")], VOLUME) == {}
    assert bound_volumes([_pod()], [_claim()], VOLUME) == {"m-0": "pv-1"}
    free = {"metadata": {"name": "pv-1"}, "spec": {}}
    assert stranded([_pod()], [_claim()], {"pv-1": free}, [], VOLUME, 0) == []
    assert stranded([_pod()], [_claim()], {}, [], VOLUME, 0) == []  # volume not readable


def test_pending_since_is_the_scheduling_failure_else_the_creation() -> None:
    assert pending_since(_pod()) == T0
    assert pending_since(_pod(scheduled_false_at=None)) == T0 - 3600
    deleting = _pod()
    deleting["metadata"]["deletionTimestamp"] = STAMP
    assert pending_since(deleting) is None


@pytest.mark.parametrize(("expr", "fields", "match"), [
    ({"key": "zone", "operator": "In", "values": ["z1", "z2"]}, False, True),
    ({"key": "zone", "operator": "NotIn", "values": ["z1"]}, False, False),
    ({"key": "rack", "operator": "NotIn", "values": ["r1"]}, False, True),
    ({"key": "zone", "operator": "Exists"}, False, True),
    ({"key": "rack", "operator": "DoesNotExist"}, False, True),
    ({"key": "gen", "operator": "Gt", "values": ["4"]}, False, True),
    ({"key": "gen", "operator": "Lt", "values": ["4"]}, False, False),
    ({"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}, True, True),
    ({"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}, True, False),
])
def test_node_affinity_operators(expr: dict[str, Any], fields: bool, match: bool) -> None:
    term = {"matchFields" if fields else "matchExpressions": [expr]}
    affinity = {"required": {"nodeSelectorTerms": [term]}}
    assert node_matches(affinity, _node("gpu-a")) is match
    # terms are ORed
    other = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]}
    assert node_matches({"required": {"nodeSelectorTerms": [other, term]}},
                        _node("gpu-a")) is match


def test_the_retention_policy_deletes_a_scaled_down_pods_claim_by_default() -> None:
    cr = copy.deepcopy(load_example("deepseek-r1-mi355x.yaml"))
    sts = next(o for o in plan(cr, OperatorConfig()).objects if o["kind"] == "StatefulSet")
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Delete"}
    claim = cr["spec"]["l3"]["ssd"]["volume"]["claimTemplate"]
    claim.update(whenScaled="Retain", deleteWithResource=True)
    sts = next(o for o in plan(cr, OperatorConfig()).objects if o["kind"] == "StatefulSet")
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete", "whenScaled": "Retain"}
