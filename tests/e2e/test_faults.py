"""Faults injected at the emulator: 409s, 500 bursts, slow responses, dropped watches, and the
operator killed mid-reconcile. Every case must converge to exactly the planned children.

Real: the operator (KopfRunner in-process, or ``python -m hicache_operator run`` as a child
process for the kill), the emulator. The faults are the emulator's, by design.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from e2e_lib import EXAMPLES, Cluster, OperatorProcess, example
from emulator import Fault

pytestmark = pytest.mark.e2e


def _cr(name: str) -> dict[str, Any]:
    return example(EXAMPLES[0], name)  # deepseek-r1: all five kinds of children


def _creations(cluster: Cluster) -> Counter[tuple[str, str | None]]:
    return Counter((r.plural, r.name) for r in cluster.emu.requests()
                   if r.method == "POST" and r.code == 201 and r.plural != "events")


def test_conflicts_on_apply_are_retried(cluster: Cluster, operator: Any) -> None:
    create = cluster.emu.add_fault(Fault(method="POST", plural="statefulsets", status=409))
    cr = _cr("conflict")
    cluster.apply(cr)
    cluster.wait_children(cr)
    assert create.fired == 1
    patch = cluster.emu.add_fault(Fault(method="PATCH", plural="configmaps", status=409, times=2))
    # A host pool change reaches the ConfigMap (HICACHE_HOST_POOL_BYTES) in every L3 mode.
    hicache = {**cr["spec"]["hiCache"], "hostPoolPerRank": "150Gi"}
    cluster.patch_spec("conflict", {"hiCache": hicache})
    cr["spec"]["hiCache"]["hostPoolPerRank"] = "150Gi"
    cluster.wait_children(cr)
    assert patch.fired == 2


def test_server_error_bursts_and_slow_responses(cluster: Cluster, operator: Any) -> None:
    burst = cluster.emu.add_fault(Fault(plural="services", status=500, times=6))
    status = cluster.emu.add_fault(Fault(method="PATCH", plural="sglanghicaches",
                                         subresource="status", status=503, times=3))
    slow = cluster.emu.add_fault(Fault(method="GET", delay=0.3, times=20))
    cr = _cr("bursts")
    cluster.apply(cr)
    cluster.wait_children(cr, timeout=60)
    cluster.wait_condition("bursts", "SpecValid", "True", timeout=60)
    assert burst.fired == 6 and status.fired == 3 and slow.fired == 20
    assert max(_creations(cluster).values()) == 1


def test_dropped_watches_are_reestablished(cluster: Cluster, operator: Any) -> None:
    cr = _cr("watches")
    cluster.apply(cr)
    cluster.wait_children(cr)
    watches_before = sum(1 for r in cluster.emu.requests() if r.watch)
    assert cluster.emu.drop_watches() > 0
    cluster.emu.add_fault(Fault(method="WATCH", plural="sglanghicaches", drop_after=0, times=2))
    cluster.wait(lambda: sum(1 for r in cluster.emu.requests() if r.watch) > watches_before + 2,
                 "the operator to re-open its watches")
    cluster.patch_spec("watches", {"replicas": 2})
    cr["spec"]["replicas"] = 2
    cluster.wait_children(cr, timeout=60)


def test_operator_killed_mid_reconcile_converges_without_duplicates(
        cluster: Cluster, operator_process: OperatorProcess) -> None:
    # The first Service create stalls 3 s: the operator is killed while waiting for it.
    stall = cluster.emu.add_fault(Fault(method="POST", plural="services", delay=3.0))
    operator_process.start()
    cluster.wait_operator_watching()
    cr = _cr("killed")
    cluster.apply(cr)
    cluster.wait(lambda: stall.fired == 1, "the operator to be stalled mid-reconcile")
    operator_process.kill()
    assert not operator_process.alive
    partial = cluster.children("killed")
    assert 0 < len(partial) < 5, sorted(partial)  # killed half-way
    operator_process.start()
    cluster.wait_children(cr, timeout=60)
    cluster.wait_condition("killed", "Progressing", "True", timeout=30)
    creations = _creations(cluster)
    assert max(creations.values()) == 1, creations  # no child was created twice
    assert all(len(obj["metadata"]["ownerReferences"]) == 1
               for obj in cluster.children("killed").values())


def test_two_peered_replicas_have_one_active(cluster: Cluster, tmp_path: Any) -> None:
    """kopf peering (the chart's two replicas): the lower priority replica pauses."""
    cluster.emu.create("kopf.dev/v1", "kopfpeerings", {
        "metadata": {"name": "sglang-hicache-operator", "namespace": "shc-e2e"}})
    active = OperatorProcess(cluster, tmp_path / "active.log")
    standby = OperatorProcess(cluster, tmp_path / "standby.log")
    try:
        active.start("--priority", "100", standalone=False)
        cluster.wait(lambda: "Resuming operations" in active.log, "the active replica to run",
                     timeout=60)
        standby.start("--priority", "50", standalone=False)
        cluster.wait(lambda: "Initial authentication has finished" in standby.log,
                     "the standby to start", timeout=60)
        cr = _cr("peered")
        cluster.apply(cr)
        cluster.wait_children(cr, timeout=60)
        cluster.wait(lambda: "Handler 'cr_event' succeeded" in active.log, "the active to apply")
        # The standby stays paused: it handles nothing while the active replica lives.
        assert "Handler 'cr_event'" not in standby.log
        assert active.alive and standby.alive
    finally:
        active.stop()
        standby.stop()
