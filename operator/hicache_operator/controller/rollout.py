"""Rollouts under ``updateStrategy: InPlaceIfPossible``: restart engine containers in place.

Pure: inputs are the desired StatefulSet (from the plan), the live one, the CR's pods and what
the controller knows about them (which are serving); the output is a :class:`Decision`: the
``updateStrategy`` to render, the ConfigMap revisions to keep, the pod patches to send now and
the ``status.rollout`` block. The reconcile sends the patches (``reconcile.py``); nothing here
talks to the API.

How it works with the StatefulSet controller (whose bookkeeping stays true throughout):

- the StatefulSet is rendered ``RollingUpdate`` with ``partition: replicas``: its controller
  takes the new template as ``updateRevision`` but touches no pod;
- a pod made from a template that differs from the desired one only in the engine image and the
  configuration revision (equal ``pod-hash`` annotations) is updated in place with one JSON
  patch: the engine image (the kubelet restarts that container), the ``config-hash`` annotation
  (the launcher's watcher restarts the engine on it; ``hicache_umbp.launch.revision``), the
  template's labels and annotations, the ``controller-revision-hash`` label set to the
  ``updateRevision`` (so the controller counts the pod as updated, never deletes it, and moves
  ``currentRevision`` once every pod is updated and ready), and an ``in-place-update``
  annotation recording the old engine container, so progress survives an operator restart;
- at most ``maxUnavailable`` pods are unavailable at a time, highest ordinal first, only
  ordinals >= ``partition``; a pod is done when its engine container is a new one and the pod
  is serving (Ready, and whatever :class:`ServingCheck` the controller adds, e.g. a router's
  worker set);
- a pod whose new engine fails (image pull, crash loop, pod failed, or still the old container
  ``restartTimeoutSeconds`` after the update) stops the rollout: ``Degraded``
  ``InPlaceUpdateFailed`` names it; no other pod is touched until it recovers or the spec
  changes;
- any other difference (resources, volumes, sidecars and their image, probes, ...) cannot be
  done in place: the partition drops to the user's and the StatefulSet replaces the pods
  (``method: Replace``), and ``status.rollout.reason`` lists what differs.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..builders.context import CONFIG_HASH_ANNOTATION, POD_HASH_ANNOTATION
from . import diff

Obj = dict[str, Any]
REVISION_LABEL = "controller-revision-hash"
IN_PLACE_ANNOTATION = "hicache.sglang.ai/in-place-update"
ENGINE = "engine"
# Engine container states that mean the new engine does not come up by itself.
FAILED_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                            "ErrImageNeverPull", "CreateContainerConfigError",
                            "CreateContainerError", "RunContainerError"})
_ORDINAL = re.compile(r"-(\d+)$")
# Fields named in a Replace reason, at most (the rest are counted).
_MAX_LISTED = 6


@dataclass(frozen=True)
class Target:
    """What the plan wants, read from the desired StatefulSet."""

    name: str
    template: Mapping[str, Any]
    replicas: int
    partition: int
    max_unavailable: int
    replace_strategy: Mapping[str, Any]  # what the StatefulSet runs when pods are replaced

    @property
    def annotations(self) -> Mapping[str, str]:
        return (self.template.get("metadata") or {}).get("annotations") or {}

    @property
    def image(self) -> str:
        return engine_image(self.template.get("spec") or {})

    @property
    def config_hash(self) -> str:
        return str(self.annotations.get(CONFIG_HASH_ANNOTATION, ""))

    @property
    def pod_hash(self) -> str:
        return str(self.annotations.get(POD_HASH_ANNOTATION, ""))

    @property
    def held(self) -> Obj:
        return {"type": "RollingUpdate", "rollingUpdate": {"partition": self.replicas}}


@dataclass(frozen=True)
class PodPatch:
    pod: str
    ops: list[Obj]  # RFC 6902, guarded by ``test`` ops
    message: str


@dataclass(frozen=True)
class Failure:
    pod: str
    message: str


@dataclass(frozen=True)
class Decision:
    update_strategy: Obj  # rendered into the StatefulSet
    keep_configs: frozenset[str]  # configuration revisions the ConfigMap keeps besides ours
    patches: tuple[PodPatch, ...] = ()
    status: Obj | None = None  # status.rollout (None: nothing to roll)
    failure: Failure | None = None

    @property
    def progressing(self) -> tuple[str, str] | None:
        """(Progressing reason, message) while a rollout runs."""
        if self.status is None or self.failure is not None:
            return None
        s = self.status
        done = f"{s['updatedPods']}/{s['pods']} pod(s) on the new template"
        if s["method"] == "Replace":
            return "ReplacingPods", f"{done}; the StatefulSet replaces pods: {s['reason']}"
        restarting = f"; restarting: {', '.join(s['restarting'])}" if s.get("restarting") else ""
        return "RollingOutInPlace", f"{done}{restarting}; engine restarts in place: {s['reason']}"


# ---------------------------------------------------------------------------- reading pods
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


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _annotation(pod: Mapping[str, Any], key: str) -> str:
    return str((_meta(pod).get("annotations") or {}).get(key, ""))


def _label(pod: Mapping[str, Any], key: str) -> str:
    return str((_meta(pod).get("labels") or {}).get(key, ""))


def _engine_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == ENGINE:
            return dict(c)
    return {}


def in_place_state(pod: Mapping[str, Any]) -> Obj:
    raw = _annotation(pod, IN_PLACE_ANNOTATION)
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _parse_time(value: Any) -> float | None:
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _iso(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# ---------------------------------------------------------------------------- the target
def scaled(value: int | str | None, replicas: int) -> int:
    """maxUnavailable as the StatefulSet controller resolves it: a number, or a percentage of
    replicas rounded down; at least 1."""
    if value is None:
        return 1
    if isinstance(value, str) and value.endswith("%"):
        return max(1, int(replicas * int(value[:-1]) / 100))
    return max(1, int(value))


def target_of(sts: Mapping[str, Any], partition: int, max_unavailable: int | str | None) -> Target:
    spec = sts.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    rolling: Obj = {}
    if partition:
        rolling["partition"] = partition
    if max_unavailable is not None:
        rolling["maxUnavailable"] = max_unavailable
    replace: Obj = {"type": "RollingUpdate", **({"rollingUpdate": rolling} if rolling else {})}
    return Target(name=str((sts.get("metadata") or {}).get("name", "")),
                  template=spec.get("template") or {}, replicas=replicas, partition=partition,
                  max_unavailable=scaled(max_unavailable, replicas), replace_strategy=replace)


# ---------------------------------------------------------------------------- why
def _by_name(items: Any) -> dict[str, Any] | None:
    if isinstance(items, list) and all(isinstance(i, Mapping) and "name" in i for i in items):
        return {str(i["name"]): i for i in items}
    return None


def template_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The pod-template fields that differ between ``old`` and ``new`` and cannot change in
    place (the engine image and the configuration revision can), as readable paths."""
    out: list[str] = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for key in sorted(set(old_spec) | set(new_spec)):
        a, b = old_spec.get(key), new_spec.get(key)
        named_a, named_b = _by_name(a), _by_name(b)
        if named_a is not None and named_b is not None:
            for name in sorted(set(named_a) | set(named_b)):
                ca, cb = dict(named_a.get(name) or {}), dict(named_b.get(name) or {})
                if key == "containers" and name == ENGINE:
                    ca.pop("image", None)
                    cb.pop("image", None)
                if name not in named_a or name not in named_b:
                    out.append(f"{key}[{name}] {'added' if name in named_b else 'removed'}")
                    continue
                fields = sorted(f for f in set(ca) | set(cb) if ca.get(f) != cb.get(f))
                out += [f"{key}[{name}].{f}" for f in fields]
        elif a != b:
            out.append(key)
    return out


def _why_replace(target: Target, live_template: Mapping[str, Any] | None,
                 pods: Sequence[Mapping[str, Any]], previous: Mapping[str, Any] | None) -> str:
    if live_template is not None and not diff.covers(live_template, target.template):
        changed = template_changes(live_template, target.template)
        if changed:
            more = len(changed) - _MAX_LISTED
            listed = ", ".join(changed[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")
            return f"the pod template changes beyond the engine container ({listed})"
    prev = previous or {}
    if prev.get("method") == "Replace" and prev.get("image") == target.image and \
            prev.get("configHash") == target.config_hash and prev.get("reason"):
        return str(prev["reason"])
    bare = sorted(_meta(p).get("name", "") for p in pods if not _annotation(p, POD_HASH_ANNOTATION))
    if bare:
        return (f"pod(s) {', '.join(bare)} predate updateStrategy InPlaceIfPossible (no "
                f"{POD_HASH_ANNOTATION} annotation): they are replaced once")
    return "the pods were made from a template that differs beyond the engine container"


def _what_changes(target: Target, pods: Sequence[Mapping[str, Any]]) -> str:
    images = sorted({engine_image(p.get("spec") or {}) for p in pods} - {target.image})
    configs = sorted({_annotation(p, CONFIG_HASH_ANNOTATION) for p in pods}
                     - {target.config_hash})
    parts = []
    if images:
        parts.append(f"engine image {', '.join(images)} -> {target.image}")
    if configs:
        parts.append(f"engine configuration {', '.join(configs)} -> {target.config_hash}")
    return "; ".join(parts) or "pod labels and annotations"


# ---------------------------------------------------------------------------- in-place state
def _restarts_since(pod: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return int(_engine_status(pod).get("restartCount") or 0) - int(state.get("restartCount") or 0)


def _restarted(pod: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
    """The engine container is not the one the update found (the kubelet made a new one)."""
    now_id = str(_engine_status(pod).get("containerID") or "")
    return bool(now_id) and now_id != str(state.get("containerID") or "")


def _failure(pod: Mapping[str, Any], state: Mapping[str, Any], now: float,
             restart_timeout_s: float) -> str | None:
    """Why the in-place update of ``pod`` failed (None: it is fine or still under way)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"the pod failed: {status.get('reason') or ''} {status.get('message') or ''}"
    engine = _engine_status(pod)
    waiting = (engine.get("state") or {}).get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason in FAILED_WAITING or (reason == "CrashLoopBackOff"
                                    and _restarts_since(pod, state) >= 2):
        return f"the new engine container is {reason}: {waiting.get('message') or reason}"
    if not _restarted(pod, state) and (engine.get("state") or {}).get("running"):
        asked = _parse_time(state.get("requestedAt"))
        if asked is not None and now - asked > restart_timeout_s:
            return (f"the engine container was not restarted within {restart_timeout_s:.0f} s "
                    "of the in-place update (a new configuration restarts it only when the "
                    "image runs the hicache launcher, python -m hicache_umbp.launch)")
    return None


def _patch(pod: Mapping[str, Any], target: Target, revision: str, now: float) -> PodPatch:
    meta = _meta(pod)
    containers = (pod.get("spec") or {}).get("containers") or []
    index = next(i for i, c in enumerate(containers) if c.get("name") == ENGINE)
    engine = _engine_status(pod)
    state = {"revision": revision, "image": target.image, "configHash": target.config_hash,
             "containerID": str(engine.get("containerID") or ""),
             "restartCount": int(engine.get("restartCount") or 0), "requestedAt": _iso(now)}
    ops: list[Obj] = [
        {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
        {"op": "test", "path": f"/spec/containers/{index}/name", "value": ENGINE},
    ]
    old_revision = _label(pod, REVISION_LABEL)
    if meta.get("labels") is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    elif old_revision:  # the StatefulSet controller has not moved the pod meanwhile
        ops.append({"op": "test", "path": f"/metadata/labels/{_pointer(REVISION_LABEL)}",
                    "value": old_revision})
    if not meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({"op": "replace", "path": f"/spec/containers/{index}/image", "value": target.image})
    template_meta = target.template.get("metadata") or {}
    for key, value in sorted((template_meta.get("labels") or {}).items()):
        ops.append({"op": "add", "path": f"/metadata/labels/{_pointer(key)}", "value": value})
    ops.append({"op": "add", "path": f"/metadata/labels/{_pointer(REVISION_LABEL)}",
                "value": revision})
    annotations = {**(template_meta.get("annotations") or {}),
                   IN_PLACE_ANNOTATION: json.dumps(state, sort_keys=True)}
    for key, value in sorted(annotations.items()):
        ops.append({"op": "add", "path": f"/metadata/annotations/{_pointer(key)}",
                    "value": value})
    name = str(meta.get("name", ""))
    message = (f"pod {name}: restarting the engine container in place (revision {revision}: "
               f"image {target.image}, configuration {target.config_hash})")
    return PodPatch(name, ops, message)


# ---------------------------------------------------------------------------- the decision
def _up_to_date(pod: Mapping[str, Any], target: Target, revision: str | None) -> bool:
    if revision is not None:
        return _label(pod, REVISION_LABEL) == revision
    return (engine_image(pod.get("spec") or {}) == target.image
            and _annotation(pod, CONFIG_HASH_ANNOTATION) == target.config_hash
            and _annotation(pod, POD_HASH_ANNOTATION) == target.pod_hash)


def decide(target: Target, live_sts: Mapping[str, Any] | None,
           pods: Sequence[Mapping[str, Any]], *, serving: Callable[[Mapping[str, Any]], bool],
           live_configs: frozenset[str], previous: Mapping[str, Any] | None, now: float,
           restart_timeout_s: float) -> Decision:
    """What to do now for one CR's pods (see the module docstring)."""
    owned = {o: p for p in pods if (o := ordinal(p, target.name)) is not None}
    referenced = frozenset(_annotation(p, CONFIG_HASH_ANNOTATION) for p in owned.values()) - {
        "", target.config_hash}
    if live_sts is None:
        return Decision(target.held, referenced)
    live_spec = live_sts.get("spec") or {}
    live_template = live_spec.get("template") or {}
    applied = diff.covers(live_template, target.template)
    sts_status = live_sts.get("status") or {}
    seen = applied and int(sts_status.get("observedGeneration") or 0) >= int(
        _meta(live_sts).get("generation") or 1)
    revision = (str(sts_status.get("updateRevision") or "") or None) if seen else None
    complete = seen and revision is not None and sts_status.get("currentRevision") == revision
    # Until the StatefulSet controller has moved every pod's revision, a pod it (re)creates
    # from its currentRevision may need any configuration the ConfigMap has held.
    keep = referenced if complete else referenced | (live_configs - {target.config_hash})
    in_scope = [owned[o] for o in sorted(owned) if target.partition <= o < target.replicas]
    outdated = [p for p in in_scope if not _up_to_date(p, target, revision)]
    in_flight = [p for p in in_scope if revision is not None and p not in outdated
                 and in_place_state(p).get("revision") == revision
                 and not (_restarted(p, in_place_state(p)) and serving(p))]
    if not outdated and not in_flight:
        return Decision(target.held, keep)
    status: Obj = {"image": target.image, "configHash": target.config_hash,
                   "updatedPods": len(in_scope) - len(outdated), "pods": len(in_scope)}
    if revision is not None:
        status["revision"] = revision
    if any(_annotation(p, POD_HASH_ANNOTATION) != target.pod_hash for p in outdated):
        status.update(method="Replace",
                      reason=_why_replace(target, live_template, outdated, previous))
        return Decision(dict(target.replace_strategy), keep, status=status)
    prev = previous or {}
    same = prev.get("method") == "InPlace" and prev.get("image") == target.image and \
        prev.get("configHash") == target.config_hash
    status.update(method="InPlace", reason=_what_changes(target, outdated) if outdated else
                  str(prev.get("reason") if same else "") or "engine restarts in place")
    if revision is None:  # the StatefulSet controller has not named the new revision yet
        return Decision(target.held, keep, status=status)
    failure = None
    for pod in in_flight:
        why = _failure(pod, in_place_state(pod), now, restart_timeout_s)
        if why is not None:
            failure = Failure(str(_meta(pod).get("name")), why)
            break
    patches: list[PodPatch] = []
    if failure is None:
        unavailable = {str(_meta(p).get("name")) for p in owned.values() if not serving(p)}
        unavailable |= {str(_meta(p).get("name")) for p in in_flight}
        for pod in sorted(outdated, key=lambda p: -(ordinal(p, target.name) or 0)):
            name = str(_meta(pod).get("name"))
            if name not in unavailable and len(unavailable) >= target.max_unavailable:
                continue  # over budget; a pod that is unavailable anyway may still go
            patches.append(_patch(pod, target, revision, now))
            unavailable.add(name)
    restarting = sorted({str(_meta(p).get("name")) for p in in_flight} | {p.pod for p in patches})
    status["restarting"] = restarting
    status["updatedPods"] += len(patches)  # the patch moves each to the new revision
    if failure is not None:
        status.update(failedPod=failure.pod, failure=failure.message)
    return Decision(target.held, keep, tuple(patches), status, failure)
