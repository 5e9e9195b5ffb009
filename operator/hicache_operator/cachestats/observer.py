"""Scrape each ready engine pod's SGLang ``/metrics`` on the resync timer; keep a short history.

Bounded work: at most ``maxPodsPerResync`` pods of one CR per resync (larger CRs rotate through
their pods), at most ``maxConcurrentScrapes`` requests in flight across all CRs, each limited to
``timeoutSeconds`` and 4 MiB. Per pod, the samples of the last ``windowSeconds`` are kept (a few
counters each); the window's figures are the increase from a pod's oldest kept sample to its
newest, summed over the CR's pods (``cachestats.sglang_metrics``). Pods that are gone, no longer
ready or were replaced (new uid) lose their history.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..api.config import CacheMetricsConfig
from .scrape import ScrapeError, fetch_pod, pod_url
from .sglang_metrics import CacheFigures, PodCounters, aggregate, increase

Key = tuple[str, str]
#: Told of every scrape: its result ("ok" or "error") and its seconds (the operator's metrics).
ScrapeListener = Callable[[str, float], None]


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass
class _PodHistory:
    uid: str
    samples: deque[tuple[float, PodCounters]] = field(default_factory=deque)


@dataclass(frozen=True)
class CacheObservation:
    figures: CacheFigures | None  # over the window; None when no pod was ever read
    read: int  # pods whose metrics were read this time
    failed: tuple[str, ...]  # pods whose metrics could not be read (names)
    window_seconds: int


class CacheObserver:
    def __init__(self, config: CacheMetricsConfig,
                 clock: Callable[[], float] = time.monotonic,
                 on_scrape: ScrapeListener | None = None) -> None:
        self.config, self.clock, self.on_scrape = config, clock, on_scrape
        self._history: dict[Key, dict[str, _PodHistory]] = {}
        self._cursor: dict[Key, int] = {}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    def _session_for_loop(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_concurrent_scrapes))
            self._slots = asyncio.Semaphore(self.config.max_concurrent_scrapes)
            self._loop = loop
        assert self._slots is not None
        return self._session, self._slots

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def forget(self, key: Key) -> None:
        self._history.pop(key, None)
        self._cursor.pop(key, None)

    def _targets(self, key: Key, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        ready = sorted((p for p in pods if _ready(p) and (p.get("status") or {}).get("podIP")),
                       key=lambda p: p["metadata"]["name"])
        limit = self.config.max_pods_per_resync
        if len(ready) <= limit:
            return ready
        start = self._cursor.get(key, 0) % len(ready)
        self._cursor[key] = start + limit
        return [ready[(start + i) % len(ready)] for i in range(limit)]

    async def _scrape(self, url: str) -> PodCounters:
        session, slots = self._session_for_loop()
        async with slots:
            started = time.perf_counter()
            result = "error"
            try:
                counters = await fetch_pod(session, url, self.config.timeout_seconds)
                result = "ok"
            finally:
                if self.on_scrape is not None:
                    self.on_scrape(result, time.perf_counter() - started)
            return counters

    async def observe(self, key: Key, pods: Sequence[Mapping[str, Any]],
                      port: int) -> CacheObservation:
        """Scrape (a bounded share of) ``pods`` of one CR and return the window's figures."""
        history = self._history.setdefault(key, {})
        live = {p["metadata"]["name"]: p for p in pods if _ready(p)}
        for name in [n for n, h in history.items()
                     if n not in live or live[n]["metadata"].get("uid") != h.uid]:
            del history[name]
        targets = self._targets(key, pods)
        urls = [pod_url(str(p["status"]["podIP"]), port) for p in targets]
        results = await asyncio.gather(*(self._scrape(u) for u in urls), return_exceptions=True)
        now = self.clock()
        horizon = now - self.config.window_seconds
        failed = []
        for pod, result in zip(targets, results, strict=True):
            name = pod["metadata"]["name"]
            if isinstance(result, ScrapeError):
                failed.append(name)
                continue
            if isinstance(result, BaseException):
                raise result
            entry = history.get(name)
            if entry is None:
                entry = history[name] = _PodHistory(str(pod["metadata"].get("uid", "")))
            entry.samples.append((now, result))
            while len(entry.samples) > 2 and entry.samples[1][0] <= horizon:
                entry.samples.popleft()  # keep one sample at or before the horizon as a base
        # A pod's first sample is its own base (no counter increase yet, but its gauges count).
        deltas = [increase(h.samples[-1][1], h.samples[0][1]) for h in history.values()]
        return CacheObservation(
            figures=aggregate(deltas) if deltas else None,
            read=len(targets) - len(failed),
            failed=tuple(sorted(failed)),
            window_seconds=self.config.window_seconds,
        )
