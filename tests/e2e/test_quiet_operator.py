"""What running the operator against a real API server showed: writes it need not make, and a
restarted operator that waited for its own ghost.

Real: the operator (KopfRunner, or ``python -m hicache_operator run`` as processes with kopf
peering through the chart's KopfPeering CRD), the emulator; counts are of requests the
operator sent. Faked: nothing else (no pods run in the first test: the emulated StatefulSet
controller is stopped, so the world stays exactly as the CR's creation left it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from e2e_lib import EXAMPLES, NAMESPACE, RESYNC_S, Cluster, OperatorProcess, example
from hicache_operator.controller.main import default_priority
from hicache_operator.controller.reconcile import MAX_CONCURRENT_RECONCILES

pytestmark = pytest.mark.e2e
POD_NAME = "sglang-hicache-operator-6d8f9c7b5-x2k4q"


def _minimal(name: str) -> dict[str, Any]:
    return example(next(p for p in EXAMPLES if "minimal" in p.stem), name)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_new_crs_status_is_written_once_the_steady_one(cluster: Cluster, operator: Any,
                                                         replicas: int) -> None:
    """The status written at creation already holds what the first resyncs compute (the cache
    block's window and the pods read so far; with 2 replicas the router block, whose message
    the resync timer computed first, so a second write added it), so nothing is rewritten
    while nothing changes."""
    cluster.emu.call(lambda store: store.listeners.clear())  # no StatefulSet controller: no pods
    cr = _minimal("once")
    cr["spec"]["replicas"] = replicas  # 2: the router is on by default
    cluster.apply(cr)
    cluster.wait(lambda: ((cluster.cr("once") or {}).get("status") or {}).get(
        "observedGeneration") == 1, "the first status")
    time.sleep(4 * RESYNC_S)  # four resyncs, each scraping the (no) ready pods
    status_writes = [w for w in cluster.emu.writes()
                     if w.plural == "sglanghicaches" and w.subresource == "status"]
    assert len(status_writes) == 1, [w.body_keys for w in status_writes]
    status = (cluster.cr("once") or {})["status"]
    assert (status["cache"]["windowSeconds"], status["cache"]["pods"]) == (300, 0)
    if replicas > 1:
        assert status["router"]["message"] == "no ready router pod to ask", status["router"]


def test_a_plan_warning_is_posted_when_it_appears_or_changes(
        cluster: Cluster, operator: Any) -> None:
    cr = _minimal("warned")
    cr["spec"]["replicas"] = 2
    cr["spec"]["updateStrategy"] = {"rollingUpdate": {"partition": 2}}
    cluster.apply(cr)

    def warnings() -> list[str]:
        return sorted(e["message"] for e in cluster.events("warned")
                      if e["reason"] == "PlanWarning")

    first = cluster.wait(lambda: (lambda w: w if any("partition 2 >= replicas 2" in x
                                                      for x in w) else [])(warnings()),
                         "the partition warning")
    cluster.wait_settled(RESYNC_S)
    first = warnings()  # every warning of the first plan, each posted once
    assert len(first) == len(set(first))
    cluster.patch_spec("warned", {"hiCache": {"hostPoolPerRank": "16Gi"}})  # a new plan
    cluster.wait(lambda: sum(e["reason"] == "Sized" for e in cluster.events("warned")) == 2,
                 "the new plan's Sized event")
    cluster.wait_settled(RESYNC_S)
    assert warnings() == first  # the same warnings: not posted again
    cluster.patch_spec("warned", {"updateStrategy": {"rollingUpdate": {"partition": 3}}})
    changed = cluster.wait(lambda: (lambda w: w if len(w) == len(first) + 1 else [])(
        warnings()), "the changed warning")
    assert sorted(set(changed) - set(first)) == [
        "updateStrategy.rollingUpdate.partition 3 >= replicas 2: no pod is updated to a new "
        "template until it is lowered"]


def _peering(cluster: Cluster) -> dict[str, Any]:
    return cluster.emu.find("kopf.dev/v1", "kopfpeerings", NAMESPACE,
                            "sglang-hicache-operator") or {}


def test_a_restarted_operator_pod_resumes_at_once_and_never_beside_another(
        cluster: Cluster, tmp_path: Path) -> None:
    """The operator's peering identity is its pod's name: after a crash (SIGKILL: its entry
    stays in the peering object, alive for 60 s) the restarted container recognises the entry
    as its own and resumes at once. An operator with another identity and the same priority
    is still kept paused while that entry lives (kopf's rule: never two active)."""
    cluster.emu.create("kopf.dev/v1", "kopfpeerings", {
        "metadata": {"name": "sglang-hicache-operator", "namespace": NAMESPACE}})
    env = {"POD_NAME": POD_NAME}
    first = OperatorProcess(cluster, tmp_path / "first.log")
    second = OperatorProcess(cluster, tmp_path / "second.log")
    other = OperatorProcess(cluster, tmp_path / "other.log")
    try:
        first.start(standalone=False, env_extra=env)
        cluster.wait(lambda: "Resuming operations" in first.log, "the operator to run", 60)
        cr = _minimal("survivor")
        cluster.apply(cr)
        cluster.wait_children(cr, timeout=60)
        first.kill()
        assert POD_NAME in (_peering(cluster).get("status") or {})  # its entry outlives it

        # A different identity with the same priority (the old behaviour of a restart): paused.
        other.start("--priority", str(default_priority(POD_NAME)), standalone=False)
        cluster.wait(lambda: "Possibly conflicting operators with the same priority" in
                     other.log, "the other operator to pause", 60)
        other.stop()

        second.start(standalone=False, env_extra=env)
        cluster.patch_spec("survivor", {"replicas": 2})
        cr["spec"]["replicas"] = 2
        cluster.wait_children(cr, timeout=45)  # paused, it would wait for the 60 s lifetime
        assert "Possibly conflicting" not in second.log
        assert "Pausing" not in second.log
    finally:
        for process in (first, second, other):
            process.stop()


def test_a_cr_created_at_an_operator_restart_does_not_queue_behind_unchanged_ones(
        cluster: Cluster, tmp_path: Path) -> None:
    """Issue 25 item 15: a restarted operator reconciles every existing CR once (16 at a time);
    a CR created right then used to wait for all of them. Now new and changed CRs take the next
    free slot: fewer existing CRs are read before the new CR's reconcile starts than
    there are existing CRs: at most the 16 whose reconciles were running when it arrived (with a
    plain semaphore: all 24, since kopf lists the new one last)."""
    cluster.emu.call(lambda store: store.listeners.clear())  # no pods: only the operator works
    first = OperatorProcess(cluster, tmp_path / "first.log")
    second = OperatorProcess(cluster, tmp_path / "second.log")
    names = [f"old-{i:02d}" for i in range(24)]
    try:
        first.start()
        for name in names:
            cluster.apply(_minimal(name))
        cluster.wait(lambda: all(((cluster.cr(n) or {}).get("status") or {}).get(
            "observedGeneration") == 1 for n in names), "every CR reconciled", 120)
        first.stop()
        start = len(cluster.emu.requests())
        second.start()
        cluster.apply(_minimal("zz-new"))  # listed after the others: last in a FIFO queue
        cluster.wait(lambda: cluster.child(("apps/v1", "statefulsets"), "zz-new"),
                     "the new CR's StatefulSet", 120)
        log = cluster.emu.requests()[start:]
        # Each reconcile starts by reading its CR afresh, inside its slot.
        began = next(i for i, r in enumerate(log) if r.method == "GET"
                     and r.plural == "sglanghicaches" and r.name == "zz-new")
        read_before = {r.name for r in log[:began] if r.method == "GET"
                       and r.plural == "sglanghicaches" and r.name in names}
        assert len(read_before) <= MAX_CONCURRENT_RECONCILES < len(names), sorted(read_before)
    finally:
        first.stop()
        second.stop()
