"""Fault injection: make chosen requests fail, stall, or cut their watch streams short.

A ``Fault`` matches requests by HTTP method, resource plural, object name and subresource (any
of them may be left open) and fires ``times`` times (``None``: until removed). When it fires:
``delay`` seconds pass first; then, if ``status`` is set, the request is answered with that error
(a Kubernetes ``Status`` body) without touching the store; else, for a watch, ``drop_after``
events are sent and the stream is closed by the server, and each event is held back
``event_delay`` seconds (a lagging watch: the client sees every change late).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

REASONS = {409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests",
           500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class Fault:
    method: str | None = None  # GET, POST, PUT, PATCH, DELETE; "WATCH" for watch streams
    plural: str | None = None
    name: str | None = None
    subresource: str | None = None  # "" means the main resource only
    status: int | None = None
    delay: float = 0.0
    drop_after: int | None = None  # watch streams only
    event_delay: float = 0.0  # watch streams only: each event arrives this late
    times: int | None = 1
    fired: int = field(default=0, init=False)

    def matches(self, method: str, plural: str | None, name: str | None,
                subresource: str | None) -> bool:
        return ((self.method is None or self.method.upper() == method)
                and (self.plural is None or self.plural == plural)
                and (self.name is None or self.name == name)
                and (self.subresource is None or self.subresource == (subresource or "")))

    @property
    def reason(self) -> str:
        return REASONS.get(self.status or 0, "InternalError")


class FaultPlan:
    """The active faults; thread-safe because tests add them from outside the server's loop."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, method: str, plural: str | None, name: str | None,
             subresource: str | None) -> Fault | None:
        """The first matching fault with firings left, consumed by one firing."""
        with self._lock:
            for fault in self._faults:
                if fault.times is not None and fault.fired >= fault.times:
                    continue
                if fault.matches(method, plural, name, subresource):
                    fault.fired += 1
                    return fault
        return None
