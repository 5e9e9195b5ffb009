"""What an in-place rollout rolls out (:class:`Target`, read from the desired StatefulSet) and
how it explains itself: the fields that force a replacement, what changes in place.

Pure helpers for ``rollout``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..builders.context import CONFIG_HASH_ANNOTATION, POD_HASH_ANNOTATION, RESTARTED_AT_ANNOTATION
from . import diff
from .rollout_pods import ENGINE, annotation, engine_image, meta

Obj = dict[str, Any]
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
    def restarted_at(self) -> str:
        return str(self.annotations.get(RESTARTED_AT_ANNOTATION, ""))

    @property
    def grace_seconds(self) -> int:
        """The pod's terminationGracePeriodSeconds (Kubernetes' default 30 when unset)."""
        spec = self.template.get("spec") or {}
        return int(spec.get("terminationGracePeriodSeconds", 30))

    @property
    def held(self) -> Obj:
        """The StatefulSet's strategy between rollouts: its controller replaces no pod."""
        return {"type": "RollingUpdate", "rollingUpdate": {"partition": self.replicas}}

    @property
    def settling(self) -> Obj:
        """Every pod the rollout may touch is on the new revision: the user's partition lets the
        StatefulSet controller move ``currentRevision`` (nothing is left for it to replace)."""
        if self.partition:
            return {"type": "RollingUpdate", "rollingUpdate": {"partition": self.partition}}
        return {"type": "RollingUpdate"}


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


def why_replace(target: Target, live_template: Mapping[str, Any] | None,
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
    bare = sorted(meta(p).get("name", "") for p in pods if not annotation(p, POD_HASH_ANNOTATION))
    if bare:
        return (f"pod(s) {', '.join(bare)} predate updateStrategy InPlaceIfPossible (no "
                f"{POD_HASH_ANNOTATION} annotation): they are replaced once")
    return "the pods were made from a template that differs beyond the engine container"


def what_changes(target: Target, pods: Sequence[Mapping[str, Any]]) -> str:
    images = sorted({engine_image(p.get("spec") or {}) for p in pods} - {target.image})
    configs = sorted({annotation(p, CONFIG_HASH_ANNOTATION) for p in pods}
                     - {target.config_hash})
    restarts = sorted({annotation(p, RESTARTED_AT_ANNOTATION) for p in pods}
                      - {target.restarted_at})
    parts = []
    if images:
        parts.append(f"engine image {', '.join(images)} -> {target.image}")
    if configs:
        parts.append(f"engine configuration {', '.join(configs)} -> {target.config_hash}")
    if restarts and target.restarted_at:
        parts.append(f"restart requested at {target.restarted_at} (kubectl rollout restart)")
    return "; ".join(parts) or "pod labels and annotations"
