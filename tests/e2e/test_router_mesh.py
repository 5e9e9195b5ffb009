"""Two router pods share one prefix tree through smg's mesh (issue 25, item 5).

Real: the operator (kopf, every module) and the router Deployment it writes; SGLang's model
gateway ``smg`` 1.13.0 run twice with exactly that Deployment's arguments, each as one of its
pods: ``$(POD_NAME)``/``$(POD_IP)`` expanded from the pod as the kubelet does, and ``0.0.0.0``
bound as the pod's own address (each pod has its own network namespace; here both share the
loopback, so each binds its pod IP); their pod watches (engines by ``--selector``, peers by
``--router-selector``) through the API emulator, their mesh gossip, their cache-aware trees.
Emulated: the API server, the StatefulSet and Deployment controllers, the kubelet (tests set pod
IPs and readiness). Faked: the engines (``sglang_standin``). Counts: which engine each
follow-up reached.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from e2e_lib import NAMESPACE, Cluster
from router_lib import NAME, POD_IPS, SMG, _cr, _free_port, _healthy_workers, _set_ready
from sglang_standin import SGLangStandIn
from support.smg import ROUTED_WORKER_HEADER

pytestmark = pytest.mark.e2e
ROUTER_IPS = ("127.0.0.5", "127.0.0.6")
SESSIONS = 16


def _pod_args(args: list[str], pod: str, ip: str) -> list[str]:
    return [a.replace("$(POD_NAME)", pod).replace("$(POD_IP)", ip).replace("0.0.0.0", ip)
            for a in args]


@pytest.fixture
def routers(cluster: Cluster, tmp_path: Path) -> Iterator[Any]:
    if not SMG.exists():
        pytest.fail(f"{SMG} is missing: run `make router-env` (bash scripts/build-router-env.sh)")
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(args: list[str], pod: str, ip: str) -> None:
        log = open(tmp_path / f"{pod}.log", "ab")  # noqa: SIM115 (closed with the process)
        procs[pod] = subprocess.Popen(
            [str(SMG), *_pod_args(args, pod, ip)], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})

    def stop(pod: str) -> None:
        proc = procs.pop(pod)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def seen(pod: str, line: str) -> int:
        """How often the pod's router logged ``line`` (its mesh's gossip and merges)."""
        return (tmp_path / f"{pod}.log").read_text(errors="replace").count(line)

    yield start, stop, seen
    for pod in list(procs):
        stop(pod)


def _send(router_ip: str, port: int, text: str) -> str:
    body = json.dumps({"model": "/models/tiny-llama", "text": text,
                       "sampling_params": {"max_new_tokens": 1}}).encode()
    req = urllib.request.Request(f"http://{router_ip}:{port}/generate", body,
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(r.headers.get(ROUTED_WORKER_HEADER, ""))


def test_a_follow_up_reaches_the_same_engine_through_either_router_and_a_replaced_one(
        cluster: Cluster, operator: Any, routers: Any) -> None:
    start, stop, seen = routers
    engine_port, router_port, metrics_port = _free_port(), _free_port(), _free_port()
    cr = _cr(engine_port, router_port, metrics_port)
    cr["spec"]["replicas"] = 2
    cluster.apply(cr)
    dep = cluster.wait(lambda: cluster.child(("apps/v1", "deployments"), f"{NAME}-router"),
                       "the router Deployment")
    args = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "--enable-mesh" in args and dep["spec"]["replicas"] == 2
    pods = cluster.wait(lambda: (lambda p: p if len(p) == 2 else [])(router_pods(cluster)),
                        "two router pods")
    for pod, ip in zip(pods, ROUTER_IPS, strict=True):
        _set_ready(cluster, pod, ip, True)
    with ExitStack() as stack:
        for ip in POD_IPS:
            stack.enter_context(SGLangStandIn(ip, engine_port))
        cluster.mark_pods_ready(NAME, 2, list(POD_IPS))
        for pod, ip in zip(pods, ROUTER_IPS, strict=True):
            start(args, pod, ip)
        engines = {f"http://{ip}:{engine_port}" for ip in POD_IPS}
        for ip in ROUTER_IPS:
            cluster.wait(lambda ip=ip: _healthy_workers_at(ip, router_port) == engines,
                         f"router {ip}'s workers", 60)
        a, b = ROUTER_IPS
        texts = {s: f"conversation {s:03d}: " + f"its shared context {s}. " * 60
                 for s in range(SESSIONS)}

        def synced(send: Any) -> Any:
            """Runs ``send`` once the routers' state stream is up, and waits until b merged
            operations a sent after it and three gossip rounds passed (smg logs each): a
            follow-up sent before would be routed by b alone and remembered there, so there
            is one pass and no retry."""
            cluster.wait(lambda: seen(pods[0], "Sync stream connection to") + seen(
                pods[1], "Sync stream connection to") > streams, "the mesh's state stream", 60)
            merged = seen(pods[1], "operations into replica")
            out = send()
            cluster.wait(lambda: seen(pods[1], "operations into replica") > merged,
                         "router b to merge router a's operations", 60)
            # a streams its operations in batches: three more gossip rounds for the rest
            pings = seen(pods[1], "Received Ping")
            cluster.wait(lambda: seen(pods[1], "Received Ping") >= pings + 3,
                         "three gossip rounds", 60)
            return out

        streams = 0
        first = synced(lambda: {s: _send(a, router_port, t) for s, t in texts.items()})
        assert set(first.values()) == engines  # spread over both engines

        def followups(router: str, turn: int) -> int:
            return sum(_send(router, router_port, t + f" turn {turn}.") == first[s]
                       for s, t in texts.items())
        # The second router never saw these conversations: its tree came over the mesh.
        assert followups(b, 1) == SESSIONS
        # Router b's pod is replaced (evicted, its node drained, a rollout): the new pod (a new
        # name) joins the mesh and follows a for the conversations a routes from then on. (What
        # a learnt before is not handed to it by smg 1.13.0: measured at chance, 7/16 with two
        # engines; docs/operations.md.)
        streams = seen(pods[0], "Sync stream connection to") + seen(
            pods[1], "Sync stream connection to")
        stop(pods[1])
        old_pod = cluster.emu.find("v1", "pods", NAMESPACE, pods[1])
        assert old_pod is not None
        cluster.emu.delete("v1", "pods", NAMESPACE, pods[1])
        new = f"{pods[1]}-new"  # the ReplicaSet's replacement (the emulator's does not run)
        cluster.emu.create("v1", "pods", {"metadata": {
            "name": new, "labels": old_pod["metadata"]["labels"]},
            "spec": old_pod["spec"]}, NAMESPACE)
        _set_ready(cluster, new, b, True)
        pods[1] = new
        start(args, new, b)
        cluster.wait(lambda: _healthy_workers_at(b, router_port) == engines,
                     "router b back", 60)
        later = {s: f"later conversation {s:03d}: " + f"another context {s}. " * 60
                 for s in range(SESSIONS)}
        merged_before = seen(pods[1], "operations into replica")
        first = synced(lambda: {s: _send(a, router_port, t) for s, t in later.items()})
        assert seen(pods[1], "operations into replica") > merged_before
        texts = later
        assert followups(b, 2) == SESSIONS


def router_pods(cluster: Cluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in cluster.emu.list(
        "v1", "pods", NAMESPACE, "app.kubernetes.io/name=sglang-hicache-router")
        if not p["metadata"].get("deletionTimestamp"))


def _healthy_workers_at(ip: str, port: int) -> set[str]:
    if ip == "127.0.0.1":
        return _healthy_workers(port)
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/workers", timeout=5) as r:
            return {w["url"] for w in json.loads(r.read())["workers"] if w.get("is_healthy")}
    except OSError:
        return set()
