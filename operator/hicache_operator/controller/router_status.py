"""The router as the cluster and the router itself report it: ``status.router`` and its
Degraded reasons.

On the resync timer the operator asks one ready router pod for its own worker list
(``GET http://<router pod IP>:<port>/workers``, smg 1.13.0: ``{"workers": [{"url":
"http://<pod IP>:<port>", "is_healthy": true, ...}], "total": N}``), the same way it reads the
engines' ``/metrics`` (pod IPs, no pods/proxy). A worker is matched to an engine pod by its
pod IP. Between timer resyncs the last observation is kept, so the status does not flap.

Degraded reasons (``docs/operations.md``), after every pod-level failure:

- ``RouterUnavailable``: engine pods are ready but no router pod is (the CR's Service then
  has no endpoint if it already points at the router);
- ``RouterMissingPods``: ready engine pods, ready for longer than the router needs to check
  them (``graceSeconds``), are not among the router's healthy workers.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

Obj = dict[str, Any]
ROUTER_REASONS = ("RouterUnavailable", "RouterMissingPods")
MAX_BODY = 4 * 1024 * 1024
# smg 1.13.0 answers ``DELETE /workers/{id}`` at once, then drains the worker for its
# ``drain_settle_secs`` (5 s; no flag sets it for discovered workers) and removes whatever worker
# has that URL then. The worker drops out of ``GET /workers`` before that, so only the time
# says when the router has let go. One second more for the removal itself.
SMG_LETS_GO_S = 5.0 + 1.0


@dataclass(frozen=True)
class RouterObservation:
    """The router's own view: healthy worker IPs, or why it could not be read."""

    healthy_ips: frozenset[str] | None  # None: not read
    workers: int = 0  # registered workers (healthy or not)
    error: str = ""
    listed_ips: frozenset[str] = frozenset()  # every listed worker: ready, draining, unhealthy


def _ready_since(pod: Mapping[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return str(cond.get("lastTransitionTime") or "")
    return None


def _age_s(stamp: str, now: datetime.datetime) -> float:
    if not stamp:
        return float("inf")  # a kubelet always sets it; without one, the pod is not new
    try:
        then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except ValueError:
        return float("inf")
    return (now - then).total_seconds()


def parse_workers(payload: Any) -> RouterObservation:
    """smg's ``GET /workers`` answer -> healthy worker IPs."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("workers"), list):
        return RouterObservation(None, error="the router's /workers answer has no worker list")
    healthy: set[str] = set()
    listed: set[str] = set()
    for worker in payload["workers"]:
        if not isinstance(worker, Mapping):
            continue
        host = urlsplit(str(worker.get("url", ""))).hostname
        if host:
            listed.add(host)
        if host and worker.get("is_healthy") is True:
            healthy.add(host)
    return RouterObservation(frozenset(healthy), workers=len(payload["workers"]),
                             listed_ips=frozenset(listed))


async def read_workers(session: aiohttp.ClientSession, pod_ip: str, port: int,
                       timeout_s: float) -> RouterObservation:
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    try:
        async with session.get(f"http://{host}:{port}/workers",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                return RouterObservation(None, error=f"GET /workers answered {response.status}")
            body = await response.content.read(MAX_BODY)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return RouterObservation(None, error=f"GET /workers failed: {type(exc).__name__} {exc}")
    try:
        return parse_workers(json.loads(body))
    except ValueError:
        return RouterObservation(None, error="GET /workers answered no JSON")


async def remove_workers(session: aiohttp.ClientSession, router_ip: str, port: int,
                         pod_ips: frozenset[str], timeout_s: float) -> tuple[list[str], str]:
    """Take the workers at ``pod_ips`` out of one router (``DELETE /workers/{id}``, smg
    1.13.0: 202 and the worker is gone). Returns (the URLs removed, why not all could be)."""
    host = f"[{router_ip}]" if ":" in router_ip else router_ip
    base, limit = f"http://{host}:{port}", aiohttp.ClientTimeout(total=timeout_s)
    removed: list[str] = []
    try:
        async with session.get(f"{base}/workers", timeout=limit) as response:
            if response.status != 200:
                return removed, f"GET /workers answered {response.status}"
            payload = json.loads(await response.content.read(MAX_BODY))
        for worker in payload.get("workers") or []:
            url = str(worker.get("url", ""))
            if urlsplit(url).hostname not in pod_ips or not worker.get("id"):
                continue
            async with session.delete(f"{base}/workers/{worker['id']}",
                                      timeout=limit) as response:
                if response.status not in (200, 202, 204, 404):
                    return removed, f"DELETE /workers/{{id}} of {url} answered {response.status}"
            removed.append(url)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError) \
            as exc:
        return removed, f"{type(exc).__name__} {exc}"
    return removed, ""


def ready_router_ips(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The IPs of the ready router pods."""
    return [str(p["status"]["podIP"]) for p in pods
            if (p.get("status") or {}).get("podIP") and _ready_since(p) is not None]


def router_pod_ip(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The IP of the first ready router pod (by name), if any."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        ip = (pod.get("status") or {}).get("podIP")
        if ip and _ready_since(pod) is not None:
            return str(ip)
    return None


def router_block(*, deployment: Mapping[str, Any] | None, serving: bool,
                 engine_pods: Sequence[Mapping[str, Any]],
                 observation: RouterObservation | None, grace_s: float,
                 now: datetime.datetime | None = None) -> tuple[Obj, list[tuple[str, str]]]:
    """``status.router`` and the Degraded issues it implies: ``[(reason, message)]``."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    dep_status = (deployment or {}).get("status") or {}
    ready_router = int(dep_status.get("readyReplicas") or 0)
    block: Obj = {"replicas": int(dep_status.get("replicas") or 0),
                  "readyReplicas": ready_router, "serving": serving}
    ready = [(p, _ready_since(p)) for p in engine_pods]
    ready = [(p, since) for p, since in ready if since is not None]
    block["readyPods"] = len(ready)
    issues: list[tuple[str, str]] = []
    if ready and deployment is not None and not ready_router:
        issues.append(("RouterUnavailable",
                       f"{len(ready)} engine pod(s) ready but no router pod is"
                       + (": the Service has no endpoint" if serving else "")))
    if observation is not None and observation.healthy_ips is not None:
        healthy = observation.healthy_ips
        block["workers"] = sum(1 for p, _ in ready
                               if (p.get("status") or {}).get("podIP") in healthy)
        missing = sorted(
            str((p.get("metadata") or {}).get("name", "?")) for p, since in ready
            if (p.get("status") or {}).get("podIP") not in healthy
            and _age_s(since or "", now) > grace_s)
        block["missingPods"] = missing
        if missing:
            issues.append(("RouterMissingPods",
                           f"ready pod(s) {', '.join(missing)} are not among the router's "
                           f"healthy workers ({len(healthy)} healthy of {observation.workers})"))
    elif observation is not None and observation.error:
        block["message"] = observation.error
    return block, issues


def routed_pods(pods: Sequence[Mapping[str, Any]],
                observation: RouterObservation) -> set[str] | None:
    """The engine pods the router routes to now (matched by pod IP): an in-place rollout's
    serving check, so the next pod restarts only once the router sends to the restarted one.
    None: the router could not be read, so nobody knows which pods it routes to; the rollout
    waits (it must not take that for "none of them", which made every pod look unavailable
    anyway and restarted them all at once)."""
    if observation.healthy_ips is None:
        return None
    return {str(p["metadata"]["name"]) for p in pods
            if (p.get("status") or {}).get("podIP") in observation.healthy_ips}


def router_pod_selector(name: str) -> str:
    """The router pods' labels (``BuildInput.router_selector``)."""
    return f"app.kubernetes.io/name=sglang-hicache-router,app.kubernetes.io/instance={name}"


def router_serving(live: Mapping[tuple[str, str, str], Mapping[str, Any]], name: str) -> bool:
    """Whether the CR's Service may point at the router: it does already, or the router's
    Deployment has an available pod (so switching never leaves the Service without one)."""
    service = live.get(("v1", "Service", name)) or {}
    selector = (service.get("spec") or {}).get("selector") or {}
    if selector.get("app.kubernetes.io/name") == "sglang-hicache-router":
        return True
    deployment = live.get(("apps/v1", "Deployment", f"{name}-router")) or {}
    return int(((deployment.get("status") or {}).get("availableReplicas")) or 0) > 0


class RouterReader:
    """Reads each CR's router worker list on the resync timer and keeps the last answer."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self._clock = timeout_s, clock
        self._last: dict[tuple[str, str], RouterObservation] = {}
        self._drained: dict[tuple[str, str], dict[str, float]] = {}  # CR -> pod IP -> when
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_for_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._loop = loop
        return self._session

    async def observe(self, key: tuple[str, str], router_pods: Sequence[Mapping[str, Any]],
                      port: int) -> RouterObservation:
        ip = router_pod_ip(router_pods)
        if ip is None:
            observation = RouterObservation(None, error="no ready router pod to ask")
        else:
            observation = await read_workers(self._session_for_loop(), ip, port, self.timeout_s)
        self._last[key] = observation
        return observation

    async def drain(self, router_pods: Sequence[Mapping[str, Any]], port: int,
                    pod_ips: frozenset[str]) -> tuple[list[str], list[str]]:
        """Take the engine pods at ``pod_ips`` out of every ready router's worker list (each
        router replica keeps its own). smg keeps routing to a pod whose readiness gate made it
        not Ready (it drops a worker only when the pod is deleted or its health checks fail,
        and the engine is healthy), so a gate alone does not drain the router; the pod's next
        Ready event (the gate True again) registers it anew. Returns (removed, errors)."""
        removed: list[str] = []
        errors: list[str] = []
        for ip in ready_router_ips(router_pods):
            got, error = await remove_workers(self._session_for_loop(), ip, port, pod_ips,
                                              self.timeout_s)
            removed += got
            if error:
                errors.append(f"router pod {ip}: {error}")
        return removed, errors

    def note_drained(self, key: tuple[str, str], pod_ips: Iterable[str]) -> None:
        """The routers were just told to remove the workers at ``pod_ips``."""
        now = self._clock()
        self._drained.setdefault(key, {}).update(dict.fromkeys(pod_ips, now))

    def letting_go(self, key: tuple[str, str], pod_ips: frozenset[str]) -> frozenset[str]:
        """Of the out-of-rotation pods at ``pod_ips``, those a router may still remove later
        (:data:`SMG_LETS_GO_S` after their drain): an engine restarted before then comes back
        under the same URL and is removed with it. A pod this process has not seen drained
        (the operator restarted meanwhile) counts from now. Pods not asked about are
        forgotten."""
        now = self._clock()
        seen = self._drained.get(key, {})
        kept = {ip: seen.get(ip, now) for ip in pod_ips}
        self._drained[key] = kept
        return frozenset(ip for ip, since in kept.items() if now - since < SMG_LETS_GO_S)

    async def listed(self, router_pods: Sequence[Mapping[str, Any]],
                     port: int) -> frozenset[str] | str:
        """The engine pod IPs any ready router pod still lists, in any state (``ready``,
        ``draining``, unhealthy): one whose removal failed, or that the router took back. A
        string: which router could not be read."""
        listed: set[str] = set()
        for ip in ready_router_ips(router_pods):
            seen = await read_workers(self._session_for_loop(), ip, port, self.timeout_s)
            if seen.healthy_ips is None:
                return f"router pod {ip}: {seen.error}"
            listed |= seen.listed_ips
        return frozenset(listed)

    def last(self, key: tuple[str, str]) -> RouterObservation | None:
        return self._last.get(key)

    def forget(self, key: tuple[str, str]) -> None:
        self._last.pop(key, None)
        self._drained.pop(key, None)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
