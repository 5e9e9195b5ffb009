"""Rollouts of multi-terabyte cache pods: the update strategy, and fields a cluster drops.

Real: the operator (KopfRunner), the emulator (which honours OnDelete and partitions in its
StatefulSet controller, and drops ``maxUnavailable`` when the MaxUnavailableStatefulSet feature
gate is off, as an API server does). Faked: the StatefulSet controller/kubelet are the
emulator's minimal ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_lib import EXAMPLES, RESYNC_S, Cluster, example

pytestmark = pytest.mark.e2e


def _cr(name: str, replicas: int, strategy: dict[str, Any]) -> dict[str, Any]:
    cr = example(next(p for p in EXAMPLES if "minimal" in p.stem), name)
    cr["spec"]["replicas"] = replicas
    cr["spec"]["updateStrategy"] = strategy
    return cr


def _uids(cluster: Cluster, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods(name)}


def _change_template(cluster: Cluster, cr: dict[str, Any]) -> None:
    env = [{"name": "LOG_LEVEL", "value": "debug"}]
    cluster.patch_spec(cr["metadata"]["name"], {"engine": {"env": env}})
    cr["spec"]["engine"] = {"env": env}
    cluster.wait_children(cr)


def test_on_delete_keeps_running_pods_until_they_are_deleted(
        cluster: Cluster, operator: Any) -> None:
    cr = _cr("manual", 2, {"type": "OnDelete"})
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    assert live[("StatefulSet", "manual")]["spec"]["updateStrategy"] == {"type": "OnDelete"}
    cluster.mark_pods_ready("manual", 2)
    cluster.wait_condition("manual", "Ready", "True")
    before = _uids(cluster, "manual")
    _change_template(cluster, cr)
    cond = cluster.wait_condition("manual", "Progressing", "False", "UpdateHeld")
    assert "2 pod(s) run the previous template" in cond["message"] and "OnDelete" in \
        cond["message"]
    assert _uids(cluster, "manual") == before  # nothing restarted
    assert cluster.condition("manual", "Ready")["status"] == "True"
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(3 * RESYNC_S) == []
    cluster.emu.delete("v1", "pods", "shc-e2e", "manual-0")  # the user picks the moment
    cluster.wait(lambda: _uids(cluster, "manual").get("manual-0") not in (None,
                                                                          before["manual-0"]),
                 "manual-0 recreated on the new template")
    cluster.mark_pods_ready("manual", 2)
    cluster.wait(lambda: "1 pod(s) run the previous template" in cluster.condition(
        "manual", "Progressing").get("message", ""), "one pod left on the old template")


def test_partition_updates_only_the_pods_above_it(cluster: Cluster, operator: Any) -> None:
    cr = _cr("canary", 3, {"rollingUpdate": {"partition": 2}})
    cluster.apply(cr)
    live = cluster.wait_children(cr)
    assert live[("StatefulSet", "canary")]["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    cluster.mark_pods_ready("canary", 3)
    cluster.wait_condition("canary", "Ready", "True")
    before = _uids(cluster, "canary")
    _change_template(cluster, cr)
    cluster.wait(lambda: _uids(cluster, "canary").get("canary-2") not in (
        None, before["canary-2"]), "the canary (ordinal 2) replaced")
    after = _uids(cluster, "canary")
    assert (after["canary-0"], after["canary-1"]) == (before["canary-0"], before["canary-1"])
    cluster.mark_pods_ready("canary", 3)
    cond = cluster.wait_condition("canary", "Progressing", "False", "UpdateHeld")
    assert "partition 2" in cond["message"]
    cluster.patch_spec("canary", {"updateStrategy": {"rollingUpdate": {"partition": 0}}})
    cluster.ready_until("canary", lambda: before["canary-0"] not in _uids(
        cluster, "canary").values(), "the rest rolled, one by one, after lowering the partition")
    cluster.mark_pods_ready("canary", 3)
    cluster.wait_condition("canary", "Progressing", "False", "Available")


def test_a_field_the_cluster_drops_is_reported_once_not_resent(
        cluster: Cluster, operator: Any) -> None:
    """maxUnavailable on a cluster without the MaxUnavailableStatefulSet feature: the API
    server drops it, so the live StatefulSet never matches; the operator says so once
    (FieldsNotPersisted) and does not patch it again on every resync."""
    def gate_off(store: Any) -> None:
        store.feature_gates["MaxUnavailableStatefulSet"] = False

    cluster.emu.call(gate_off)
    cr = _cr("gated", 2, {"rollingUpdate": {"maxUnavailable": 2}})
    cluster.apply(cr)
    cluster.wait(lambda: cluster.child(("apps/v1", "statefulsets"), "gated"), "the StatefulSet")
    cluster.wait(lambda: [e for e in cluster.events("gated")
                          if e["reason"] == "FieldsNotPersisted"], "FieldsNotPersisted")
    event = next(e for e in cluster.events("gated") if e["reason"] == "FieldsNotPersisted")
    assert "spec.updateStrategy.rollingUpdate.maxUnavailable" in event["message"]
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(4 * RESYNC_S) == []
    sts_writes = [r for r in cluster.emu.writes() if r.plural == "statefulsets"]
    assert [r.method for r in sts_writes] == ["POST"]
    # Another change is still applied (only the dropped field is not re-sent).
    cluster.patch_spec("gated", {"replicas": 3})
    cluster.wait(lambda: (cluster.child(("apps/v1", "statefulsets"), "gated") or {})[
        "spec"]["replicas"] == 3, "replicas 3 applied")
