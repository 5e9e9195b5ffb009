"""Events for what changed between two statuses, so an unchanged world posts nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .status import condition


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def transition_events(before: Mapping[str, Any], after: Mapping[str, Any],
                      planned: Any) -> list[Event]:
    """Events for the transitions from ``before`` to ``after`` (no event storms)."""
    events: list[Event] = []
    old_spec, new_spec = condition(before, "SpecValid"), condition(after, "SpecValid")
    if new_spec.get("status") == "False" and old_spec.get("message") != new_spec.get("message"):
        events.append(Event("Warning", str(new_spec.get("reason") or "InvalidSpec"),
                            str(new_spec.get("message"))))
    if planned is not None and before.get("plan") != after.get("plan"):
        from ..plan import render_summary

        events.append(Event("Normal", "Sized", render_summary(planned)[:1000]))
        for warning in planned.warnings:
            events.append(Event("Warning", "PlanWarning", str(warning)))
    old_deg, new_deg = condition(before, "Degraded"), condition(after, "Degraded")
    if new_deg.get("status") == "True" and (old_deg.get("status"), old_deg.get("reason")) != (
            "True", new_deg.get("reason")):
        events.append(Event("Warning", str(new_deg.get("reason")), str(new_deg.get("message"))))
    old_ready, new_ready = condition(before, "Ready"), condition(after, "Ready")
    if new_ready.get("status") == "True" and old_ready.get("status") != "True":
        events.append(Event("Normal", "Ready", str(new_ready.get("message"))))
    old_l3 = (before.get("cache") or {}).get("l3Writes")
    new_l3 = (after.get("cache") or {}).get("l3Writes")
    if new_l3 == "Failing" and old_l3 != "Failing":
        events.append(Event("Warning", "StorageWritesFailing",
                            "L3 (UMBP) stored fewer than half of the pages SGLang wrote to the "
                            "host tier over the last window (or dropped backups): look for "
                            "'Write page to storage' in the engine logs, and at the L3 "
                            "capacity, the SSD volume and the UMBP sidecars"))
    elif new_l3 == "Ok" and old_l3 == "Failing":
        events.append(Event("Normal", "StorageWritesRecovered",
                            "L3 (UMBP) stores the pages SGLang backs up again"))
    return events
