"""Helpers for the e2e tests: a view of the emulated cluster and an operator process."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from emulator import CHART_CRD, EmulatorThread
from emulator.store import ApiError
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import plan

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
NAMESPACE = "shc-e2e"
CR_API, CRS = "hicache.sglang.ai/v1alpha1", "sglanghicaches"
CHILD_RESOURCES = (("apps/v1", "statefulsets"), ("v1", "services"), ("v1", "configmaps"),
                   ("apps/v1", "deployments"), ("v1", "serviceaccounts"),
                   ("rbac.authorization.k8s.io/v1", "roles"),
                   ("rbac.authorization.k8s.io/v1", "rolebindings"),
                   ("policy/v1", "poddisruptionbudgets"))
#: The operator's resync timer in these tests (operator configuration resyncSeconds).
RESYNC_S = 1.0


#: In-place rollouts: seconds a pod stays out of rotation before its engine restarts (the
#: default, 35 s, would make every test wait; 1 s keeps the order of the steps observable).
DRAIN_GRACE_S = 1


def write_operator_config(path: Path, **config: Any) -> Path:
    """An operator configuration file with the tests' resync interval and drain grace (and
    ``config``)."""
    rollout = {"drainGraceSeconds": DRAIN_GRACE_S, **config.pop("rollout", {})}
    path.write_text(yaml.safe_dump({"resyncSeconds": RESYNC_S, "rollout": rollout, **config}))
    return path


def selector(name: str) -> str:
    """The labels of one CR's objects (the instance label alone is shared with other tools)."""
    return f"app.kubernetes.io/name=sglang-hicache,app.kubernetes.io/instance={name}"


def load_crds() -> list[dict[str, Any]]:
    """Every CRD the chart installs (``crds/*.yaml``: SGLangHiCache, kopf peering). The
    SGLangHiCache CRD is generated from the models only when the chart copy is missing."""
    docs = [dict(doc) for path in sorted(CHART_CRD.parent.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]
    if not CHART_CRD.exists():
        from hicache_operator.api.crd import crd_yaml

        docs.append(dict(yaml.safe_load(crd_yaml())))
    return docs


def example(path: Path, name: str | None = None) -> dict[str, Any]:
    doc = dict(yaml.safe_load(path.read_text()))
    doc["metadata"] = {"name": name or doc["metadata"]["name"], "namespace": NAMESPACE}
    return doc


class Planned:
    """The planner's output for a CR, as the controller applies it."""

    def __init__(self, cr: dict[str, Any], router_serving: bool = False) -> None:
        body = copy.deepcopy(cr)
        body["metadata"].setdefault("namespace", NAMESPACE)
        # router_serving False: the CR's Service points at the router only once a router pod
        # is available, which no e2e test makes happen unless it says so.
        result = plan(body, OperatorConfig(), router_serving=router_serving)
        self.status_plan = result.status_plan
        self.objects = list(result.objects)


def planned(cr: dict[str, Any], router_serving: bool = False) -> Planned:
    return Planned(cr, router_serving)


class Cluster:
    def __init__(self, emu: EmulatorThread, kubeconfig: Path) -> None:
        self.emu, self.kubeconfig = emu, kubeconfig

    # ------------------------------------------------------------------ waiting
    def wait(self, predicate: Callable[[], T], what: str, timeout: float = 30.0) -> T:
        return self.emu.wait_for(predicate, timeout=timeout, what=what)

    def wait_operator_watching(self) -> None:
        self.wait(lambda: any(r.watch and r.plural == CRS for r in self.emu.requests()),
                  "the operator to watch SGLangHiCache resources")

    # ------------------------------------------------------------------ the CR
    def apply(self, cr: dict[str, Any]) -> dict[str, Any]:
        return self.emu.create(CR_API, CRS, cr)

    def cr(self, name: str) -> dict[str, Any] | None:
        return self.emu.find(CR_API, CRS, NAMESPACE, name)

    def patch_spec(self, name: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
        return self.emu.patch(CR_API, CRS, NAMESPACE, name, {"spec": spec_patch})

    def delete_cr(self, name: str) -> None:
        self.emu.delete(CR_API, CRS, NAMESPACE, name)

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        body = self.cr(name) or {}
        for cond in (body.get("status") or {}).get("conditions") or []:
            if cond["type"] == kind:
                return dict(cond)
        return {}

    def wait_condition(self, name: str, kind: str, status: str, reason: str | None = None,
                       timeout: float = 30.0) -> dict[str, Any]:
        def check() -> dict[str, Any]:
            cond = self.condition(name, kind)
            ok = cond.get("status") == status and (reason is None or cond.get("reason") == reason)
            return cond if ok else {}
        return self.wait(check, f"{name}: {kind}={status} ({reason or 'any reason'}); "
                         f"last {self.condition(name, kind)}", timeout)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.emu.list("v1", "events", NAMESPACE)
                if e.get("involvedObject", {}).get("name") == name]

    # ------------------------------------------------------------------ children
    def children(self, name: str) -> dict[tuple[str, str], dict[str, Any]]:
        found = {}
        for api_version, plural in CHILD_RESOURCES:
            for obj in self.emu.list(api_version, plural, NAMESPACE, selector(name)):
                found[(obj["kind"], obj["metadata"]["name"])] = obj
        return found

    def child(self, kind_plural: tuple[str, str], name: str) -> dict[str, Any] | None:
        return self.emu.find(kind_plural[0], kind_plural[1], NAMESPACE, name)

    def wait_children(self, cr: dict[str, Any], timeout: float = 30.0) -> dict[tuple[str, str],
                                                                              dict[str, Any]]:
        """Wait until the children are exactly the planned ones, each covering its plan."""
        from hicache_operator.controller.diff import covers

        wanted = {(o["kind"], o["metadata"]["name"]): o for o in planned(cr).objects}

        def converged() -> dict[tuple[str, str], dict[str, Any]]:
            live = self.children(cr["metadata"]["name"])
            if set(live) != set(wanted):
                return {}
            ok = all(covers(live[k], {kk: vv for kk, vv in w.items() if kk != "metadata"})
                     and covers(live[k]["metadata"].get("labels") or {},
                                w["metadata"].get("labels") or {})
                     for k, w in wanted.items())
            return live if ok else {}
        return self.wait(converged, f"children of {cr['metadata']['name']} to match the plan "
                         f"{sorted(wanted)}; live {sorted(self.children(cr['metadata']['name']))}",
                         timeout)

    def pods(self, name: str) -> list[dict[str, Any]]:
        return self.emu.list("v1", "pods", NAMESPACE, selector(name))

    def mark_pods_ready(self, name: str, count: int, ips: list[str] | None = None) -> None:
        """Mark ``count`` pods of ``name`` Ready; with ``ips``, pod i (by name) gets ips[i]."""
        pods = self.wait(lambda: (lambda p: p if len(p) >= count else [])(self.pods(name)),
                         f"{count} pods of {name}")
        assert self.emu.simulator is not None
        names = sorted(pod["metadata"]["name"] for pod in pods)
        for i, pod_name in enumerate(names):
            ip = ips[i] if ips else None
            self.emu.call(lambda s, n=pod_name, a=ip:
                          self.emu.simulator.pod_ready(NAMESPACE, n, a))

    def ready_until(self, name: str, predicate: Callable[[], T], what: str,
                    timeout: float = 30.0) -> T:
        """Mark every pod of ``name`` that is not ready Ready (each new or restarted pod passes
        its probes) until ``predicate`` holds: a rolling update proceeds pod by pod."""
        assert self.emu.simulator is not None
        sim = self.emu.simulator

        def step() -> T:
            for pod in self.pods(name):
                ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (pod.get("status") or {}).get("conditions") or [])
                if not ready and not pod["metadata"].get("deletionTimestamp"):
                    pod_name = pod["metadata"]["name"]
                    with contextlib.suppress(ApiError):  # replaced meanwhile
                        self.emu.call(lambda s, n=pod_name: sim.pod_ready(NAMESPACE, n))
            return predicate()
        return self.wait(step, what, timeout)

    def set_pod(self, fn_name: str, pod: str, *args: Any) -> None:
        sim = self.emu.simulator
        assert sim is not None
        self.emu.call(lambda s: getattr(sim, fn_name)(NAMESPACE, pod, *args))

    def writes(self, exclude: tuple[str, ...] = ()) -> int:
        return len(self.emu.writes(exclude=exclude))

    def writes_during(self, seconds: float, exclude: tuple[str, ...] = ()) -> list[Any]:
        before = len(self.emu.writes(exclude=exclude))
        time.sleep(seconds)
        return self.emu.writes(exclude=exclude)[before:]

    def wait_settled(self, period: float, timeout: float = 30.0) -> None:
        """Wait for a window of ``period`` seconds without writes (kopf posts Events and pod
        updates trail a transition); an operator that writes on every resync never settles."""
        deadline = time.monotonic() + timeout
        while self.writes_during(period):
            if time.monotonic() > deadline:
                raise AssertionError(f"writes never stopped within {timeout} s: "
                                     f"{self.emu.writes()[-5:]}")

    def create_raw(self, cr: dict[str, Any]) -> ApiError | None:
        try:
            self.apply(cr)
        except ApiError as exc:
            return exc
        return None


class OperatorProcess:
    """``python -m hicache_operator run`` as a child process (SIGKILL-able)."""

    def __init__(self, cluster: Cluster, log_path: Path) -> None:
        self.cluster, self.log_path = cluster, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str, standalone: bool = True,
              env_extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), **(env_extra or {}))
        log = self.log_path.open("ab")
        args = ["run", "-n", NAMESPACE, "--metrics-port", "0", *extra]
        if standalone:
            args.append("--standalone")
        self.proc = subprocess.Popen([sys.executable, "-m", "hicache_operator", *args], env=env,
                                     stdout=log, stderr=subprocess.STDOUT)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class FakeSGLangMetrics:
    """SGLang's ``/metrics`` pages served over real HTTP on loopback addresses (one per pod:
    127.0.0.2, 127.0.0.3, ...), all on one port, as pods serve on ``spec.engine.port``. The page
    each address serves is set by the test (fixtures of SGLang's exposition)."""

    def __init__(self, pods: int) -> None:
        import asyncio
        import threading

        self.ips = [f"127.0.0.{2 + i}" for i in range(pods)]
        self.pages = dict.fromkeys(self.ips, "")
        self.requests: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import asyncio
        import socket

        from aiohttp import web

        async def handler(request: web.Request) -> web.Response:
            ip = request.transport.get_extra_info("sockname")[0] if request.transport else ""
            self.requests.append(ip)
            return web.Response(text=self.pages.get(ip, ""), content_type="text/plain")

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_get("/metrics", handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            with socket.socket() as probe:  # a port free on every address
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
            for ip in self.ips:
                await web.TCPSite(runner, ip, self.port).start()
            return runner

        asyncio.set_event_loop(self._loop)
        runner = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> FakeSGLangMetrics:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake SGLang metrics servers did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def serve(self, page: str, ip: str | None = None) -> None:
        for target in [ip] if ip else self.ips:
            self.pages[target] = page
