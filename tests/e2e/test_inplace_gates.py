"""In-place rollouts against what a cluster does around them (issue 25: items 1, 2, 3, 9, 10).

Real: the operator (kopf in-process), the emulator's API server and StatefulSet controller
(``newVersionedStatefulSetPod``: a missing ordinal below a RollingUpdate partition comes from
``currentRevision``; OnDelete makes every new pod from ``updateRevision``), HTTP from the
operator to a router's ``GET /workers``. Emulated: the kubelet (``emulator/kubelet.py``: Ready
only when the containers are ready and every readiness gate's condition is True; pull pods pull
their image and exit; a changed image restarts that container; a restarted engine is ready
``READY_AFTER_S`` later), the scheduler (pods bound to nodes by ordinal), and the router: a
stdlib HTTP server answering smg's ``GET /workers`` (or 503) and ``DELETE /workers/{id}``, not
smg. Every count is of requests
the operator sent or of pod states the API server stored.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from e2e_lib import NAMESPACE, Cluster
from test_inplace_rollout import IMAGE, NEW_IMAGE, READY_AFTER_S, _cr, _kubelet, _ready, _rolled_out

pytestmark = pytest.mark.e2e
GATE = "hicache.sglang.ai/in-place-ready"


def _engine_image(pod: dict[str, Any]) -> str:
    """The engine container's image ("" for a pod without one: a pull pod)."""
    return next((c["image"] for c in pod["spec"]["containers"] if c["name"] == "engine"), "")


def _condition(pod: dict[str, Any] | None, kind: str) -> str | None:
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def _record_patches(cluster: Cluster) -> list[tuple[float, str, dict[str, Any]]]:
    """(when, pod, the pod just before) for every engine image change the API server stores."""
    seen: list[tuple[float, str, dict[str, Any]]] = []

    def listener(event: Any) -> None:
        if event.rtype.plural != "pods" or event.type != "MODIFIED" or event.prev is None:
            return
        if _engine_image(event.prev) != _engine_image(event.object):
            seen.append((event.at, event.object["metadata"]["name"], event.prev))
    cluster.emu.call(lambda s: s.listeners.append(listener))
    return seen


def test_each_pod_leaves_the_rotation_and_gets_its_image_before_its_engine_restarts(
        cluster: Cluster, operator: Any) -> None:
    """Items 2 and 10: per pod, a pull pod on its node pulls the new image first, then the
    operator sets the pod's readiness gate False (the kubelet turns it not Ready, so Endpoints
    and the router drop it), and only then patches the engine image; the gate opens again once
    the new engine is ready. No pod is patched while Ready."""
    sim = cluster.emu.simulator
    assert sim is not None
    cluster.emu.call(lambda s: setattr(sim, "nodes", ("gpu-a", "gpu-b", "gpu-c")))
    cr = _cr("gated")
    cluster.apply(cr)
    cluster.wait_children(cr)
    cluster.mark_pods_ready("gated", 3)
    # Ready needs the operator's gate: it opens it on each new pod.
    cluster.wait_condition("gated", "Ready", "True")
    assert all(_condition(p, GATE) == "True" for p in cluster.pods("gated"))
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    patched = _record_patches(cluster)
    start = len(cluster.emu.writes())
    cluster.patch_spec("gated", {"image": NEW_IMAGE})
    cluster.wait_condition("gated", "Progressing", "True", "RollingOutInPlace")
    cluster.wait(lambda: _rolled_out(cluster, "gated"), "the in-place rollout to finish", 90)

    assert sorted(name for _, name, _ in patched) == ["gated-0", "gated-1", "gated-2"]
    for _, name, before in patched:
        assert _condition(before, GATE) == "False", f"{name} patched with its gate open"
        assert _condition(before, "Ready") == "False", f"{name} patched while Ready"
    nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods("gated")}
    assert sorted(kubelet.pulls and [(n, i) for _, n, i in kubelet.pulls]) == sorted(
        (node, NEW_IMAGE) for node in nodes.values())
    for at, name, _ in patched:  # each node's pull finished before its pod's engine patch
        pulled = [t for t, node, _ in kubelet.pulls if node == nodes[name]]
        assert pulled and pulled[0] < at
    assert all(_condition(p, GATE) == "True" for p in cluster.pods("gated"))
    writes = cluster.emu.writes()[start:]
    pull_writes = [(w.method, w.name) for w in writes if w.plural == "pods"
                   and w.method in ("POST", "DELETE")]
    assert sorted(m for m, _ in pull_writes) == ["DELETE"] * 3 + ["POST"] * 3  # made, then gone
    assert not [p for p in cluster.emu.list("v1", "pods", NAMESPACE)
                if "-pull-" in p["metadata"]["name"]]
    assert [p for p, _, _ in kubelet.restarts] == ["gated-2", "gated-1", "gated-0"]


class _FakeRouter:
    """smg's ``GET /workers`` on 127.0.0.1 (or 503: unreadable) and ``DELETE /workers/{id}``.
    Every engine pod IP is listed healthy until the operator removes it; as smg's discovery
    does, a removed pod is listed again once its pod is Ready again (``cluster``: the pods as
    the API server has them; the operator removes a pod only once it is not Ready)."""

    def __init__(self, ips: list[str], cluster: Cluster | None = None) -> None:
        self.ips, self.readable, self.asked = ips, True, 0
        self.removed: set[str] = set()
        self.deletes: list[str] = []
        router = self

        def ready(ip: str) -> bool:
            return cluster is not None and any(
                (p.get("status") or {}).get("podIP") == ip and _condition(p, "Ready") == "True"
                for p in cluster.emu.list("v1", "pods", NAMESPACE))

        def listed() -> list[str]:
            router.removed -= {ip for ip in router.removed if ready(ip)}
            return [ip for ip in router.ips if ip not in router.removed]

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any = None) -> None:
                raw = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                router.asked += 1
                if not router.readable:
                    self._answer(503)
                    return
                ips = listed()
                self._answer(200, {"workers": [
                    {"id": f"worker-{ip}", "url": f"http://{ip}:30000", "is_healthy": True,
                     "status": "ready"} for ip in ips], "total": len(ips)})

            def do_DELETE(self) -> None:
                if not router.readable:
                    self._answer(503)
                    return
                ip = self.path.rsplit("worker-", 1)[-1]
                if ip not in router.ips or ip in router.removed:
                    self._answer(404, {"code": "WORKER_NOT_FOUND"})
                    return
                router.removed.add(ip)
                router.deletes.append(ip)
                self._answer(202, {"status": "accepted"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _FakeRouter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()


@pytest.fixture
def fake_router(cluster: Cluster) -> Iterator[_FakeRouter]:
    with _FakeRouter([f"127.0.0.{20 + i}" for i in range(3)], cluster) as router:
        yield router


def test_an_unreadable_router_holds_the_rollout_and_restarts_nothing(
        cluster: Cluster, operator: Any, fake_router: _FakeRouter) -> None:
    """Item 1: with the router's worker list unreadable the rollout waits (no gate closed, no
    engine patched; the status says why) instead of restarting every engine at once; once the
    router answers again it goes on one pod at a time."""
    cr = _cr("routed", replicas=3)
    cr["spec"]["router"] = {"enabled": True, "port": fake_router.port}
    cluster.apply(cr)
    cluster.wait_children(cr)
    cluster.mark_pods_ready("routed", 3, ips=fake_router.ips)
    router_pods = cluster.wait(lambda: [p["metadata"]["name"] for p in cluster.emu.list(
        "v1", "pods", NAMESPACE) if p["metadata"]["name"].startswith("routed-router-")],
        "the router's pod")
    cluster.set_pod("pod_ready", router_pods[0], "127.0.0.1")
    cluster.wait_condition("routed", "Ready", "True")
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    fake_router.readable = False
    start = len(cluster.emu.writes())
    cluster.patch_spec("routed", {"image": NEW_IMAGE})
    cluster.wait_condition("routed", "Progressing", "True", "RollingOutInPlace")
    asked = fake_router.asked
    cluster.wait(lambda: fake_router.asked >= asked + 3, "three more reads of the router", 30)
    assert not [w for w in cluster.emu.writes()[start:] if w.plural == "pods"]
    assert kubelet.restarts == []
    cluster.wait(lambda: "cannot be read" in cluster.condition("routed", "Progressing")[
        "message"], "the rollout to say why it waits")
    rollout = (cluster.cr("routed") or {})["status"]["rollout"]
    assert "GET /workers answered 503" in rollout["waiting"]
    fake_router.readable = True
    cluster.wait(lambda: _rolled_out(cluster, "routed"), "the rollout to finish", 90)
    from test_inplace_rollout import _max_down_at_once
    assert _max_down_at_once(kubelet.timeline) == 1
    assert sorted(set(fake_router.deletes)) == fake_router.ips  # each left the router first


def test_a_pod_deleted_mid_rollout_comes_back_on_the_new_image(
        cluster: Cluster, operator: Any) -> None:
    """Item 9: while pods are updated in place the StatefulSet is OnDelete, so a pod deleted
    meanwhile is made from updateRevision (held at partition = replicas it came back from
    currentRevision, on the old image, and was restarted in place once more)."""
    cr = _cr("recreated")
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "recreated", 3)
    kubelet = _kubelet(cluster)  # a restarted engine stays unready until the test says
    cluster.patch_spec("recreated", {"image": NEW_IMAGE})
    cluster.wait(lambda: [p for p, _, _ in kubelet.restarts] == ["recreated-2"],
                 "recreated-2 restarting")
    old_uid = next(p["metadata"]["uid"] for p in cluster.pods("recreated")
                   if p["metadata"]["name"] == "recreated-0")
    cluster.emu.delete("v1", "pods", NAMESPACE, "recreated-0")
    again = cluster.wait(lambda: next((p for p in cluster.pods("recreated")
                                       if p["metadata"]["name"] == "recreated-0"
                                       and p["metadata"]["uid"] != old_uid), None),
                         "recreated-0 made again")
    assert _engine_image(again) == NEW_IMAGE  # one model load, on the new image
    assert (cluster.child(("apps/v1", "statefulsets"), "recreated") or {})["spec"][
        "updateStrategy"] == {"type": "OnDelete"}
    _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    cluster.set_pod("pod_ready", "recreated-2")
    cluster.ready_until("recreated", lambda: _rolled_out(cluster, "recreated"),
                        "the rollout to finish", 90)
    # recreated-0 was never patched: its engine started once, on the new image.
    assert sorted(p for p, _, _ in kubelet.restarts) == ["recreated-1", "recreated-2"]


def _sts_patch(cluster: Cluster, name: str, body: dict[str, Any]) -> None:
    rtype = cluster.emu.rtype("apps/v1", "statefulsets")
    cluster.emu.call(lambda s: s.patch(rtype, NAMESPACE, name, "application/merge-patch+json",
                                       body))


def test_kubectl_rollout_restart_restarts_each_engine_in_place(
        cluster: Cluster, operator: Any) -> None:
    """Item 3: ``kubectl rollout restart`` (the template annotation it writes) restarts every
    engine in place, one pod at a time, instead of relabelling pods and failing later."""
    cr = _cr("kubectl-restart", replicas=2)
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "kubectl-restart", 2)
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    _sts_patch(cluster, "kubectl-restart", {"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": "2027-01-15T09:00:00Z"}}}}})
    cluster.wait(lambda: len(kubelet.restarts) == 2 and _rolled_out(cluster, "kubectl-restart"),
                 "both engines restarted", 90)
    assert kubelet.restarts == [(f"kubectl-restart-{i}", "engine",
                                 "configuration revision changed") for i in (1, 0)]
    assert cluster.condition("kubectl-restart", "Degraded")["status"] == "False"
    assert all(_engine_image(p) == IMAGE for p in cluster.pods("kubectl-restart"))


def test_kubectl_rollout_undo_is_reported_and_the_crs_template_restored(
        cluster: Cluster, operator: Any) -> None:
    """Item 3: ``kubectl rollout undo`` writes an older template; the operator restores the
    CR's and says why (Event), restarting nothing."""
    cr = _cr("kubectl-undo", replicas=2)
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "kubectl-undo", 2)
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    sts = cluster.child(("apps/v1", "statefulsets"), "kubectl-undo")
    assert sts is not None
    containers = sts["spec"]["template"]["spec"]["containers"]
    undone = [{**c, "image": "ghcr.io/sglang-hicache/engine:0.0.9"} if c["name"] == "engine"
              else c for c in containers]
    _sts_patch(cluster, "kubectl-undo", {"spec": {"template": {"spec": {"containers": undone}}}})
    cluster.wait(lambda: [e for e in cluster.events("kubectl-undo")
                          if e["reason"] == "TemplateChangedOutsideOperator"], "the Event")
    cluster.wait(lambda: _engine_image((cluster.child(("apps/v1", "statefulsets"),
                                                      "kubectl-undo") or {})["spec"][
        "template"]) == IMAGE, "the CR's template back")
    time.sleep(2)  # resyncs: nothing restarts
    assert kubelet.restarts == []


def test_an_image_that_cannot_be_pulled_stops_the_rollout_before_any_engine_stops(
        cluster: Cluster, operator: Any) -> None:
    """Item 10: the pull pod fails to pull (``ErrImagePull``): the rollout stops with
    ``Degraded``/``InPlaceUpdateFailed`` naming the pod and node, and every engine keeps
    serving the old image (before, the kubelet stopped the engine and then failed the pull)."""
    sim = cluster.emu.simulator
    assert sim is not None
    cluster.emu.call(lambda s: setattr(sim, "nodes", ("gpu-a", "gpu-b")))
    cr = _cr("unpullable", replicas=2)
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "unpullable", 2)
    bad = "registry.example/engine:missing"
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S, bad_images={bad})
    cluster.patch_spec("unpullable", {"image": bad})
    cond = cluster.wait_condition("unpullable", "Degraded", "True", "InPlaceUpdateFailed")
    assert cond["message"].startswith(f"pod unpullable-1: the new engine image {bad} could not "
                                      "be pulled on node gpu-b ahead of the restart")
    time.sleep(2)  # resyncs: nothing is touched
    assert kubelet.restarts == []
    pods = cluster.pods("unpullable")
    assert all(_engine_image(p) == IMAGE and _condition(p, "Ready") == "True" for p in pods)
