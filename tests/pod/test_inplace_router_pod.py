"""An in-place rollout of two served pods behind the real router under constant streaming
load: no stream breaks (issue 25, item 2).

Real: the operator reconciling the CPU example (``updateStrategy: InPlaceIfPossible``) in the
API emulator: its readiness gate, its removal of the draining pod's worker from the router
(``DELETE /workers/{id}``), its JSON patch of the pod's annotations for the new configuration
revision, and its gate opening again once the new engine is ready; the engine pods run by the
strict pod tier (the launcher, SGLang 0.5.23 over real mori 1.2.4, probes, uid 10001, seccomp
RuntimeDefault, cpuset and memory cgroups), each in its own network namespace; the kubelet of
``pod.cluster``: Ready from the probes and every readiness gate's condition, container statuses
with a new ID per start, the pod update acted on (the downward API files rewritten, so the
launcher's watcher drains the engine and restarts it on the new revision); SGLang's real model
gateway (smg 1.13.0) as the router pod, discovering the pods through the emulator; streamed
answers of exactly ``TOKENS`` tokens each, read chunk by chunk by clients through the router.
Emulated or faked: see ``pod.cluster`` (the API server, the scheduler, GPUs, read-only root
filesystems).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from support.smg import generate_stream, healthy_worker_ips, wait_until

from .cluster import served_cluster
from .harness import load_cr

pytestmark = pytest.mark.pod
NS = "hicache-test"
NAME = "tiny-llama"
MODEL = "/models/tiny-llama"
TOKENS = 32
CLIENTS = 2


def _cr() -> dict[str, Any]:
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    cr["metadata"]["namespace"] = NS
    cr["spec"]["replicas"] = 2
    cr["spec"]["updateStrategy"] = {"type": "InPlaceIfPossible"}
    cr["spec"]["router"] = {"enabled": True, "replicas": 1, "healthCheck": {
        "intervalSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 1, "successThreshold": 1}}
    return cr


def _rolled_out(api: Any) -> bool:
    status = api.cr(NS, NAME).get("status") or {}
    ready = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return not status.get("rollout") and ready.get("Ready") == "True"


@pytest.mark.timeout(2400)
def test_an_in_place_rollout_under_streaming_load_breaks_no_stream(
        node: Any, image: Any, workdir: Path, models_dir: Path) -> None:
    # 5 s between a pod leaving the rotation and its engine's restart (the default 35 s only
    # makes the test longer: the router drain is what keeps requests off the pod).
    with served_cluster(workdir, node, image, models_dir, NS,
                        rollout={"drainGraceSeconds": 5}) as (api, kubelet, _net):
        cr = _cr()
        api.create_cr(cr)
        pod = wait_until(lambda: next(iter(api.list(
            f"/api/v1/namespaces/{NS}/pods", "app.kubernetes.io/name=sglang-hicache-router")),
            None), "the router pod", 60)
        args = pod["spec"]["containers"][0]["args"]
        names = [f"{NAME}-0", f"{NAME}-1"]
        wait_until(lambda: all(n in kubelet.running for n in names), "both pods started", 120)
        running = wait_until(lambda: kubelet.running.get(pod["metadata"]["name"]), "router")
        router = f"http://{running.iface.ip}:{args[args.index('--port') + 1]}"
        ips = {kubelet.ip(n) for n in names}
        wait_until(lambda: healthy_worker_ips(router) == ips, "both pods routed", 900)
        wait_until(lambda: _rolled_out(api), "the CR Ready", 300)
        engines = {n: kubelet.engine(n).container("engine") for n in names}
        generations = {n: e.generation for n, e in engines.items()}

        stop = threading.Event()
        streams: list[dict[str, Any]] = []
        broken: list[str] = []

        def client(k: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                text = f"client {k} request {i}: " + " ".join(f"w{k}x{i}y{j}" for j in range(40))
                try:
                    out = generate_stream(router, MODEL, text, TOKENS)
                except Exception as exc:  # a broken stream, a refused request
                    broken.append(f"client {k} request {i}: {type(exc).__name__}: {exc}")
                    continue
                if out["meta_info"].get("completion_tokens") != TOKENS:
                    broken.append(f"client {k} request {i}: {out['meta_info']}")
                streams.append(out)

        threads = [threading.Thread(target=client, args=(k,), daemon=True)
                   for k in range(CLIENTS)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(streams) >= 4, "streams before the rollout", 300)
            before = len(streams)
            # A new configuration revision only (one more engine flag): in place, each pod's
            # engine restarts under the launcher's watcher after the operator's drain.
            api.patch_cr(NS, NAME, {"engine": {"extraArgs": [
                *cr["spec"]["engine"]["extraArgs"], "--log-level", "info"]}})
            wait_until(lambda: all(e.generation > generations[n] for n, e in engines.items()),
                       "both engines restarted", 1200)
            wait_until(lambda: _rolled_out(api), "the rollout to finish", 600)
            wait_until(lambda: healthy_worker_ips(router) == ips, "both pods routed again", 300)
            during = len(streams) - before
            mark = len(streams)
            wait_until(lambda: len(streams) >= mark + 4, "streams after the rollout", 300)
        finally:
            stop.set()
            for t in threads:
                t.join(120)

    assert not broken, broken[:5]
    assert during > 0, "no stream ran during the rollout"
    assert all(e.generation == generations[n] + 1 for n, e in engines.items())
    # Both pods served before the rollout and after it (the router took each back).
    served_by = {s["worker"] for s in streams if s.get("worker")}
    assert len(served_by) == 2, served_by
