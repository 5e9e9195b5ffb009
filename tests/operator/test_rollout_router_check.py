"""In-place rollouts wait for the router: where a router serves the CR, its worker set (read
afresh from the router) is a serving check, so the next pod restarts only once the router
routes to the restarted one (``Reconciler._serving_checks``, ``router_status.routed_pods``).
The rollout decision's side of it is in test_rollout_decide.py (a serving check holds the next
pod). Real: the planner, the reconciler, the rollout decision; faked: the API client and the
router's answer."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig, RolloutConfig
from hicache_operator.controller import inplace
from hicache_operator.controller.reconcile import Reconciler
from hicache_operator.controller.rollout import IN_PLACE_ANNOTATION, Decision
from hicache_operator.controller.router_status import (
    RouterObservation,
    routed_pods,
    router_pod_selector,
)
from hicache_operator.plan import plan
from shc_testlib import load_example
from test_rollout_decide import NEW, NOW, OLD, _live, _sts
from test_rollout_decide import _pod as _api_pod


def _pod(name: str, ip: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"podIP": ip} if ip else {}}


def test_the_routed_pods_are_the_router_s_healthy_workers_by_pod_ip() -> None:
    pods = [_pod("a-0", "10.0.0.1"), _pod("a-1", "10.0.0.2"), _pod("a-2", None)]
    seen = RouterObservation(frozenset({"10.0.0.2", "10.9.9.9"}), workers=3)
    assert routed_pods(pods, seen) == {"a-1"}
    # an unreadable router: nobody knows which pods it routes to (None, never "none of them",
    # which made every pod look unavailable anyway and restarted them all: issue 25, item 1)
    assert routed_pods(pods, RouterObservation(None, error="GET /workers failed")) is None


class _Kube:
    def __init__(self) -> None:
        self.lists: list[tuple[str, str, str]] = []

    async def list(self, api_version: str, kind: str, namespace: str,
                   selector: str) -> list[dict[str, Any]]:
        self.lists.append((kind, namespace, selector))
        return [_pod("router-pod", "10.0.9.1")]


def test_a_rollout_asks_the_router_where_it_serves_the_cr(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["metadata"]["namespace"] = "ns"
    cr["spec"].update(replicas=2, updateStrategy={"type": "InPlaceIfPossible"})
    name = cr["metadata"]["name"]
    planned = plan(cr, OperatorConfig())
    assert planned.router is not None  # on by default from 2 replicas
    kube = _Kube()
    rec = Reconciler(kube, OperatorConfig())  # type: ignore[arg-type]
    asked: list[tuple[tuple[str, str], list[str], int]] = []

    async def observe(key: tuple[str, str], router_pods: Sequence[Mapping[str, Any]],
                      port: int) -> RouterObservation:
        asked.append((key, [p["metadata"]["name"] for p in router_pods], port))
        return RouterObservation(frozenset({"10.0.0.1"}), workers=2)

    monkeypatch.setattr(rec.router_reader, "observe", observe)
    # The router's Deployment has no available pod and the Service does not point at it yet:
    # the router serves nothing, Ready alone counts.
    assert rec._serving_checks(planned, {}, ("ns", name)) == []
    live: dict[tuple[str, str, str], dict[str, Any]] = {
        ("apps/v1", "Deployment", f"{name}-router"): {"status": {"availableReplicas": 1}}}
    checks = rec._serving_checks(planned, live, ("ns", name))
    assert len(checks) == 1 and kube.lists == []  # asked only when the rollout asks
    pods = [_pod(f"{name}-0", "10.0.0.1"), _pod(f"{name}-1", "10.0.0.2")]
    assert asyncio.run(checks[0](cr, pods)) == {f"{name}-0"}
    assert kube.lists == [("Pod", "ns", router_pod_selector(name))]
    assert asked == [(("ns", name), ["router-pod"], planned.spec.router.port)]

    # One replica: no router, nothing to ask.
    single = copy.deepcopy(cr)
    single["spec"]["replicas"] = 1
    alone = plan(single, OperatorConfig())
    assert alone.router is None
    assert rec._serving_checks(alone, live, ("ns", name)) == []


def test_a_serving_check_holds_the_next_pod_until_the_restarted_one_is_back() -> None:
    """The extension point for a router's worker set: a Ready pod that a check does not list
    yet is not done, so the next pod waits; a check that cannot tell holds the rollout; the
    checks are asked only while a rollout runs."""
    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["metadata"]["namespace"] = "ns"
    cr["spec"].update(replicas=3, image="engine:2", updateStrategy={"type": "InPlaceIfPossible"})
    cr["spec"]["l3"]["image"] = "engine:1"
    planned = plan(cr, OperatorConfig())
    new = next(o for o in planned.objects if o["kind"] == "StatefulSet")
    old = _sts("engine:1")
    restarted = _api_pod(new, 2, NEW, container_id="c-2")
    restarted["metadata"]["annotations"][IN_PLACE_ANNOTATION] = json.dumps(
        {"revision": NEW, "containerID": "c-1", "requestedAt": "2027-01-15T08:00:00Z"})
    pods = [_api_pod(old, 0, OLD), _api_pod(old, 1, OLD), restarted]
    asked: list[list[str]] = []
    workers: set[str] | str = {"tiny-llama-sa-0", "tiny-llama-sa-1"}

    class Router:
        async def __call__(self, cr: Mapping[str, Any],
                           pods: Sequence[Mapping[str, Any]]) -> set[str] | str:
            asked.append(sorted(p["metadata"]["name"] for p in pods))
            return workers

    def run(pods: list[dict[str, Any]]) -> Decision | None:
        desired = {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o
                   for o in planned.objects}
        live = {(new["apiVersion"], "StatefulSet", new["metadata"]["name"]):
                _live(new, NEW, OLD)}
        settings = RolloutConfig(drain_grace_seconds=0, prepull=False)
        return asyncio.run(inplace.decide(planned, cr, desired, live, pods, [Router()],
                                          settings, clock=lambda: NOW))

    held = run(pods)
    assert held is not None and held.patches == () and held.gates == ()
    assert held.status is not None and held.status["restarting"] == ["tiny-llama-sa-2"]
    workers = {"tiny-llama-sa-0", "tiny-llama-sa-1", "tiny-llama-sa-2"}  # routed again
    moved = run(pods)
    assert moved is not None and [(g.pod, g.ready) for g in moved.gates] == [
        ("tiny-llama-sa-1", False)]
    workers = "the router's worker list cannot be read"
    unknown = run(pods)
    assert unknown is not None and unknown.gates == () and unknown.patches == ()
    assert unknown.status is not None and unknown.status["waiting"] == workers
    asked.clear()
    done = [_api_pod(new, i, NEW) for i in range(3)]
    assert run(done) is not None and asked == []  # no rollout: the router is not asked


def test_the_router_drains_pods_whose_gate_is_closed_and_that_are_not_ready() -> None:
    """``inplace.draining_ips``: the pods the operator takes out of the router's workers are
    those its in-place update closed the gate of (reason InPlaceUpdate) and that the kubelet
    reports not Ready; a pod still Ready would be registered again by smg's discovery at its
    next event, and a pod not Ready for another reason is the health checks' business."""
    from hicache_operator.builders.context import IN_PLACE_READY_GATE
    from hicache_operator.controller.rollout_steps import GATE_DRAINING

    def pod(name: str, ip: str, gate: str, reason: str, ready: str) -> dict[str, Any]:
        return {"metadata": {"name": name},
                "spec": {"readinessGates": [{"conditionType": IN_PLACE_READY_GATE}]},
                "status": {"podIP": ip, "conditions": [
                    {"type": IN_PLACE_READY_GATE, "status": gate, "reason": reason},
                    {"type": "Ready", "status": ready}]}}

    pods = [pod("a-0", "10.0.0.1", "False", GATE_DRAINING, "False"),  # draining
            pod("a-1", "10.0.0.2", "False", GATE_DRAINING, "True"),  # the kubelet not there yet
            pod("a-2", "10.0.0.3", "True", "EngineReady", "False"),  # not ready for itself
            {**pod("a-3", "10.0.0.4", "False", GATE_DRAINING, "False"), "spec": {}}]  # no gate
    assert inplace.draining_ips(pods) == {"10.0.0.1"}


def test_an_engine_restarts_only_once_no_router_lists_its_pod() -> None:
    """smg 1.13.0 answers ``DELETE /workers/{id}`` at once but keeps the worker 5 s as
    ``draining`` and then removes it by URL: an engine restarted and registered again within
    that window is removed too (measured: tests/e2e/test_inplace_router_drain.py). So a pod
    whose gate is closed and whose grace is over restarts only once no router lists it."""
    from hicache_operator.controller.rollout import LEAVE_POLL_S
    from test_rollout_decide import _decide, _gated

    old, new = _sts("engine:1"), _sts("engine:2")
    live = _live(new, NEW, OLD)
    pods = [_api_pod(old, i, OLD) for i in range(3)]
    gated = _gated(pods, _decide(new, live, pods))
    held = _decide(new, live, gated, leaving=frozenset({"tiny-llama-sa-2"}))
    assert held.patches == () and held.gates == () and held.recheck_s == LEAVE_POLL_S
    assert held.status is not None and held.status["preparing"] == ["tiny-llama-sa-2"]
    assert held.status["waiting"].startswith("tiny-llama-sa-2: not let go by the router yet")
    assert held.progressing is not None and "waiting: tiny-llama-sa-2" in held.progressing[1]
    # another pod still listed holds nothing here; the router letting it go lets it restart
    for leaving in (frozenset({"tiny-llama-sa-0"}), frozenset()):
        d = _decide(new, live, gated, leaving=leaving)
        assert [p.pod for p in d.patches] == ["tiny-llama-sa-2"]
        assert d.status is not None and "waiting" not in d.status


def test_the_rollout_asks_which_pods_out_of_rotation_the_router_has_not_let_go() -> None:
    """``inplace.decide`` asks the leaving check only while a rollout runs, only about pods
    whose gate is closed, and holds every restart when a router cannot be read."""
    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["metadata"]["namespace"] = "ns"
    cr["spec"].update(replicas=3, image="engine:2", updateStrategy={"type": "InPlaceIfPossible"})
    cr["spec"]["l3"]["image"] = "engine:1"
    planned = plan(cr, OperatorConfig())
    new = next(o for o in planned.objects if o["kind"] == "StatefulSet")
    from test_rollout_decide import _gated
    pods = [_api_pod(_sts("engine:1"), i, OLD) for i in range(3)]
    asked: list[list[str]] = []
    answer: set[str] | str = {"tiny-llama-sa-2"}

    async def listed(cr: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> set[str] | str:
        asked.append(sorted(p["metadata"]["name"] for p in pods))
        return answer

    def run(pods: list[dict[str, Any]]) -> Decision | None:
        desired = {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o
                   for o in planned.objects}
        live = {(new["apiVersion"], "StatefulSet", new["metadata"]["name"]):
                _live(new, NEW, OLD)}
        settings = RolloutConfig(drain_grace_seconds=0, prepull=False)
        return asyncio.run(inplace.decide(planned, cr, desired, live, pods, [], settings,
                                          clock=lambda: NOW, leaving_check=listed))

    first = run(pods)  # the gate closes; no gate was closed before: nothing to ask
    assert first is not None and [g.pod for g in first.gates] == ["tiny-llama-sa-2"]
    assert asked == []
    gated = _gated(pods, first)
    held = run(gated)
    assert held is not None and held.patches == () and asked == [["tiny-llama-sa-2"]]
    answer = set()
    assert [p.pod for p in (run(gated) or Decision({}, frozenset())).patches] == [
        "tiny-llama-sa-2"]
    answer = "router pod 10.0.9.2: GET /workers failed"
    unknown = run(gated)
    assert unknown is not None and unknown.patches == () and unknown.status is not None
    assert unknown.status["waiting"] == (
        "the router's worker list cannot be read (router pod 10.0.9.2: GET /workers failed); "
        "no pod is restarted until it can")


def test_every_ready_router_pod_is_asked_which_pods_it_still_lists() -> None:
    """``RouterReader.listed`` over real HTTP: each router replica keeps its own worker list, so
    all are read; one that cannot be read is named instead of taken for "lists nothing"."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hicache_operator.controller.router_status import RouterReader

    class Router(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"workers": [
                {"url": "http://10.0.0.2:30000", "is_healthy": False, "status": "draining"}],
                "total": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])

    def router_pod(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"podIP": ip, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False",
             "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}

    async def ask(pods: list[dict[str, Any]]) -> frozenset[str] | str:
        reader = RouterReader(timeout_s=2)
        try:
            return await reader.listed(pods, port)
        finally:
            await reader.close()
    try:
        assert asyncio.run(ask([router_pod("r-0", "127.0.0.1"),
                                router_pod("r-1", "127.0.0.3", ready=False)])) == frozenset(
                                    {"10.0.0.2"})
        failed = asyncio.run(ask([router_pod("r-0", "127.0.0.1"), router_pod("r-1", "127.0.0.3")]))
        assert isinstance(failed, str) and failed.startswith("router pod 127.0.0.3: GET /workers")
    finally:
        server.shutdown()
        server.server_close()


def test_a_drained_pod_is_let_go_by_the_router_some_seconds_after_its_drain() -> None:
    """``inplace.router_leaving``: which gated pods' engines must not restart yet. smg 1.13.0
    lists a drained worker for a moment only, then removes the URL ``SMG_LETS_GO_S`` after the
    drain; so the operator counts from its own drain (``RouterReader.note_drained``), and from
    the first time it sees the pod out of rotation if it never drained it (it restarted)."""
    from hicache_operator.controller.rollout_pods import pod_ready
    from hicache_operator.controller.router_status import SMG_LETS_GO_S, RouterReader

    cr = copy.deepcopy(load_example("cpu/tiny-llama-standalone.yaml"))
    cr["metadata"]["namespace"] = "ns"
    cr["spec"].update(replicas=4, updateStrategy={"type": "InPlaceIfPossible"})
    name = cr["metadata"]["name"]
    planned = plan(cr, OperatorConfig())
    live: dict[tuple[str, str, str], dict[str, Any]] = {
        ("apps/v1", "Deployment", f"{name}-router"): {"status": {"availableReplicas": 1}}}
    now = [100.0]
    reader = RouterReader(timeout_s=1, clock=lambda: now[0])
    listing: frozenset[str] | str = frozenset({"10.0.0.4"})

    async def listed(router_pods: Sequence[Mapping[str, Any]], port: int) -> frozenset[str] | str:
        return listing
    reader.listed = listed  # type: ignore[method-assign]

    def pod(i: int, ready: bool) -> dict[str, Any]:
        return {"metadata": {"name": f"{name}-{i}"}, "status": {
            "podIP": f"10.0.0.{i + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    pods = [pod(0, True),  # the kubelet has not taken it out yet: not drained
            pod(1, False),  # drained now
            pod(2, False),  # drained by an operator process before this one
            pod(3, False)]  # drained, but its router still lists it (the removal failed)
    assert pod_ready(pods[0]) and not pod_ready(pods[1])
    check = inplace.router_leaving(_Kube(), reader, planned, live, ("ns", name))  # type: ignore[arg-type]
    assert check is not None
    reader.note_drained(("ns", name), ["10.0.0.2"])

    def ask() -> set[str] | str:
        return asyncio.run(check(cr, pods))
    now[0] += 2.0
    assert ask() == {f"{name}-{i}" for i in range(4)}  # pod 2 first seen 2 s after pod 1
    now[0] += SMG_LETS_GO_S - 2.5
    assert ask() == {f"{name}-{i}" for i in range(4)}
    now[0] += 0.5
    assert ask() == {f"{name}-0", f"{name}-2", f"{name}-3"}  # pod 1 let go
    now[0] += 2.0
    assert ask() == {f"{name}-0", f"{name}-3"}  # pod 2 too
    listing = "router pod 10.0.9.1: GET /workers answered 503"
    assert ask() == listing
    # No router serves the CR: nothing to wait for.
    assert inplace.router_leaving(_Kube(), reader, planned, {}, ("ns", name)) is None  # type: ignore[arg-type]
