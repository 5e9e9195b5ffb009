"""The writes of an in-place rollout, one pod at a time, and how a restarted engine failed.

Pure: each function turns a pod (as listed) into what the API should get: the readiness gate's
condition (``pods/status``), the engine's in-place update (``pods``), or a failure message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..builders.context import IN_PLACE_READY_GATE
from .rollout_pods import (
    ENGINE,
    IN_PLACE_ANNOTATION,
    REVISION_LABEL,
    engine_status,
    iso,
    label,
    meta,
    name_of,
    parse_time,
    pointer,
)
from .rollout_target import Target

Obj = dict[str, Any]
# Engine container states that mean the new engine does not come up by itself.
FAILED_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                            "ErrImageNeverPull", "CreateContainerConfigError",
                            "CreateContainerError", "RunContainerError"})
# The gate condition's reasons: why the operator holds the pod out of rotation, or lets it in.
GATE_DRAINING = "InPlaceUpdate"
GATE_READY = "EngineReady"


@dataclass(frozen=True)
class PodPatch:
    pod: str
    ops: list[Obj]  # RFC 6902, guarded by ``test`` ops
    message: str


@dataclass(frozen=True)
class GatePatch:
    """The readiness gate's condition of one pod (an RFC 6902 patch of ``pods/status``)."""

    pod: str
    ready: bool
    ops: list[Obj]
    message: str


def restarts_since(pod: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return int(engine_status(pod).get("restartCount") or 0) - int(state.get("restartCount") or 0)


def restarted(pod: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The engine container is not the one the update found (the kubelet made a new one)."""
    now_id = str(engine_status(pod).get("containerID") or "")
    return bool(now_id) and now_id != str(state.get("containerID") or "")


def failure(pod: Mapping[str, Any], state: Mapping[str, Any], now: float,
            restart_timeout_s: float) -> str | None:
    """Why the in-place update of ``pod`` failed (None: it is fine or still under way)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"the pod failed: {status.get('reason') or ''} {status.get('message') or ''}"
    engine = engine_status(pod)
    waiting = (engine.get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason in FAILED_WAITING or (reason == "CrashLoopBackOff"
                                    and restarts_since(pod, state) >= 2):
        return f"the new engine container is {reason}: {waiting.get('message') or reason}"
    if not restarted(pod, state) and (engine.get("state") or {}).get("running"):
        asked = parse_time(state.get("requestedAt"))
        if asked is not None and now - asked > restart_timeout_s:
            return (f"the engine container was not restarted within {restart_timeout_s:.0f} s "
                    "of the in-place update (the pod's grace period and the time to start a "
                    "container; a new configuration restarts it only when the image runs the "
                    "hicache launcher, python -m hicache_umbp.launch)")
    return None


def engine_patch(pod: Mapping[str, Any], target: Target, revision: str, now: float) -> PodPatch:
    """The in-place update: engine image, template labels and annotations, the revision label
    and the progress annotation, guarded by ``test`` ops (the pod's uid, its old revision)."""
    m = meta(pod)
    containers = (pod.get("spec") or {}).get("containers") or []
    index = next(i for i, c in enumerate(containers) if c.get("name") == ENGINE)
    engine = engine_status(pod)
    state = {"revision": revision, "image": target.image, "configHash": target.config_hash,
             "containerID": str(engine.get("containerID") or ""),
             "restartCount": int(engine.get("restartCount") or 0), "requestedAt": iso(now)}
    ops: list[Obj] = [
        {"op": "test", "path": "/metadata/uid", "value": m.get("uid")},
        {"op": "test", "path": f"/spec/containers/{index}/name", "value": ENGINE},
    ]
    old_revision = label(pod, REVISION_LABEL)
    if m.get("labels") is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    elif old_revision:  # the StatefulSet controller has not moved the pod meanwhile
        ops.append({"op": "test", "path": f"/metadata/labels/{pointer(REVISION_LABEL)}",
                    "value": old_revision})
    if not m.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({"op": "replace", "path": f"/spec/containers/{index}/image", "value": target.image})
    template_meta = target.template.get("metadata") or {}
    for key, value in sorted((template_meta.get("labels") or {}).items()):
        ops.append({"op": "add", "path": f"/metadata/labels/{pointer(key)}", "value": value})
    ops.append({"op": "add", "path": f"/metadata/labels/{pointer(REVISION_LABEL)}",
                "value": revision})
    annotations = {**(template_meta.get("annotations") or {}),
                   IN_PLACE_ANNOTATION: json.dumps(state, sort_keys=True)}
    for key, value in sorted(annotations.items()):
        ops.append({"op": "add", "path": f"/metadata/annotations/{pointer(key)}",
                    "value": value})
    name = name_of(pod)
    message = (f"pod {name}: restarting the engine container in place (revision {revision}: "
               f"image {target.image}, configuration {target.config_hash})")
    return PodPatch(name, ops, message)


def gate_patch(pod: Mapping[str, Any], ready: bool, now: float, why: str) -> GatePatch:
    """Set the readiness gate's condition: ``add`` it, or ``replace`` it at its index with a
    ``test`` of the index's type (the kubelet rewrites other conditions meanwhile)."""
    m = meta(pod)
    conditions = list((pod.get("status") or {}).get("conditions") or [])
    value = {"type": IN_PLACE_READY_GATE, "status": "True" if ready else "False",
             "reason": GATE_READY if ready else GATE_DRAINING, "message": why,
             "lastTransitionTime": iso(now)}
    ops: list[Obj] = [{"op": "test", "path": "/metadata/uid", "value": m.get("uid")}]
    index = next((i for i, c in enumerate(conditions)
                  if c.get("type") == IN_PLACE_READY_GATE), None)
    if index is not None:
        ops += [{"op": "test", "path": f"/status/conditions/{index}/type",
                 "value": IN_PLACE_READY_GATE},
                {"op": "replace", "path": f"/status/conditions/{index}", "value": value}]
    elif conditions:
        ops.append({"op": "add", "path": "/status/conditions/-", "value": value})
    else:  # no conditions yet: "add" would replace a list the kubelet writes meanwhile
        ops.append({"op": "test", "path": "/metadata/resourceVersion",
                    "value": m.get("resourceVersion")})
        if not pod.get("status"):
            ops.append({"op": "add", "path": "/status", "value": {}})
        ops.append({"op": "add", "path": "/status/conditions", "value": [value]})
    return GatePatch(name_of(pod), ready, ops, f"pod {name_of(pod)}: {why}")
