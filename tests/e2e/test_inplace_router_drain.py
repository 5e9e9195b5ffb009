"""An in-place rollout behind the real router: each pod leaves the router before its engine
restarts, and no request reaches it until it is back (issue 25, item 2).

smg 1.13.0 keeps routing to a pod whose readiness gate made it not Ready: it drops a worker only
when the pod is deleted or its health checks fail, and the engine is healthy while it drains
(measured with this binary: 45 s after Ready False the worker was still listed and healthy).
So the operator takes a draining pod's worker out of the router itself (``DELETE
/workers/{id}``); the pod's next Ready event registers it again. smg answers that DELETE at once
but lists the worker as ``draining`` for 5 s and then removes whatever worker has its URL: an
engine restarted within those 5 s came back, was registered and removed again, and with the next
pod drained meanwhile the router had no worker at all (HTTP 404 ``model_not_found`` for every
request until its discovery's next pass; seen in CI under load). The worker drops out of
``GET /workers`` before the removal, so the operator restarts an engine only once the router
has let its pod go (``inplace.router_leaving``). This test checks the whole worker list
(draining included) at each engine patch and keeps the load on for longer than smg's drain after
the rollout, when a pending removal would take a pod out again: without the wait it failed 3 of
3 runs here.

Real: the operator (kopf in-process), the emulator's API server and StatefulSet controller, smg
1.13.0 started with the router Deployment's command and arguments, discovering the pods through
the emulator and routing requests to the engines. Emulated: the kubelet (``emulator/kubelet.py``:
Ready only with every readiness gate True; a changed image restarts that container, ready
``READY_AFTER_S`` later). Faked: the engines (``sglang_standin``: SGLang's captured answers; a
stand-in keeps answering while its pod "restarts", so a request that reached a restarting
engine is counted instead of failing).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from contextlib import ExitStack
from typing import Any

import pytest
from e2e_lib import NAMESPACE, Cluster
from router_lib import (  # noqa: F401 (router_process is a fixture)
    NAME,
    POD_IPS,
    ROUTER_POD_IP,
    _cr,
    _free_port,
    _healthy_workers,
    _set_ready,
    router_process,
)
from sglang_standin import SGLangStandIn
from support.smg import listed_workers
from test_inplace_rollout import IMAGE, NEW_IMAGE, READY_AFTER_S, _kubelet, _rolled_out

pytestmark = pytest.mark.e2e
GATE = "hicache.sglang.ai/in-place-ready"
SMG_DRAIN_S = 5  # smg 1.13.0 lists a removed worker as draining this long, then removes it


def _image(pod: dict[str, Any]) -> str:
    return next((c["image"] for c in pod["spec"]["containers"] if c["name"] == "engine"), "")


def _gate(pod: dict[str, Any] | None) -> str | None:
    return next((str(c.get("status")) for c in ((pod or {}).get("status") or {}).get(
        "conditions") or [] if c.get("type") == GATE), None)


def test_each_pod_leaves_the_router_before_its_engine_restarts(
        cluster: Cluster, operator: Any, router_process: Any) -> None:  # noqa: F811
    engine_port, router_port, metrics_port = _free_port(), _free_port(), _free_port()
    cr = _cr(engine_port, router_port, metrics_port)
    cr["spec"].update(replicas=2, image=IMAGE, updateStrategy={"type": "InPlaceIfPossible"})
    # The drain is the operator's, not the health checks': smg's default tolerance (a 5 s
    # timeout, 3 failures), so a stand-in answering late on a loaded machine (it shares this
    # process with the operator and the API server) is not dropped for it.
    cr["spec"]["router"]["healthCheck"].update(timeoutSeconds=5, failureThreshold=3)
    cluster.apply(cr)
    deployment = cluster.wait(lambda: cluster.child(("apps/v1", "deployments"),
                                                    f"{NAME}-router"), "the router Deployment")
    router = f"http://127.0.0.1:{router_port}"
    urls = {f"{NAME}-{i}": f"http://{ip}:{engine_port}" for i, ip in enumerate(POD_IPS)}
    with ExitStack() as stack:
        engines = {f"{NAME}-{i}": stack.enter_context(SGLangStandIn(ip, engine_port))
                   for i, ip in enumerate(POD_IPS)}
        router_process(deployment)
        router_pod = cluster.wait(lambda: next((p for p in cluster.emu.list("v1", "pods", NAMESPACE)
                                                if p["metadata"]["name"].startswith(
                                                    f"{NAME}-router-")), None), "router pod")
        _set_ready(cluster, router_pod["metadata"]["name"], ROUTER_POD_IP, True)
        cluster.mark_pods_ready(NAME, 2, list(POD_IPS))
        cluster.wait(lambda: _healthy_workers(router_port) == set(urls.values()),
                     "both pods among the router's workers", 90)
        cluster.wait_condition(NAME, "Ready", "True")
        kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S)

        # What the router lists and what each engine received, at each pod's engine patch and
        # when its gate opens again (the API server's own events, in order).
        seen: list[tuple[str, str, bool, int]] = []

        def listener(event: Any) -> None:
            if event.rtype.plural != "pods" or event.type != "MODIFIED" or event.prev is None:
                return
            name = event.object["metadata"]["name"]
            if name not in engines:
                return
            if _image(event.prev) != _image(event.object):
                seen.append(("patched", name, urls[name] in listed_workers(router),
                             engines[name].generate_requests))
            elif _gate(event.prev) != "True" and _gate(event.object) == "True":
                seen.append(("opened", name, False, engines[name].generate_requests))
        cluster.emu.call(lambda s: s.listeners.append(listener))

        # Constant load through the router for the whole rollout.
        stop, answered, failed = threading.Event(), [0], []

        def load() -> None:
            # Distinct prompts (no shared prefix: both pods get requests), 50 a second.
            while not stop.wait(0.02):
                body = json.dumps({"model": "/models/tiny-llama", "text": f"q{answered[0]}",
                                   "sampling_params": {"max_new_tokens": 1}}).encode()
                request = urllib.request.Request(f"{router}/generate", body,
                                                 {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=10) as r:
                        r.read()
                    answered[0] += 1
                except OSError as exc:
                    failed.append(repr(exc))
        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        try:
            cluster.patch_spec(NAME, {"image": NEW_IMAGE})
            cluster.wait_condition(NAME, "Progressing", "True", "RollingOutInPlace")
            cluster.wait(lambda: _rolled_out(cluster, NAME), "the in-place rollout", 120)
            cluster.wait(lambda: _healthy_workers(router_port) == set(urls.values()),
                         "both pods back among the router's workers", 90)
            # Longer than smg's drain of a removed worker (5 s): a removal still pending
            # would take a pod out again now (and fail requests, with the other one drained).
            stop.wait(SMG_DRAIN_S + 1)
            assert _healthy_workers(router_port) == set(urls.values())
        finally:
            stop.set()
            loader.join(15)

        assert sorted(p for p, _, _ in kubelet.restarts) == sorted(engines)
        patched = {name: (listed, count) for what, name, listed, count in seen
                   if what == "patched"}
        opened = {name: count for what, name, _, count in seen if what == "opened"}
        assert sorted(patched) == sorted(opened) == sorted(engines), seen
        for name, (listed, at_patch) in patched.items():
            assert not listed, (f"{name}'s engine was patched while the router still listed it "
                                "(ready or draining)")
            assert opened[name] == at_patch, (
                f"{name} received {opened[name] - at_patch} request(s) between its engine "
                "restart and its gate opening again")
        assert not failed and answered[0] > 0, (failed[:3], answered)
        assert all(e.generate_requests > 0 for e in engines.values())  # both pods served
        drained = [e for e in cluster.events(NAME) if e.get("reason") == "RouterDrained"]
        assert len(drained) >= 2, drained
