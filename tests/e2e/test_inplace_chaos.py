"""An in-place rollout of 4 pods through what a cluster throws at it (issue 25, "Proof"): the
router becomes unreadable, the operator is killed, a pod is evicted (a node drain) and comes
back; the operator never has more than ``maxUnavailable`` pods out of rotation at once, never
restarts an engine twice, and the rollout finishes.

Real: the operator as a process (``python -m hicache_operator run``, SIGKILLed and started
again), the emulator's API server and StatefulSet controller, HTTP from the operator to the
router's ``/workers``. Emulated: the kubelet (readiness gates, pull pods, restarts), the
scheduler (pods bound to nodes), the eviction (a DELETE of the pod, what a drain's eviction
does once the PDB allows it) and the router (a stdlib HTTP server answering smg's ``GET`` and
``DELETE /workers``, or 503). Counted: pod states the API server stored, restarts the kubelet
made.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_lib import NAMESPACE, Cluster, OperatorProcess
from test_inplace_gates import GATE, _condition, _engine_image, _FakeRouter
from test_inplace_rollout import NEW_IMAGE, READY_AFTER_S, _cr, _kubelet, _rolled_out

pytestmark = pytest.mark.e2e


def _out_of_rotation(cluster: Cluster) -> list[int]:
    """How many engine pods had the operator's gate False, after every pod change."""
    counts: list[int] = []
    closed: set[str] = set()

    def listener(event: Any) -> None:
        if event.rtype.plural != "pods" or not _engine_image(event.object):
            return
        name = event.object["metadata"]["name"]
        if event.type != "DELETED" and _condition(event.object, GATE) == "False":
            closed.add(name)
        else:
            closed.discard(name)
        counts.append(len(closed))
    cluster.emu.call(lambda s: s.listeners.append(listener))
    return counts


def test_a_rollout_survives_a_blocked_router_an_operator_kill_and_an_eviction(
        cluster: Cluster, operator_process: OperatorProcess) -> None:
    sim = cluster.emu.simulator
    assert sim is not None
    cluster.emu.call(lambda s: setattr(sim, "nodes", ("gpu-a", "gpu-b", "gpu-c", "gpu-d")))
    ips = [f"127.0.0.{30 + i}" for i in range(4)]
    with _FakeRouter(ips, cluster) as router:
        operator_process.start()
        cluster.wait_operator_watching()
        cr = _cr("chaos", replicas=4, maxUnavailable=1)
        cr["spec"]["router"] = {"enabled": True, "port": router.port}
        cluster.apply(cr)
        cluster.wait_children(cr)
        cluster.mark_pods_ready("chaos", 4, ips=ips)
        router_pod = cluster.wait(lambda: [p["metadata"]["name"] for p in cluster.emu.list(
            "v1", "pods", NAMESPACE) if p["metadata"]["name"].startswith("chaos-router-")],
            "the router's pod")[0]
        cluster.set_pod("pod_ready", router_pod, "127.0.0.1")
        cluster.wait_condition("chaos", "Ready", "True", timeout=60)
        kubelet = _kubelet(cluster)  # a restarted engine stays unready until the test says
        out = _out_of_rotation(cluster)
        cluster.patch_spec("chaos", {"image": NEW_IMAGE})
        cluster.wait(lambda: [p for p, _, _ in kubelet.restarts] == ["chaos-3"],
                     "chaos-3 restarting", 60)

        # The router goes dark, the operator dies, chaos-1 is evicted (its node drained).
        router.readable = False
        operator_process.kill()
        cluster.emu.delete("v1", "pods", NAMESPACE, "chaos-1")
        back = cluster.wait(lambda: next((p for p in cluster.pods("chaos") if p["metadata"][
            "name"] == "chaos-1" and not p.get("status", {}).get("containerStatuses")), None),
            "chaos-1 made again")
        assert _engine_image(back) == NEW_IMAGE  # from updateRevision: one model load
        cluster.set_pod("pod_ready", "chaos-1", ips[1])
        cluster.set_pod("pod_ready", "chaos-3", ips[3])  # its new engine passes its probe
        _kubelet(cluster, ready_after_restart=READY_AFTER_S)

        operator_process.start()
        cluster.wait_operator_watching()
        asked = router.asked
        cluster.wait(lambda: router.asked >= asked + 3, "three reads of the dark router", 60)
        cluster.wait(lambda: "cannot be read" in ((cluster.cr("chaos") or {}).get(
            "status") or {}).get("rollout", {}).get("waiting", ""), "the rollout to say why")
        assert [p for p, _, _ in kubelet.restarts] == ["chaos-3"]  # nothing new while dark

        router.readable = True
        cluster.wait(lambda: _rolled_out(cluster, "chaos"), "the rollout to finish", 120)
    assert sorted(p for p, _, _ in kubelet.restarts) == ["chaos-0", "chaos-2", "chaos-3"]
    assert max(out) == 1  # never more than maxUnavailable out of rotation by the operator
    assert all(_engine_image(p) == NEW_IMAGE and _condition(p, GATE) == "True"
               for p in cluster.pods("chaos"))

