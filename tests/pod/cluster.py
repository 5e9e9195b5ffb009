"""A small cluster for the pod tier: the API emulator, the real operator, and a kubelet that runs
the emulator's pods for real, each in its own network namespace.

What is real: the operator (kopf, every module) reconciling a CR in the API emulator; the pods
the emulator's StatefulSet and Deployment controllers create, all run by the pod tier's runtime
(``runtime.Pod``: the pod's user, seccomp RuntimeDefault, capabilities, cpuset and memory
cgroups, probes, restarts): engine pods from the engine image (the launcher, real SGLang 0.5.23
over real mori, hugepages), the router pod from the router image (``router_image``: SGLang's
real model gateway, smg 1.13.0, with the router Deployment's own command, arguments, probes,
uid 10001 and memory limit); every pod in its own network namespace with its own IP on a
bridge (``network``), so the engines all serve on the same port and the router reaches them by
pod IP. The kubelet reports each pod's IP and readiness (its readiness probe) to the emulator,
where the router's discovery and the operator read them. The emulator listens on the bridge's
address, which the router pod uses as its API server (KUBECONFIG stands in for the
service-account token a kubelet would mount). The control plane (emulator and operator) runs in
the project venv (``control_plane.py``); this side, in the engine environment, talks to it over
HTTP like a kubelet and a user (``Api``).

What is not: the scheduler (every pod runs on one ``node.Node``; GPUs faked as there), the
images' read-only root filesystems, the API server (``tests/emulator``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .image import Image
from .network import PodInterface, PodNetwork, remove_stale
from .node import Node
from .podspec import PodMeta, containers_in_start_order
from .router_image import make_router_image
from .runtime import Pod

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
ROUTER_NAME = "sglang-hicache-router"
CR_PATH = "/apis/hicache.sglang.ai/v1alpha1/namespaces/{ns}/sglanghicaches"


class Api:
    """The few Kubernetes API calls a kubelet and a user make, over HTTP."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "GET":
                return None
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from exc

    def list(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return list((self.request("GET", path + query) or {}).get("items") or [])

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    # the CR
    def create_cr(self, cr: dict[str, Any]) -> Any:
        return self.request("POST", CR_PATH.format(ns=cr["metadata"]["namespace"]), cr)

    def patch_cr(self, ns: str, name: str, spec: dict[str, Any]) -> Any:
        return self.merge_patch(f"{CR_PATH.format(ns=ns)}/{name}", {"spec": spec})

    def cr(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"{CR_PATH.format(ns=ns)}/{name}") or {})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Running:
    name: str
    iface: PodInterface
    uid: str
    pod: Pod | None = None  # run by pod.runtime
    router: bool = False  # a router pod (the router image), else an engine pod
    ready: bool = False
    since: str = field(default_factory=_now)
    failed: str = ""
    reported: dict[str, Any] = field(default_factory=dict)
    containers_since: str = field(default_factory=_now)
    containers_ready: bool = False
    updating: bool = False  # a Pod.update (labels, annotations, images) is being acted on


class Kubelet:
    """Runs the emulator's pods of ``namespace`` on ``node`` and reports their status."""

    def __init__(self, api: Api, network: PodNetwork, node: Node, image: Image,
                 router_image: Image, workdir: Path, claims: dict[str, Path],
                 namespace: str) -> None:
        self.api, self.network, self.node, self.image = api, network, node, image
        self.router_image = router_image
        self.workdir, self.claims, self.namespace = workdir, dict(claims), namespace
        self.running: dict[str, Running] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kubelet")
        self._gpus = 0
        self.paused: set[str] = set()  # pods whose engine processes are stopped (SIGSTOP)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for name in list(self.running):
            self._stop_pod(name)

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sync()
            except Exception as exc:  # keep running; the test sees the pods' status
                print(f"kubelet: sync failed: {type(exc).__name__}: {exc}")

    def sync(self) -> None:
        pods = {p["metadata"]["name"]: p
                for p in self.api.list(f"/api/v1/namespaces/{self.namespace}/pods")}
        for name in list(self.running):
            pod = pods.get(name)
            if pod is None or pod["metadata"]["uid"] != self.running[name].uid or \
                    pod["metadata"].get("deletionTimestamp"):
                self._stop_pod(name)
        for name, pod in pods.items():
            if name not in self.running and not pod["metadata"].get("deletionTimestamp"):
                self._start_pod(pod)
        configmaps = None
        for run in list(self.running.values()):
            pod = pods.get(run.name)
            if pod is not None and run.pod is not None and not run.router:
                # A container's envFrom is resolved when it starts, from the ConfigMap as it
                # is then (a new configuration revision the operator added meanwhile).
                if configmaps is None:
                    configmaps = {c["metadata"]["name"]: dict(c.get("data") or {})
                                  for c in self.api.list(
                                      f"/api/v1/namespaces/{self.namespace}/configmaps")}
                run.pod.configmaps.update(configmaps)
            if pod is not None and run.pod is not None and not run.updating:
                self._update(run, pod)
            if pod is not None:
                self._report(run, pod)

    # ------------------------------------------------------------------ pods
    def _start_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        iface = self.network.add_pod(meta["name"])
        labels = meta.get("labels") or {}
        run = Running(meta["name"], iface, meta["uid"],
                      router=labels.get("app.kubernetes.io/name") == ROUTER_NAME)
        self.running[meta["name"]] = run
        threading.Thread(target=self._start_router if run.router else self._start_engine,
                         args=(run, pod), daemon=True, name=f"start-{run.name}").start()

    def _start_engine(self, run: Running, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        spec = copy.deepcopy(pod["spec"])
        spec.setdefault("hostname", meta["name"])
        owner = next(r["name"] for r in meta["ownerReferences"] if r["kind"] == "StatefulSet")
        sts = self.api.request(
            "GET", f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets/{owner}")
        claims = dict(self.claims)
        for ct in (sts or {}).get("spec", {}).get("volumeClaimTemplates", []):
            claim = f"{ct['metadata']['name']}-{meta['name']}"
            claims[claim] = self.workdir / "pv" / claim
            claims[claim].mkdir(parents=True, exist_ok=True)
            spec.setdefault("volumes", []).append(
                {"name": ct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
        configmaps = {c["metadata"]["name"]: dict(c.get("data") or {})
                      for c in self.api.list(f"/api/v1/namespaces/{self.namespace}/configmaps")}
        gpus = sum(int(c.get("resources", {}).get("limits", {}).get("amd.com/gpu", 0))
                   for c in spec.get("containers", []))
        first, self._gpus = self._gpus, self._gpus + gpus
        run.pod = Pod(_meta(pod, run), spec, configmaps, self.node, self.image,
                      self.workdir / meta["name"], claims, gpu_first=first, netns=run.iface.netns)
        self._run(run)

    def _start_router(self, run: Running, pod: dict[str, Any]) -> None:
        """The router Deployment's pod as the kubelet runs it: its own command, arguments,
        probes, user, seccomp profile and memory limit, from the router image."""
        spec = copy.deepcopy(pod["spec"])
        assert [c["command"] for c in spec["containers"]] == [["smg"]], spec["containers"]
        run.pod = Pod(_meta(pod, run), spec, {}, self.node, self.router_image,
                      self.workdir / run.name, netns=run.iface.netns)
        self._run(run)

    @staticmethod
    def _run(run: Running) -> None:
        assert run.pod is not None
        try:
            run.pod.start()
        except Exception as exc:
            run.failed = f"{type(exc).__name__}: {exc}"

    def _stop_pod(self, name: str) -> None:
        run = self.running.pop(name)
        if run.pod is not None:
            run.pod.close()
        self.network.remove_pod(name)

    def _update(self, run: Running, pod: dict[str, Any]) -> None:
        """A pod update in the API (labels, annotations, container images: the Pod update
        rule) acted on as the kubelet does (``runtime.Pod.update``), in its own thread: an
        image change restarts that container through its preStop."""
        assert run.pod is not None
        meta = pod["metadata"]
        labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
        images = {c["name"]: c.get("image") for c, _ in containers_in_start_order(pod["spec"])}
        spec = copy.deepcopy(run.pod.spec)
        for c, _ in containers_in_start_order(spec):
            c["image"] = images.get(c["name"], c.get("image"))
        if (labels, annotations, spec) == (run.pod.meta.labels, run.pod.meta.annotations,
                                           run.pod.spec):
            return
        run.updating = True

        def act() -> None:
            try:
                assert run.pod is not None
                run.pod.update(labels, annotations, spec)
            finally:
                run.updating = False

        threading.Thread(target=act, daemon=True, name=f"update-{run.name}").start()

    @staticmethod
    def _containers_ready(run: Running) -> bool:
        """Every app container's readiness probe passes (the pod's ContainersReady)."""
        if run.pod is None:
            return False
        apps = [c for c in run.pod.containers if c.role == "app"]
        return bool(apps) and all(c.ready for c in apps)

    def _report(self, run: Running, pod: dict[str, Any]) -> None:
        """The pod's status as the kubelet writes it: ContainersReady from the probes, Ready
        from those and every readiness gate's condition (which others write: kept as they
        are), the app containers' statuses (a restart is a new container ID)."""
        containers = self._containers_ready(run)
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        conditions = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        ready = containers and all(conditions.get(g, {}).get("status") == "True" for g in gates)
        if ready != run.ready:
            run.ready, run.since = ready, _now()
        if containers != run.containers_ready:
            run.containers_ready, run.containers_since = containers, _now()
        status = {"phase": "Running", "podIP": run.iface.ip, "podIPs": [{"ip": run.iface.ip}],
                  "hostIP": self.network.gateway,
                  "conditions": [{"type": "ContainersReady", "status": str(containers),
                                  "lastTransitionTime": run.containers_since},
                                 {"type": "Ready", "status": str(ready),
                                  "lastTransitionTime": run.since},
                                 *(conditions[g] for g in gates if g in conditions)],
                  "containerStatuses": [_container_status(run, c) for c in (
                      run.pod.containers if run.pod is not None else []) if c.role == "app"]}
        if status == run.reported:
            return
        # A JSON patch guarded by the pod's resourceVersion: a gate condition the operator
        # writes meanwhile is never overwritten (the next sync reads it and reports again).
        with contextlib.suppress(AssertionError):  # gone or changed: the next sync sees it
            self.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{run.name}"
                             "/status", [{"op": "test", "path": "/metadata/resourceVersion",
                                          "value": pod["metadata"]["resourceVersion"]},
                                         {"op": "add", "path": "/status", "value": status}],
                             "application/json-patch+json")
            run.reported = status

    # ------------------------------------------------------------------ test controls
    def engine(self, name: str) -> Pod:
        run = self.running[name]
        assert run.pod is not None and not run.router, f"{name} is not a running engine pod"
        return run.pod

    def ip(self, name: str) -> str:
        return self.running[name].iface.ip

    def pause(self, name: str, stopped: bool) -> None:
        """SIGSTOP/SIGCONT every process of an engine pod's app containers: a hung engine,
        whose readiness probe (and the router's health check) then fails."""
        for c in self.engine(name).containers:
            if c.role == "app" and c.proc is not None:
                for pid in _cgroup_pids(c.cgroup):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP if stopped else signal.SIGCONT)


def _meta(pod: dict[str, Any], run: Running) -> PodMeta:
    meta = pod["metadata"]
    return PodMeta(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                   pod_ip=run.iface.ip, labels=dict(meta.get("labels") or {}),
                   annotations=dict(meta.get("annotations") or {}))


def _container_status(run: Running, c: Any) -> dict[str, Any]:
    """One container's status: a new ID per start (what tells the operator it restarted)."""
    running = c.running()
    return {"name": c.name, "image": c.spec.get("image", ""), "ready": bool(c.ready),
            "restartCount": c.restarts, "started": running,
            "containerID": f"pod-tier://{run.name}/{c.name}/{c.generation}",
            "state": {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}}


def _subdir(parent: Path, name: str) -> Path:
    d = parent / name
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)
    return d


def _cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


@contextlib.contextmanager
def served_cluster(workdir: Path, node: Node, image: Image, models_dir: Path,
                   namespace: str, **admin: Any) -> Iterator[tuple[Api, Kubelet, PodNetwork]]:
    """A pod network, the control plane on its bridge (``control_plane.py``: the API emulator
    and the operator watching ``namespace``, configured by ``harness.admin_config(node,
    **admin)``), and a kubelet running its pods; yields (the API, the kubelet, the network).
    Everything is stopped and removed afterwards."""
    if not VENV_PYTHON.exists():
        raise AssertionError(f"{VENV_PYTHON} missing: run `make venv`")
    remove_stale()
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(PodNetwork())
        kubeconfig = workdir / "kubeconfig"
        log = stack.enter_context(open(workdir / "control-plane.log", "wb"))
        from .harness import admin_config

        config = admin_config(node, **admin).model_dump(by_alias=True, exclude_defaults=True,
                                                        mode="json")
        plane = subprocess.Popen(
            [str(VENV_PYTHON), str(Path(__file__).with_name("control_plane.py")), net.gateway,
             namespace, str(kubeconfig), json.dumps(config)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, start_new_session=True)

        def stop_plane() -> None:
            with contextlib.suppress(OSError):
                assert plane.stdin is not None
                plane.stdin.close()
            try:
                plane.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(plane.pid, signal.SIGKILL)
                plane.wait(10)
        stack.callback(stop_plane)
        assert plane.stdout is not None
        line = plane.stdout.readline().decode().strip()
        if not line.startswith("READY "):
            raise AssertionError("the control plane did not start:\n"
                                 + (workdir / "control-plane.log").read_text()[-3000:])
        api = Api(line.split(" ", 1)[1])
        router_image = make_router_image(_subdir(workdir, "router-image"), kubeconfig)
        kubelet = stack.enter_context(Kubelet(api, net, node, image, router_image, workdir,
                                              {"tiny-models": models_dir}, namespace))
        yield api, kubelet, net
