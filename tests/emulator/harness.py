"""Run the emulator on a loopback port in a background thread and drive it synchronously.

Tests and benchmarks run the operator in other threads (``kopf.testing.KopfRunner``) or
processes (``python -m hicache_operator run``); the emulator keeps its own event loop here.
Every store call from the test thread is executed on the emulator's loop, so it is atomic with
respect to the requests being served.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from .deployments import DeploymentSimulator
from .faults import Fault
from .server import KubeEmulator, RequestRecord
from .store import Obj, ResourceType, Store
from .workloads import WorkloadSimulator

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_CRD = REPO_ROOT / "charts" / "sglang-hicache-operator" / "crds" / "sglanghicaches.yaml"


class EmulatorThread:
    """A started emulator: ``url``, ``write_kubeconfig()``, and thread-safe object operations."""

    def __init__(self, *, crds: Sequence[Obj | str] = (), simulate_workloads: bool = True,
                 bookmark_interval: float = 1.0, host: str = "127.0.0.1") -> None:
        """``host``: the address to listen on (a pod network's bridge address, so processes
        in pod network namespaces reach the API as pods reach a cluster's)."""
        self.host = host
        self.emulator = KubeEmulator(bookmark_interval=bookmark_interval)
        for crd in crds:
            self.emulator.load_crd(crd)
        self.simulator = WorkloadSimulator(self.emulator.store) if simulate_workloads else None
        self.deployments = (DeploymentSimulator(self.emulator.store) if simulate_workloads
                            else None)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._url = ""
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the emulator did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per request
        self._stop = asyncio.Event()
        if self.simulator is not None:
            self.simulator.attach(asyncio.get_running_loop())
        if self.deployments is not None:
            self.deployments.attach(asyncio.get_running_loop())
        async with self.emulator, kmock.Server(self.emulator, host=self.host) as server:
            self._url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
            self.emulator.store.drop_watches()
            await asyncio.sleep(0.05)

    @property
    def url(self) -> str:
        return self._url

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "operator", "user": {"token": "emulator-token"}}],
            "contexts": [{"name": "emulator", "context": {
                "cluster": "emulator", "user": "operator", "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ---------------------------------------------------------------- thread-safe access
    def call(self, fn: Callable[[Store], T]) -> T:
        """Run ``fn(store)`` on the emulator's loop and return its result (or raise)."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn(self.emulator.store))
            except BaseException as exc:  # re-raised in the caller's thread
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(30)

    def rtype(self, api_version: str, plural: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        return self.emulator.store.find_type(group, version, plural)

    def create(self, api_version: str, plural: str, body: Obj, namespace: str | None = None) -> Obj:
        rt = self.rtype(api_version, plural)
        return self.call(lambda s: s.create(rt, namespace or body["metadata"].get("namespace"),
                                            body))

    def create_unvalidated(self, api_version: str, plural: str, body: Obj,
                           namespace: str | None = None) -> Obj:
        """Create without schema/CEL validation: an object stored under an older, more
        permissive CRD (an API server never re-validates stored objects when a CRD changes)."""
        rt = self.rtype(api_version, plural)
        lax = dataclasses.replace(rt, validator=None)

        def create(store: Store) -> Obj:
            store.types[(rt.group, rt.version, rt.plural)] = lax
            validate, store.validate_builtins = store.validate_builtins, False
            try:
                return store.create(lax, namespace or body["metadata"].get("namespace"), body)
            finally:
                store.types[(rt.group, rt.version, rt.plural)] = rt
                store.validate_builtins = validate
        return self.call(create)

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj:
        rt = self.rtype(api_version, plural)
        return self.call(lambda s: s.get(rt, namespace, name))

    def find(self, api_version: str, plural: str, namespace: str | None,
             name: str) -> Obj | None:
        rt = self.rtype(api_version, plural)
        key = (rt.group, rt.plural, namespace if rt.namespaced else None, name)
        return self.call(lambda s: s.objects.get(key))

    def list(self, api_version: str, plural: str, namespace: str | None = None,
             label_selector: str = "") -> list[Obj]:
        rt = self.rtype(api_version, plural)
        return self.call(lambda s: s.list(rt, namespace, label_selector))

    def patch(self, api_version: str, plural: str, namespace: str | None, name: str,
              patch: Any, *, subresource: str | None = None,
              content_type: str = "application/merge-patch+json") -> Obj:
        rt = self.rtype(api_version, plural)
        return self.call(lambda s: s.patch(rt, namespace, name, content_type, patch,
                                           subresource))

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj:
        rt = self.rtype(api_version, plural)
        return self.call(lambda s: s.delete(rt, namespace, name))

    def add_fault(self, fault: Fault) -> Fault:
        return self.emulator.faults.add(fault)

    def drop_watches(self) -> int:
        return self.call(lambda s: s.drop_watches())

    def requests(self) -> builtins.list[RequestRecord]:
        return self.call(lambda _: list(self.emulator.log))

    def writes(self, *, exclude: tuple[str, ...] = ()) -> builtins.list[RequestRecord]:
        return self.call(lambda _: self.emulator.writes(exclude=exclude))

    def wait_for(self, predicate: Callable[[], T], *, timeout: float = 30.0,
                 what: str = "condition") -> T:
        """Poll ``predicate`` until it returns a truthy value; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        last: T = predicate()
        while not last:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)
            last = predicate()
        return last
