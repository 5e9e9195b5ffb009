"""Helpers of the router's e2e tests: the real smg process, ports, pod readiness, its worker
list and metrics (see ``test_router_discovery`` for what is real and what is emulated)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_lib import NAMESPACE, REPO, Cluster
from support.smg import healthy_workers, worker_series

SMG = REPO / ".cache" / "bin" / "smg"
NAME = "routed"
ROUTER_POD_IP = "127.0.0.1"  # the router process listens on 0.0.0.0 (its rendered --host)
POD_IPS = ("127.0.0.10", "127.0.0.11")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cr(engine_port: int, router_port: int, metrics_port: int) -> dict[str, Any]:
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "minimal-dram-only.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    doc["spec"]["replicas"] = 1
    doc["spec"].setdefault("engine", {})["port"] = engine_port
    doc["spec"]["router"] = {
        "enabled": True, "port": router_port, "metricsPort": metrics_port,
        # Fast checks, so the test sees a pod leave and join within seconds.
        "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1,
                        "successThreshold": 1},
    }
    return doc


def _healthy_workers(router_port: int) -> set[str]:
    return healthy_workers(f"http://127.0.0.1:{router_port}")


def _worker_health(metrics_port: int) -> dict[str, float]:
    return worker_series(f"http://127.0.0.1:{metrics_port}", "smg_worker_health")


def _set_ready(cluster: Cluster, pod: str, ip: str, ready: bool) -> None:
    """The kubelet's verdict on one pod: Running at ``ip``, Ready or not (readiness probe)."""
    rtype = cluster.emu.rtype("v1", "pods")

    def write(store: Any) -> None:
        current = store.get(rtype, NAMESPACE, pod)
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                  "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                      time.gmtime())}]}
        store.replace(rtype, NAMESPACE, pod, {**current, "status": status}, "status")
    cluster.emu.call(write)


@pytest.fixture
def router_process(cluster: Cluster, tmp_path: Path) -> Iterator[Any]:
    """Starts the real smg with the router Deployment's command and arguments, as its pod
    would (KUBECONFIG stands in for the pod's service-account token)."""
    if not SMG.exists():
        pytest.fail(f"{SMG} is missing: run `make router-env` (bash scripts/build-router-env.sh)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(deployment: dict[str, Any]) -> subprocess.Popen[bytes]:
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["smg"]
        log = open(tmp_path / "smg.log", "ab")  # noqa: SIM115 (closed with the process)
        # The kubelet expands $(VAR) from the container's env (the mesh's pod name and IP).
        args = [a.replace("$(POD_NAME)", f"{NAME}-router-under-test")
                .replace("$(POD_IP)", ROUTER_POD_IP) for a in container["args"]]
        proc = subprocess.Popen([str(SMG), *args], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


