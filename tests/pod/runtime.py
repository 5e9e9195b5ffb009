"""Run a pod template's containers as local processes, the way a kubelet on a MI355X node would.

What is real: the container commands, args and environment exactly as the spec renders them
(``envFrom`` ConfigMaps, downward API) over the image's environment (the upstream base image's
ENV and our Dockerfile's, :mod:`pod.image`); volumes at their ``mountPath`` in a private mount
namespace per container (``emptyDir``, ``medium: Memory`` as a real tmpfs with its
``sizeLimit``, per-pod claims that outlive container restarts); a fresh writable layer (the
image's HOME and /tmp) for every start of a container; the container user, the image's groups,
fsGroup and supplementalGroups, ``fsGroup`` ownership of volumes; capabilities as Kubernetes
grants them to a non-root user (a bounding set, never ambient); containerd's RuntimeDefault
seccomp profile resolved from the configured capabilities (:mod:`pod.seccomp_profile`); a
memory cgroup per container at its ``limits.memory`` and a cpuset cgroup with its CPUs (the
static CPU manager); GPU device files with the host's owner and mode; hugepages reserved on the
node for the pod's requests; native sidecars (init containers with ``restartPolicy: Always``)
started in order, each waited for until its startup probe passes; the pod's own startup,
readiness and liveness probes with the spec's path, port, period, timeout and thresholds;
``preStop`` exec hooks within the grace period; restarts with CrashLoopBackOff after an exit
or a failed liveness/startup probe; with ``netns`` (``pod.network``) the pod's own network
namespace and IP on a bridge. What is not: the network without one (the pod IP is then
127.0.0.1 and pods share the host's ports), CPU quotas and exclusive CPUs per container
(this machine has 2 cores, see :mod:`pod.cputopo`), image layers (the test image is the engine
environment; see :class:`pod.image.Image`), GPUs (see :mod:`pod.node`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import downward, podspec
from .image import Image
from .node import Node, kill_cgroup
from .podspec import PodMeta, Probe
from .seccomp_profile import runtime_default

SHIM = Path(__file__).with_name("shim.py")
# The runtime is a host program: the host's Python, with Debian's python3-seccomp.
SHIM_PYTHON = "/usr/bin/python3"
BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0


def seccomp_for(sc: dict[str, Any], caps: list[str]) -> dict[str, Any] | None:
    """The seccomp profile a container runs under: containerd's RuntimeDefault for
    ``RuntimeDefault`` (resolved from its configured capabilities), none for ``Unconfined``.
    Kubernetes >= 1.27 still defaults an unset profile to Unconfined unless the kubelet runs
    with ``--seccomp-default``; every pod the operator builds sets RuntimeDefault."""
    kind = sc.get("seccompProfile", {}).get("type", "Unconfined")
    if kind == "RuntimeDefault":
        return runtime_default(caps)
    if kind == "Unconfined":
        return None
    raise NotImplementedError(f"seccompProfile {kind}")


@dataclass
class Event:
    t: float
    container: str
    reason: str
    message: str


class Container:
    def __init__(self, pod: Pod, spec: dict[str, Any], role: str) -> None:
        self.pod, self.spec, self.role = pod, spec, role
        self.name: str = spec["name"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.exit_codes: list[int] = []
        self.started = threading.Event()  # startup probe passed (or none)
        self.ready = False
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.log_path = pod.dir / "logs" / f"{self.name}.log"
        cg_name = f"{pod.node.workdir.name}-{pod.meta.name}-{self.name}"
        self.cgroup = pod.node.memory_cgroup(cg_name, podspec.memory_limit(spec))
        self.cpuset, self.cpus = pod.node.cpuset_cgroup(cg_name, podspec.cpu_request(spec))
        self.layer: Path | None = None
        self.user: dict[str, Any] = {}
        self.env: dict[str, str] = {}
        self._probe_stop = threading.Event()
        self.generation = 0
        self.replacing = False  # being restarted for a new spec (not a crash to back off)

    # -- process ------------------------------------------------------------------------------
    def _new_layer(self) -> dict[str, str]:
        """A fresh writable layer for this start (the previous start's is gone): the image's
        HOME and /tmp, where nothing survives a restart but what volumes hold."""
        if self.layer is not None:
            shutil.rmtree(self.layer, ignore_errors=True)
        self.layer = self.pod.dir / "layers" / self.name / str(self.generation)
        out = {}
        for target in (self.pod.image.home, "/tmp"):
            d = self.layer / target.strip("/").replace("/", "_")
            d.mkdir(parents=True, exist_ok=True)
            if target == "/tmp":
                os.chmod(d, 0o1777)
            else:
                os.chown(d, self.pod.image.uid, self.pod.image.gid)
            out[target] = str(d)
        os.chmod(self.layer.parent.parent, 0o755)
        return out

    def _image_files(self) -> dict[str, str]:
        """The image's files at fixed paths, copied into this start's layer: a container writes
        them copy-on-write (torch's lock file next to the prebuilt extension), and a restarted
        container finds them as the image has them."""
        assert self.layer is not None
        out = {}
        for i, (target, source) in enumerate(self.pod.image.files.items()):
            copy = self.layer / "image-files" / str(i)
            copy.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", source, str(copy)], check=True)
            out[target] = str(copy)
        return out

    def start(self) -> None:
        pod, spec = self.pod, self.spec
        spec_env = podspec.container_env(spec, pod.configmaps, pod.meta)
        env = {**pod.image.env, **spec_env}
        mounts = [{"source": str(pod.volume_host_path(m["name"])), "target": m["mountPath"],
                   "readOnly": bool(m.get("readOnly"))} for m in spec.get("volumeMounts", [])]
        pod_sc = pod.spec.get("securityContext", {})
        sc = {**pod_sc, **spec.get("securityContext", {})}
        caps = [c.upper() for c in sc.get("capabilities", {}).get("add", [])]
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            raise NotImplementedError(f"{self.name}: only drop: [ALL] + add is modelled")
        groups = list(dict.fromkeys(g for g in (
            *pod.image.groups, pod_sc.get("fsGroup"), *pod_sc.get("supplementalGroups", []))
            if g is not None))
        gpus = podspec.gpus(spec, pod.gpu_resource)
        # A new container is neither started nor ready until its probes say so (set before the
        # generation moves: whoever sees the new generation must not see the old readiness).
        self.started.clear()
        self.ready = False
        self.generation += 1
        shim_spec = {
            "stage_dir": str(pod.dir / "stage" / self.name),
            "cgroup_procs": [str(self.cgroup / "cgroup.procs"),
                             str(self.cpuset / "cgroup.procs")],
            "devices": pod.node.gpu_devices(pod.gpu_first, gpus) if gpus else {},
            "sys_merge": pod.node.sys_merge(),
            "host_views": pod.node.host_views(),
            "layer": self._new_layer(),
            "image_paths": list(pod.image.paths), "image_files": self._image_files(),
            "mounts": mounts,
            "cwd": spec.get("workingDir", pod.image.home),
            "user": {"uid": sc.get("runAsUser", pod.image.uid),
                     "gid": sc.get("runAsGroup", pod.image.gid), "groups": groups},
            "capabilities": [c.lower() for c in caps],
            "seccomp": seccomp_for(sc, caps),
            "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
            "argv": podspec.command_line(spec, spec_env),
            "env": env,
        }
        self.user, self.env = shim_spec["user"], env
        spec_path = pod.dir / "stage" / f"{self.name}.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps(shim_spec))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"==== start #{self.restarts} at {time.time():.3f}\n".encode())
            log.flush()
            # nsenter joins only the network namespace (``ip netns exec`` would also remount
            # /sys, hiding the cgroup hierarchy the shim joins).
            netns = ["nsenter", f"--net=/var/run/netns/{pod.netns}", "--"] if pod.netns else []
            self.proc = subprocess.Popen(
                [*netns, "unshare", "--mount", "--propagation", "private", "--",
                 SHIM_PYTHON, str(SHIM), str(spec_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        pod.event(self.name, "Started", f"pid {self.proc.pid}")
        self._probe_stop = threading.Event()
        threading.Thread(target=self._probe_loop, args=(self.generation, self._probe_stop),
                         daemon=True, name=f"probe-{self.name}").start()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, grace_s: float | None = None, reason: str = "Killing") -> None:
        """SIGTERM the main process, SIGKILL the whole cgroup after the grace period."""
        self._probe_stop.set()
        proc = self.proc
        if proc is None:
            return
        if grace_s is None:
            grace_s = float(self.pod.spec.get("terminationGracePeriodSeconds", 30))
        deadline = time.monotonic() + grace_s
        pre_stop = self.spec.get("lifecycle", {}).get("preStop")
        if pre_stop is not None and proc.poll() is None:
            # The kubelet runs preStop first, inside the grace period, then sends SIGTERM.
            ok, msg = self.pod.run_probe(self, podspec.hook(pre_stop, grace_s))
            self.pod.event(self.name, "PreStop" if ok else "FailedPreStopHook", msg)
        grace_s = max(deadline - time.monotonic(), 2.0)
        if proc.poll() is None:
            self.pod.event(self.name, reason, f"SIGTERM pid {proc.pid}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        kill_cgroup(self.cgroup)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        self.ready = False

    def log_text(self, tail: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    # -- probes -------------------------------------------------------------------------------
    def _probe_loop(self, generation: int, stop: threading.Event) -> None:
        startup = podspec.probe(self.spec, "startupProbe")
        readiness = podspec.probe(self.spec, "readinessProbe")
        liveness = podspec.probe(self.spec, "livenessProbe")
        t0 = time.monotonic()
        if startup is not None and not self._run_until(startup, "Startup", t0, stop):
            return
        self.started_at = time.time()
        self.started.set()
        if self.role == "init":
            return
        next_ready = next_live = time.monotonic()
        if readiness is not None:
            next_ready += readiness.initial_delay_s
        if liveness is not None:
            next_live += liveness.initial_delay_s
        live_fail = ready_ok = ready_fail = 0
        while not stop.is_set() and generation == self.generation:
            now = time.monotonic()
            if readiness is None:
                self._set_ready(True)
            elif now >= next_ready:
                ok, msg = self.pod.run_probe(self, readiness)
                ready_ok, ready_fail = (ready_ok + 1, 0) if ok else (0, ready_fail + 1)
                if ok and ready_ok >= readiness.success_threshold:
                    self._set_ready(True)
                elif not ok:
                    self.pod.event(self.name, "Unhealthy", f"Readiness probe failed: {msg}")
                    if ready_fail >= readiness.failure_threshold:
                        self._set_ready(False)
                next_ready = now + readiness.period_s
            if liveness is not None and now >= next_live:
                ok, msg = self.pod.run_probe(self, liveness)
                live_fail = 0 if ok else live_fail + 1
                if not ok:
                    self.pod.event(self.name, "Unhealthy", f"Liveness probe failed: {msg}")
                    if live_fail >= liveness.failure_threshold:
                        self.pod.event(self.name, "Killing",
                                       "Container failed liveness probe, will be restarted")
                        threading.Thread(target=self.kill, daemon=True).start()
                        return
                next_live = now + liveness.period_s
            stop.wait(0.2)

    def _run_until(self, p: Probe, what: str, t0: float, stop: threading.Event) -> bool:
        stop.wait(p.initial_delay_s)
        fails = 0
        while not stop.is_set():
            ok, msg = self.pod.run_probe(self, p)
            if ok:
                return True
            fails += 1
            self.pod.event(self.name, "Unhealthy", f"{what} probe failed: {msg}")
            if fails >= p.failure_threshold:
                self.pod.event(self.name, "Killing",
                               f"Container failed {what.lower()} probe, will be restarted")
                threading.Thread(target=self.kill, daemon=True).start()
                return False
            stop.wait(p.period_s)
        return False

    def _set_ready(self, ready: bool) -> None:
        if ready and not self.ready:
            self.ready_at = time.time()
        self.ready = ready


@dataclass
class Pod:
    """One pod of a StatefulSet, run on ``node``. ``claims`` maps a PVC name to a host dir."""

    meta: PodMeta
    spec: dict[str, Any]
    configmaps: dict[str, dict[str, str]]
    node: Node
    image: Image
    dir: Path
    claims: dict[str, Path] = field(default_factory=dict)
    gpu_first: int = 0
    gpu_resource: str = "amd.com/gpu"
    backoff_initial_s: float = BACKOFF_INITIAL_S
    events: list[Event] = field(default_factory=list)
    # The pod's network namespace (pod.network): its containers run there, at meta.pod_ip.
    netns: str | None = None

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tmpfs: list[Path] = []
        self.volumes: dict[str, Path] = {}
        self._downward: dict[str, tuple[Path, list[dict[str, Any]]]] = {}
        self.containers: list[Container] = []
        self._supervisor: threading.Thread | None = None

    # -- events and probes ------------------------------------------------------------------------
    def event(self, container: str, reason: str, message: str) -> None:
        with self._lock:
            self.events.append(Event(time.time(), container, reason, message))

    def events_of(self, container: str, reason: str | None = None) -> list[Event]:
        with self._lock:
            return [e for e in self.events
                    if e.container == container and (reason is None or e.reason == reason)]

    def run_probe(self, c: Container, p: Probe) -> tuple[bool, str]:
        if p.kind == "httpGet":
            port = podspec.resolve_port(c.spec, p.target["port"])
            url = f"http://{self.meta.pod_ip}:{port}{p.target.get('path', '/')}"
            # kubelet's timeoutSeconds bounds the whole request (Go http.Client.Timeout), not
            # each socket operation: a response after the deadline is a failed probe.
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=p.timeout_s) as r:
                    r.read()
                    status = r.status
            except urllib.error.HTTPError as e:
                return False, f"HTTP probe failed with statuscode: {e.code}"
            except Exception as e:  # timeouts, refused connections: what kubelet reports
                return False, f'Get "{url}": {e}'
            elapsed = time.monotonic() - t0
            if elapsed > p.timeout_s:
                return False, (f'Get "{url}": context deadline exceeded (Client.Timeout '
                               f"exceeded while awaiting headers; answered after {elapsed:.2f}s)")
            return 200 <= status < 400, f"HTTP {status}"
        if p.kind == "exec":
            if c.proc is None or c.proc.poll() is not None:
                return False, "container not running"
            # The shim execs setpriv, which execs the command: the main pid is the command's.
            # Like the kubelet: the container's mount namespace, user, groups and environment.
            user = c.user
            cmd = ["nsenter", f"--target={c.proc.pid}", "--mount", "--", "setpriv",
                   f"--reuid={user['uid']}", f"--regid={user['gid']}",
                   f"--groups={','.join(map(str, user['groups']))}" if user["groups"]
                   else "--clear-groups", "--", *p.target["command"]]
            try:
                r = subprocess.run(cmd, capture_output=True, timeout=p.timeout_s, env=c.env)
            except subprocess.TimeoutExpired:
                return False, f"command timed out after {p.timeout_s}s"
            out = (r.stdout + r.stderr).decode(errors="replace").strip()[-300:]
            return r.returncode == 0, f"exit {r.returncode}" + (f": {out}" if out else "")
        if p.kind == "tcpSocket":
            import socket

            port = podspec.resolve_port(c.spec, p.target["port"])
            try:
                socket.create_connection((self.meta.pod_ip, port), timeout=p.timeout_s).close()
                return True, "connected"
            except OSError as e:
                return False, str(e)
        raise NotImplementedError(p.kind)

    # -- volumes -----------------------------------------------------------------------------------
    def _prepare_volumes(self) -> None:
        sc = self.spec.get("securityContext", {})
        fs_group = sc.get("fsGroup")
        for vol in self.spec.get("volumes", []):
            name = vol["name"]
            path = self.dir / "volumes" / name
            if "emptyDir" in vol:
                path.mkdir(parents=True, exist_ok=True)
                ed = vol["emptyDir"] or {}
                if ed.get("medium") == "Memory":
                    size = ed.get("sizeLimit")
                    opts = "mode=1777" + (f",size={podspec.parse_quantity(size)}" if size else "")
                    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                                   check=True)
                    self._tmpfs.append(path)
                else:
                    os.chmod(path, 0o777)
            elif "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                if claim not in self.claims:
                    raise LookupError(f"PVC {claim!r} has no volume bound in this test (Pending)")
                path = self.claims[claim]
            elif "configMap" in vol:
                path.mkdir(parents=True, exist_ok=True)
                for k, v in self.configmaps[vol["configMap"]["name"]].items():
                    (path / k).write_text(v)
            elif "downwardAPI" in vol:
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, 0o755)
                self._downward[name] = path, list(vol["downwardAPI"].get("items") or [])
            else:
                raise NotImplementedError(f"volume {name}: {sorted(vol)}")
            self.volumes[name] = path
        if fs_group is not None:
            for path in self.volumes.values():
                _own_group(path, int(fs_group))
        self._write_downward()

    def _write_downward(self) -> None:
        """The kubelet (re)writes downward API volumes from the pod as the API shows it."""
        fields = {"metadata.name": self.meta.name, "metadata.namespace": self.meta.namespace,
                  "metadata.uid": self.meta.uid, "metadata.labels": self.meta.labels,
                  "metadata.annotations": self.meta.annotations}
        for name, (path, items) in self._downward.items():
            if downward.write(path, downward.render(items, fields)):
                self.event(name, "DownwardAPIUpdated", f"{len(items)} file(s)")

    def volume_host_path(self, name: str) -> Path:
        if name not in self.volumes:
            raise LookupError(f"volumeMount {name!r} names no volume of the pod")
        return self.volumes[name]

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, wait_started_s: float = 600) -> None:
        self._prepare_volumes()
        for c_spec, role in podspec.containers_in_start_order(self.spec):
            self.node.reserve_hugepages_for(c_spec)
            c = Container(self, c_spec, role)
            self.containers.append(c)
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name=f"kubelet-{self.meta.name}")
        self._supervisor.start()
        for c in self.containers:
            c.start()
            if c.role == "init":
                assert c.proc is not None
                rc = c.proc.wait(timeout=wait_started_s)
                if rc != 0:
                    raise RuntimeError(f"init container {c.name} exited {rc}:\n{c.log_text()}")
            elif c.role == "sidecar":
                # The next container starts once this sidecar's startup probe passed.
                self.wait(functools.partial(self._started_or_looping, c), wait_started_s,
                          f"sidecar {c.name} started")

    def _supervise(self) -> None:
        backoff: dict[str, float] = {}
        while not self._stop.wait(0.2):
            for c in self.containers:
                if c.role == "init" or c.proc is None or c.proc.poll() is None or c.replacing:
                    continue
                rc = c.proc.returncode
                c.exit_codes.append(rc)
                c.ready = False  # a terminated container is not ready (the kubelet's status)
                c._probe_stop.set()
                kill_cgroup(c.cgroup)
                delay = backoff.get(c.name, self.backoff_initial_s)
                self.event(c.name, "BackOff" if c.restarts else "Exited",
                           f"exit code {rc}; restarting in {delay:.0f}s")
                backoff[c.name] = min(delay * 2, BACKOFF_MAX_S)
                c.proc = None
                if self._stop.wait(delay):
                    return
                c.restarts += 1
                c.start()

    def update(self, labels: dict[str, str], annotations: dict[str, str],
               spec: dict[str, Any]) -> list[str]:
        """The pod as the API server now stores it (an update: only labels, annotations and
        container images may differ, the Pod update rule), acted on as a kubelet does: the
        downward API volumes are rewritten, and a container whose image changed is killed and
        started anew (the kubelet compares containers by name and image; the other containers
        and the volumes stay). Returns the containers restarted."""
        old = {c["name"]: c for c, _ in podspec.containers_in_start_order(self.spec)}
        for c_spec, _ in podspec.containers_in_start_order(spec):
            before = old.get(c_spec["name"])
            if before is None or {**before, "image": ""} != {**c_spec, "image": ""}:
                raise ValueError(f"pod updates may not change fields other than images "
                                 f"(container {c_spec['name']})")
        self.meta = dataclasses.replace(self.meta, labels=dict(labels),
                                        annotations=dict(annotations))
        self.spec = spec
        self._write_downward()
        restarted = []
        for c_spec, _ in podspec.containers_in_start_order(spec):
            c = self.container(c_spec["name"])
            if c.spec.get("image") == c_spec.get("image"):
                continue
            c.replacing = True
            try:
                self.event(c.name, "Killing",
                           f"Container {c.name} definition changed, will be restarted")
                c.kill(reason="Killing")
                c.spec = c_spec
                c.restarts += 1
                c.start()
            finally:
                c.replacing = False
            restarted.append(c.name)
        return restarted

    def _started_or_looping(self, c: Container, max_restarts: int = 2) -> bool:
        if c.restarts > max_restarts:
            raise RuntimeError(f"CrashLoopBackOff: {c.name}:\n{c.log_text()}")
        return c.started.is_set()

    def container(self, name: str) -> Container:
        return next(c for c in self.containers if c.name == name)

    def wait(self, what: Callable[[], bool], timeout_s: float, label: str) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if what():
                return time.monotonic() - t0
            time.sleep(0.2)
        raise TimeoutError(f"{label} not reached in {timeout_s:.0f}s; events:\n"
                           + "\n".join(f"  {e.container} {e.reason}: {e.message}"
                                       for e in self.events[-25:])
                           + "".join(f"\n--- {c.name} log:\n{c.log_text(3000)}"
                                     for c in self.containers))

    def wait_ready(self, timeout_s: float = 600, max_restarts: int = 2) -> float:
        """Seconds until every app container is Ready; fails early (with the logs) once a
        container has been restarted more than ``max_restarts`` times (CrashLoopBackOff)."""
        apps = [c for c in self.containers if c.role == "app"]

        def ready() -> bool:
            looping = [c.name for c in self.containers if c.restarts > max_restarts]
            if looping:
                raise RuntimeError(f"CrashLoopBackOff: {looping}; events:\n" + "\n".join(
                    f"  {e.container} {e.reason}: {e.message}" for e in self.events[-20:])
                    + "".join(f"\n--- {c.name} log:\n{c.log_text(4000)}"
                              for c in self.containers))
            return all(c.ready for c in apps)

        return self.wait(ready, timeout_s, "pod Ready")

    def close(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        # Kubernetes 1.29+: app containers first, then sidecars in reverse start order.
        for c in [c for c in self.containers if c.role == "app"] + [
                c for c in reversed(self.containers) if c.role != "app"]:
            c.kill(grace_s=min(float(self.spec.get("terminationGracePeriodSeconds", 30)), 20))
        for path in reversed(self._tmpfs):
            subprocess.run(["umount", "-l", str(path)], check=False)
        self._tmpfs.clear()


def _own_group(path: Path, gid: int) -> None:
    """What kubelet does for fsGroup: group-own the volume, group rw, setgid directories."""
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs),
                     *(os.path.join(root, f) for f in files)]:
            with contextlib.suppress(OSError):
                os.chown(name, -1, gid)
                mode = os.stat(name).st_mode
                os.chmod(name, mode | 0o060 | (0o2010 if os.path.isdir(name) else 0))
