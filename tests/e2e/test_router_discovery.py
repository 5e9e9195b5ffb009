"""The router's real binary discovers the CR's pods through the API emulator.

Real: the operator (kopf, every module), the router objects it plans, SGLang's model gateway
``smg`` 1.13.0 (the binary images/router installs, ``make router-env``) started with exactly the
command and arguments of the router Deployment the operator wrote, its Kubernetes client
(kube-rs) listing and watching pods through the emulator over HTTP (resourceVersions, bookmarks,
watch restarts, ``410 Gone`` then a fresh list), its worker registration, health checks and
``/workers`` list and ``/metrics``; the operator reading that list into ``status.router``.
Emulated: the API server (``tests/emulator``), the StatefulSet and Deployment controllers and
the kubelet (tests set pod readiness and pod IPs: loopback addresses, one per pod, each pod's
engine on the same port). Faked: the engines (``sglang_standin``: the answers real SGLang 0.5.23
gave, captured in ``tests/fixtures/sglang-http``). The pod tier runs the router in front of
real servers in a pod network.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from typing import Any

import pytest
from e2e_lib import NAMESPACE, Cluster
from emulator.lists import compact
from router_lib import (  # noqa: F401 (router_process is a fixture)
    NAME,
    POD_IPS,
    ROUTER_POD_IP,
    _cr,
    _free_port,
    _healthy_workers,
    _set_ready,
    _worker_health,
    router_process,
)
from sglang_standin import SGLangStandIn

pytestmark = pytest.mark.e2e


def test_the_real_router_follows_scaling_readiness_and_watch_restarts(
        cluster: Cluster, operator: Any, router_process: Any) -> None:  # noqa: F811
    engine_port, router_port, metrics_port = _free_port(), _free_port(), _free_port()
    cluster.apply(_cr(engine_port, router_port, metrics_port))
    deployment = cluster.wait(lambda: cluster.child(("apps/v1", "deployments"),
                                                    f"{NAME}-router"), "the router Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-discovery" in args and "--max-tree-size" in args
    assert args[args.index("--service-discovery-namespace") + 1] == NAMESPACE
    url = [f"http://{ip}:{engine_port}" for ip in POD_IPS]
    with ExitStack() as stack:
        engines = [stack.enter_context(SGLangStandIn(ip, engine_port)) for ip in POD_IPS]
        router = router_process(deployment)
        router_pod = cluster.wait(
            lambda: next(iter(cluster.emu.list("v1", "pods", NAMESPACE,
                                               "app.kubernetes.io/name=sglang-hicache-router")),
                         None), "the router pod")
        _set_ready(cluster, router_pod["metadata"]["name"], ROUTER_POD_IP, True)

        # One engine pod: the router registers it from the pod list.
        cluster.mark_pods_ready(NAME, 1, [POD_IPS[0]])
        cluster.wait(lambda: _healthy_workers(router_port) == {url[0]}, "worker 0", 60)
        assert _worker_health(metrics_port).get(url[0]) == 1
        # The operator points the CR's Service at the router and reports what it serves.
        cluster.wait(lambda: (cluster.child(("v1", "services"), NAME) or {}).get(
            "spec", {}).get("selector", {}).get("app.kubernetes.io/name")
            == "sglang-hicache-router", "the Service to select the router")
        cluster.wait(lambda: ((cluster.cr(NAME) or {}).get("status", {}).get("router") or {})
                     .get("workers") == 1, "status.router.workers 1")

        # Scale 1 -> 2: the StatefulSet's new pod joins once ready, through the watch.
        cluster.patch_spec(NAME, {"replicas": 2})
        cluster.wait(lambda: len(cluster.pods(NAME)) == 2, "pod 1")
        _set_ready(cluster, f"{NAME}-1", POD_IPS[1], True)
        cluster.wait(lambda: _healthy_workers(router_port) == set(url), "workers 0 and 1", 60)
        health = _worker_health(metrics_port)
        assert health.get(url[0]) == 1 and health.get(url[1]) == 1
        cluster.wait(lambda: ((cluster.cr(NAME) or {}).get("status", {}).get("router") or {})
                     .get("workers") == 2, "status.router.workers 2")

        # Pod 1 goes unready (its /ready fails, the kubelet marks it): no more requests to it.
        engines[1].ready = False
        _set_ready(cluster, f"{NAME}-1", POD_IPS[1], False)
        cluster.wait(lambda: _healthy_workers(router_port) == {url[0]}, "pod 1 out", 60)
        assert _worker_health(metrics_port).get(url[1], 0) == 0
        before = engines[0].generate_requests
        for _ in range(4):
            request = urllib.request.Request(
                f"http://127.0.0.1:{router_port}/generate", method="POST",
                data=json.dumps({"model": "/models/tiny-llama", "text": "hello",
                                 "sampling_params": {"max_new_tokens": 1}})
                .encode(), headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=10).read()
            except urllib.error.HTTPError as exc:
                raise AssertionError(exc.read().decode()) from exc
        assert engines[0].generate_requests == before + 4
        assert engines[1].generate_requests == 0
        engines[1].ready = True
        _set_ready(cluster, f"{NAME}-1", POD_IPS[1], True)
        # smg re-adds a pod that comes back within its 5 s drain at its next pass (a pod event
        # or its 60 s tick): the next pod event below, or the tick.
        cluster.wait(lambda: _healthy_workers(router_port) == set(url), "pod 1 back", 90)

        # Watch restart with compaction: every stream is cut after the state moved on and
        # etcd compacted, so the router's watch from its last resourceVersion gets 410 Gone
        # and it lists again, from which it must still hold both workers.
        # A plain watch restart (the server closed the streams): the router watches again
        # from its resourceVersion, with no new list.
        lists_before, watches_before = _router_lists(cluster), _router_watches(cluster)
        cluster.emu.drop_watches()
        cluster.wait(lambda: _router_watches(cluster) > watches_before, "a new watch")
        time.sleep(2)
        assert _router_lists(cluster) == lists_before
        cms = cluster.emu.rtype("v1", "configmaps")

        def restart(store: Any) -> None:
            store.create(cms, NAMESPACE, {"metadata": {"name": "rv-bump"}, "data": {}})
            compact(store)
            store.drop_watches()
        cluster.emu.call(restart)
        cluster.wait(lambda: _router_lists(cluster) > lists_before, "the router to list again")
        assert _healthy_workers(router_port) == set(url)

        # Scale 2 -> 1: the pod is deleted, its worker goes.
        cluster.patch_spec(NAME, {"replicas": 1})
        cluster.wait(lambda: _healthy_workers(router_port) == {url[0]}, "pod 1 removed", 60)
        cluster.wait(lambda: ((cluster.cr(NAME) or {}).get("status", {}).get("router") or {})
                     .get("workers") == 1, "status.router.workers 1 again")
        assert router.poll() is None, "the router exited"
    watches = [r for r in cluster.emu.requests() if _by_router(r) and r.watch]
    assert any(dict(r.query).get("allowWatchBookmarks") == "true" for r in watches)


def _by_router(record: Any) -> bool:
    """The router's pod requests: kube-rs' watcher pages its lists (``limit``) and watches
    with bookmarks; the operator's client does neither."""
    query = dict(record.query)
    return record.plural == "pods" and ("limit" in query or ("allowWatchBookmarks" in query
                                        and "app.kubernetes.io/instance" in
                                        query.get("labelSelector", "")))


def _router_watches(cluster: Cluster) -> int:
    return sum(1 for r in cluster.emu.requests() if _by_router(r) and r.watch)


def _router_lists(cluster: Cluster) -> int:
    return sum(1 for r in cluster.emu.requests()
               if _by_router(r) and r.method == "GET" and not r.watch and r.name is None)
