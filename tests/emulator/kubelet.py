"""The node side of the emulated cluster: the containers of each pod, as a kubelet reports them.

A kubelet compares each container with its spec by a hash of the container's name and image
only (``pickFieldsToHash``, Kubernetes >= 1.31); the image is one of the few mutable fields of a
Pod, and a changed image makes the kubelet kill that container and start a new one (new
``containerID``, ``restartCount`` + 1, ``lastState.terminated``), leaving every other container
of the pod running. Env (``envFrom`` ConfigMaps, ``fieldRef`` annotations) is resolved again at
that start.

What runs inside the engine container is ours: with updateStrategy InPlaceIfPossible the hicache
launcher leaves a watcher that stops the engine when the pod's ``config-hash`` annotation names
another revision, or its ``kubectl.kubernetes.io/restartedAt`` annotation changes
(``hicache_umbp.launch.revision``), and the kubelet restarts it (``restartPolicy: Always``).
``launcher_restarts_on_config = False`` models an engine image without that launcher (the
annotation then changes nothing, as on a real node).

Readiness gates: the kubelet sets ``ContainersReady`` from the containers and ``Ready`` only
when the containers are ready AND every condition named in ``spec.readinessGates`` is True
(``pkg/kubelet/status/generate.go``: a missing gate condition counts as False); it keeps the
gate conditions other writers set (``pods/status``) when it writes its own.

A pod run once (``restartPolicy: Never``, bound to a node, not a StatefulSet's: the operator's
pull pods) pulls its image ``pull_seconds`` after it is made and succeeds (``pulls`` records
each, in order), or fails to pull an image in ``bad_images`` (``ErrImagePull``).

Tests decide what the restarted engine does: ``ready_after_restart`` seconds later its readiness
probe passes (None: never by itself, the test calls ``pod_ready``); an image in ``bad_images``
cannot be pulled (``ErrImagePull``, then ``ImagePullBackOff``); one in ``crashing_images``
starts and crashes (``CrashLoopBackOff`` after two restarts).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from dataclasses import dataclass

from .store import ApiError, Obj, ResourceType, Store, WatchEvent, now_iso

CONFIG_ANNOTATION = "hicache.sglang.ai/config-hash"
RESTARTED_AT_ANNOTATION = "kubectl.kubernetes.io/restartedAt"
CONFIG_REVISION_ENV = "HICACHE_CONFIG_REVISION"
_IDS = itertools.count(1)


def _container_id() -> str:
    return f"containerd://{next(_IDS):064x}"


@dataclass
class Container:
    name: str
    image: str
    container_id: str
    restarts: int = 0
    ready: bool = False
    running: bool = False
    waiting: tuple[str, str] | None = None  # (reason, message)
    last_terminated: Obj | None = None
    started_at: str = ""

    def status(self) -> Obj:
        if self.waiting is not None:
            state: Obj = {"waiting": {"reason": self.waiting[0], "message": self.waiting[1]}}
        elif self.running:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        out: Obj = {"name": self.name, "image": self.image, "imageID": f"{self.image}@sha256:0",
                    "containerID": self.container_id, "ready": self.ready,
                    "restartCount": self.restarts, "started": self.running, "state": state}
        if self.last_terminated is not None:
            out["lastState"] = {"terminated": self.last_terminated}
        return out


def _gate_types(pod: Obj) -> set[str]:
    return {str(g.get("conditionType")) for g in (pod.get("spec") or {}).get(
        "readinessGates") or []}


def _conditions(pod: Obj, conditions: list[Obj], containers_ready: bool) -> list[Obj]:
    """The pod's conditions with ``ContainersReady`` and ``Ready`` as the kubelet computes
    them: Ready needs the containers and every readiness gate's condition True."""
    by_type = {c.get("type"): c for c in conditions}
    gates_ok = all((by_type.get(t) or {}).get("status") == "True" for t in _gate_types(pod))
    out = [c for c in conditions if c.get("type") not in ("Ready", "ContainersReady")]
    ready = "True" if containers_ready and gates_ok else "False"
    return [*out, {"type": "Ready", "status": ready},
            {"type": "ContainersReady", "status": "True" if containers_ready else "False"}]


def _runs_once(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    owned = any(r.get("kind") == "StatefulSet"
                for r in pod["metadata"].get("ownerReferences") or [])
    return spec.get("restartPolicy") == "Never" and bool(spec.get("nodeName")) and not owned


def _runs_revisions(pod: Obj) -> bool:
    """The engine container selects its configuration by the pod annotation (InPlace)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == "engine":
            return any(e.get("name") == CONFIG_REVISION_ENV for e in c.get("env") or [])
    return False


class Kubelet:
    """Container states per pod; reacts to pod spec/annotation changes like a node would."""

    def __init__(self, store: Store, pods: ResourceType) -> None:
        self.store, self.pods_type = store, pods
        self.containers: dict[str, dict[str, Container]] = {}  # pod uid -> container name
        self.config_seen: dict[str, str] = {}  # pod uid -> annotation at the engine's start
        self.launcher_restarts_on_config = True
        self.ready_after_restart: float | None = None
        self.bad_images: set[str] = set()
        self.crashing_images: set[str] = set()
        self.restarts: list[tuple[str, str, str]] = []  # (pod, container, why), in order
        self.pull_seconds = 0.2
        self.pulls: list[tuple[float, str, str]] = []  # (monotonic time, node, image)
        # (monotonic time, pod, "restart" | "ready"): when each pod's engine went down and
        # came back, for tests that check how many pods were unavailable at once
        self.timeline: list[tuple[float, str, str]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # ---------------------------------------------------------------- the pod's containers
    def _declared(self, pod: Obj) -> list[Obj]:
        spec = pod.get("spec") or {}
        sidecars = [c for c in spec.get("initContainers") or []
                    if c.get("restartPolicy") == "Always"]
        return [*sidecars, *(spec.get("containers") or [])]

    def _states(self, pod: Obj) -> dict[str, Container]:
        uid = pod["metadata"]["uid"]
        states = self.containers.setdefault(uid, {})
        for c in self._declared(pod):
            if c["name"] not in states:
                states[c["name"]] = Container(c["name"], str(c.get("image", "")), _container_id())
        self.config_seen.setdefault(uid, self._config(pod))
        return states

    @staticmethod
    def _config(pod: Obj) -> str:
        """What the launcher's watcher restarts the engine on: the configuration revision and
        kubectl's restart request (``hicache_umbp.launch.revision``)."""
        annotations = pod["metadata"].get("annotations") or {}
        config = str(annotations.get(CONFIG_ANNOTATION, ""))
        restart = annotations.get(RESTARTED_AT_ANNOTATION)
        return f"{config}@{restart}" if restart else config

    def _write(self, pod: Obj, base: Obj | None = None) -> Obj:
        states = self._states(pod)
        status = dict(base if base is not None else (pod.get("status") or {}))
        spec = pod.get("spec") or {}
        main = {c["name"] for c in spec.get("containers") or []}
        status["containerStatuses"] = [states[n].status() for n in states if n in main]
        sidecars = [states[n].status() for n in states if n not in main]
        if sidecars:
            status["initContainerStatuses"] = sidecars
        containers = all(states[n].ready for n in states)
        status["conditions"] = _conditions(pod, status.get("conditions") or [], containers)
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        return self.store.replace(self.pods_type, namespace, name, {**pod, "status": status},
                                  "status")

    def set_ready(self, namespace: str, name: str, status: Obj) -> Obj:
        """Every container running and ready (the probes pass), on top of ``status`` (the
        readiness gates' conditions the pod has are kept)."""
        pod = self.store.get(self.pods_type, namespace, name)
        gates = _gate_types(pod)
        kept = [c for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") in gates]
        status = {**status, "conditions": [*(status.get("conditions") or []), *kept]}
        for c in self._states(pod).values():
            if c.waiting is None:
                c.running, c.ready = True, True
                c.started_at = c.started_at or now_iso()
        self.timeline.append((time.monotonic(), name, "ready"))
        return self._write(pod, status)

    def _resync_ready(self, namespace: str, name: str) -> None:
        pod = self._pod(namespace, name)
        if pod is None:
            return
        status = dict(pod.get("status") or {})
        before = status.get("conditions") or []
        states = self.containers.get(pod["metadata"]["uid"])
        containers = all(c.ready for c in states.values()) if states else any(
            c.get("type") == "ContainersReady" and c.get("status") == "True" for c in before)
        after = _conditions(pod, before, containers)
        if after != before:
            self.store.replace(self.pods_type, namespace, name,
                               {**pod, "status": {**status, "conditions": after}}, "status")

    def forget(self, uid: str) -> None:
        self.containers.pop(uid, None)
        self.config_seen.pop(uid, None)

    # ---------------------------------------------------------------- reacting to changes
    def on_event(self, event: WatchEvent) -> None:
        if event.rtype.key != self.pods_type.key:
            return
        uid = event.object["metadata"]["uid"]
        if event.type == "DELETED":
            self.forget(uid)
            return
        if event.type == "ADDED" and _runs_once(event.object) and self._loop is not None:
            meta = event.object["metadata"]
            self._loop.call_later(self.pull_seconds, self._run_once, meta["namespace"],
                                  meta["name"], uid)
            return
        if uid not in self.containers or self._loop is None:
            return  # not started by the kubelet yet (tests move new pods explicitly)
        meta = event.object["metadata"]
        self._loop.call_soon(self._sync, meta["namespace"], meta["name"], uid)

    def _pod(self, namespace: str, name: str, uid: str | None = None) -> Obj | None:
        """The pod as stored now, None when it is gone or (``uid``) replaced by another."""
        try:
            pod = self.store.get(self.pods_type, namespace, name)
        except ApiError:
            return None
        return None if uid is not None and pod["metadata"]["uid"] != uid else pod

    def _sync(self, namespace: str, name: str, uid: str) -> None:
        pod = self._pod(namespace, name, uid)
        if pod is None:
            return
        states = self._states(pod)
        restarted = []
        for c in self._declared(pod):
            state = states[c["name"]]
            if str(c.get("image", "")) != state.image:
                self._restart(state, str(c.get("image", "")), "image changed")
                restarted.append((c["name"], "image changed"))
        config = self._config(pod)
        if config != self.config_seen.get(uid) and "engine" in states:
            self.config_seen[uid] = config
            if self.launcher_restarts_on_config and _runs_revisions(pod) and \
                    not any(n == "engine" for n, _ in restarted):
                engine = states["engine"]
                self._restart(engine, engine.image, "configuration revision changed")
                restarted.append(("engine", "configuration revision changed"))
        if not restarted:
            self._resync_ready(namespace, name)  # a gate's condition may have changed
            return
        for container, why in restarted:
            self.restarts.append((name, container, why))
        self.timeline.append((time.monotonic(), name, "restart"))
        self._write(pod)
        if self.ready_after_restart is not None and self._loop is not None:
            for container, _ in restarted:
                self._loop.call_later(self.ready_after_restart, self._probe_passes, namespace,
                                      name, uid, container, states[container].container_id)

    def _restart(self, state: Container, image: str, why: str) -> None:
        state.last_terminated = {"exitCode": 0, "reason": "Completed", "message": why,
                                 "finishedAt": now_iso(), "containerID": state.container_id}
        state.image, state.ready, state.running = image, False, False
        if image in self.bad_images:
            state.waiting = ("ErrImagePull", f'failed to pull image "{image}": not found')
            return
        state.waiting = None
        state.container_id = _container_id()
        state.restarts += 1
        state.running, state.started_at = True, now_iso()
        if image in self.crashing_images:
            state.running = False
            state.restarts += 1  # started, crashed, restarted, crashed again
            state.waiting = ("CrashLoopBackOff", f"back-off 10s restarting failed container="
                             f"{state.name}")

    def _run_once(self, namespace: str, name: str, uid: str) -> None:
        """Pull the pod's image on its node, then run it to completion (or fail the pull)."""
        pod = self._pod(namespace, name, uid)
        if pod is None:
            return
        [container] = pod["spec"]["containers"]
        image = str(container.get("image", ""))
        if image in self.bad_images:
            state: Obj = {"waiting": {"reason": "ErrImagePull",
                                      "message": f'failed to pull image "{image}": not found'}}
            status: Obj = {"phase": "Pending"}
        else:
            self.pulls.append((time.monotonic(), str(pod["spec"]["nodeName"]), image))
            state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
            status = {"phase": "Succeeded"}
        status["containerStatuses"] = [{"name": container["name"], "image": image,
                                        "ready": False, "restartCount": 0, "state": state}]
        self.store.replace(self.pods_type, namespace, name, {**pod, "status": status}, "status")

    def _probe_passes(self, namespace: str, name: str, uid: str, container: str,
                      container_id: str) -> None:
        pod = self._pod(namespace, name, uid)
        state = self.containers.get(uid, {}).get(container)
        if pod is None or state is None or \
                state.container_id != container_id or not state.running:
            return
        state.ready = True
        self.timeline.append((time.monotonic(), name, "ready"))
        self._write(pod)

    def snapshot(self, uid: str) -> dict[str, Container]:
        return copy.deepcopy(self.containers.get(uid, {}))
