"""Reading the pods of an in-place rollout: ordinals, the engine container, the rollout's own
marks on a pod (the ``in-place-update`` annotation, the readiness gate's condition).

Pure helpers for ``rollout``; nothing here decides anything.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from typing import Any

from ..builders.context import IN_PLACE_READY_GATE

Obj = dict[str, Any]
REVISION_LABEL = "controller-revision-hash"
IN_PLACE_ANNOTATION = "hicache.sglang.ai/in-place-update"
ENGINE = "engine"
_ORDINAL = re.compile(r"-(\d+)$")


def ordinal(pod: Mapping[str, Any], sts_name: str) -> int | None:
    name = str((pod.get("metadata") or {}).get("name", ""))
    match = _ORDINAL.search(name)
    if not name.startswith(f"{sts_name}-") or match is None or \
            name != f"{sts_name}-{match.group(1)}":
        return None
    return int(match.group(1))


def engine_image(pod_spec: Mapping[str, Any]) -> str:
    for c in pod_spec.get("containers") or []:
        if c.get("name") == ENGINE:
            return str(c.get("image", ""))
    return ""


def meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def name_of(pod: Mapping[str, Any]) -> str:
    return str(meta(pod).get("name", ""))


def annotation(pod: Mapping[str, Any], key: str) -> str:
    return str((meta(pod).get("annotations") or {}).get(key, ""))


def label(pod: Mapping[str, Any], key: str) -> str:
    return str((meta(pod).get("labels") or {}).get(key, ""))


def engine_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == ENGINE:
            return dict(c)
    return {}


def in_place_state(pod: Mapping[str, Any]) -> Obj:
    raw = annotation(pod, IN_PLACE_ANNOTATION)
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return (condition(pod, "Ready") or {}).get("status") == "True"


def containers_ready(pod: Mapping[str, Any]) -> bool:
    """Every container passes its readiness probe (the kubelet's ``ContainersReady``): what
    Ready would be without readiness gates."""
    return (condition(pod, "ContainersReady") or {}).get("status") == "True"


def has_gate(pod: Mapping[str, Any]) -> bool:
    """The pod's spec lists the operator's readiness gate (pods of an InPlaceIfPossible
    template); only such pods wait for it, so only their condition is written."""
    gates = (pod.get("spec") or {}).get("readinessGates") or []
    return any(g.get("conditionType") == IN_PLACE_READY_GATE for g in gates)


def gate(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return condition(pod, IN_PLACE_READY_GATE)


def parse_time(value: Any) -> float | None:
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def iso(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
