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
        # A warning is posted when it appears or changes, not again with every new plan.
        posted = set((before.get("plan") or {}).get("warnings") or [])
        for warning in planned.warnings:
            if str(warning) not in posted:
                events.append(Event("Warning", "PlanWarning", str(warning)))
    events.extend(rollout_events(before.get("rollout"), after.get("rollout")))
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


def rollout_events(before: Mapping[str, Any] | None,
                   after: Mapping[str, Any] | None) -> list[Event]:
    """A rollout starting (or retargeted: another image, configuration or method), and done."""
    def key(r: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
        return None if r is None else (r.get("method"), r.get("image"), r.get("configHash"))

    if after is not None and key(before) != key(after):
        if after.get("method") == "Replace":
            return [Event("Normal", "ReplacingPods",
                          f"{after.get('pods')} pod(s) to replace, the StatefulSet's way: "
                          f"{after.get('reason')}")]
        return [Event("Normal", "RollingOutInPlace",
                      f"{after.get('pods')} pod(s) to update by restarting their engine "
                      f"container in place: {after.get('reason')}")]
    if after is None and before is not None:
        how = "replaced" if before.get("method") == "Replace" else "updated in place"
        return [Event("Normal", "RolledOut",
                      f"every pod runs the new template ({before.get('pods')} pod(s) {how}: "
                      f"image {before.get('image')}, configuration {before.get('configHash')})")]
    return []
