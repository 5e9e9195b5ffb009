"""``status.router`` and the router's Degraded reasons, from the router's own worker list."""

from __future__ import annotations

import datetime

import pytest
from hicache_operator.controller.router_status import (
    RouterObservation,
    parse_workers,
    router_block,
    router_serving,
)

pytestmark = pytest.mark.unit
NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


def _pod(name: str, ip: str, ready_since: str | None) -> dict:
    conditions = [] if ready_since is None else [
        {"type": "Ready", "status": "True", "lastTransitionTime": ready_since}]
    return {"metadata": {"name": name}, "status": {"podIP": ip, "conditions": conditions}}


# What smg 1.13.0 answers on GET /workers (trimmed to the fields read).
WORKERS = {"workers": [
    {"url": "http://10.0.0.1:30000", "is_healthy": True, "status": "ready"},
    {"url": "http://10.0.0.2:30000", "is_healthy": False, "status": "draining"},
], "total": 2}


def test_the_worker_list_is_read_by_pod_ip_and_health() -> None:
    seen = parse_workers(WORKERS)
    assert seen.healthy_ips == frozenset({"10.0.0.1"}) and seen.workers == 2
    # a draining worker is still the router's until it lets it go (an engine restart waits)
    assert seen.listed_ips == frozenset({"10.0.0.1", "10.0.0.2"})
    assert parse_workers({"nope": 1}).healthy_ips is None


def test_a_ready_pod_the_router_does_not_serve_is_reported_after_the_grace() -> None:
    pods = [_pod("m-0", "10.0.0.1", "2026-12-01T11:00:00Z"),
            _pod("m-1", "10.0.0.2", "2026-12-01T11:00:00Z"),
            _pod("m-2", "10.0.0.3", "2026-12-01T11:59:50Z"),  # ready 10 s: still in grace
            _pod("m-3", "10.0.0.4", None)]
    dep = {"status": {"replicas": 1, "readyReplicas": 1}}
    block, issues = router_block(deployment=dep, serving=True, engine_pods=pods,
                                 observation=parse_workers(WORKERS), grace_s=60, now=NOW)
    assert block == {"replicas": 1, "readyReplicas": 1, "serving": True, "readyPods": 3,
                     "workers": 1, "missingPods": ["m-1"]}
    assert [r for r, _ in issues] == ["RouterMissingPods"]


def test_no_ready_router_while_engines_are_ready_is_router_unavailable() -> None:
    pods = [_pod("m-0", "10.0.0.1", "2026-12-01T11:00:00Z")]
    block, issues = router_block(deployment={"status": {"replicas": 1}}, serving=True,
                                 engine_pods=pods,
                                 observation=RouterObservation(None, error="no ready router"),
                                 grace_s=60, now=NOW)
    assert [r for r, _ in issues] == ["RouterUnavailable"]
    assert block["message"] == "no ready router" and "workers" not in block


def test_the_service_points_at_the_router_once_it_is_available_and_stays() -> None:
    dep = ("apps/v1", "Deployment", "m-router")
    svc = ("v1", "Service", "m")
    assert not router_serving({dep: {"status": {"availableReplicas": 0}}}, "m")
    assert router_serving({dep: {"status": {"availableReplicas": 1}}}, "m")
    on_router = {"spec": {"selector": {"app.kubernetes.io/name": "sglang-hicache-router"}}}
    assert router_serving({svc: on_router, dep: {"status": {}}}, "m")
