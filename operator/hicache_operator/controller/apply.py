"""Writing one child object: create, patch only what differs, recreate on immutable changes —
and never the same refused or ignored write in a loop.

Two things a real API server does that a naive reconcile turns into a hot loop:

- it *refuses* an object (HTTP 400/403/422: schema or admission, e.g. a policy webhook): sending
  the same object again cannot succeed, so it is retried only after a backoff (30 s doubling to
  30 min) or as soon as the desired object changes; the refusal is reported (``Degraded``,
  reason ``ObjectRejected``, with the server's message);
- it *drops* fields it does not know (a disabled feature gate, e.g. StatefulSet
  ``maxUnavailable`` without ``MaxUnavailableStatefulSet``): the written object then never
  covers the desired one, so the same patch would be sent on every resync; the dropped fields
  are reported once (Event ``FieldsNotPersisted``) and a patch touching nothing but them is not
  sent again (any other difference still is).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import diff, metrics
from .kube import KubeClient, KubeError

Obj = dict[str, Any]
ChildKey = tuple[str, str, str]  # apiVersion, kind, name
REFUSED_STATUSES = frozenset({400, 403, 422})
REJECTION_BACKOFF_S = (30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

# StatefulSet spec fields the API server refuses to update (everything but replicas, ordinals,
# template, updateStrategy, revisionHistoryLimit, persistentVolumeClaimRetentionPolicy and
# minReadySeconds). Changing one means: delete the StatefulSet orphaning its pods, create it
# anew; the new one adopts the running pods and rolls them if the template changed too.
STATEFULSET_UPDATABLE = frozenset({"replicas", "ordinals", "template", "updateStrategy",
                                   "revisionHistoryLimit", "persistentVolumeClaimRetentionPolicy",
                                   "minReadySeconds"})


def needs_recreate(kind: str, patch: Mapping[str, Any]) -> list[str]:
    """The immutable fields a patch would change (empty: a patch is enough)."""
    if kind != "StatefulSet":
        return []
    return sorted(set(patch.get("spec") or {}) - STATEFULSET_UPDATABLE)


def digest(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def leaf_paths(patch: Any, prefix: str = "") -> list[str]:
    """Dotted paths of a merge patch's leaves (what the server did not keep)."""
    if not isinstance(patch, Mapping) or not patch:
        return [prefix] if prefix else []
    out: list[str] = []
    for key, value in patch.items():
        out.extend(leaf_paths(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


@dataclass
class Rejection:
    digest: str
    status: int
    reason: str
    message: str
    attempts: int
    retry_at: float

    def describe(self, key: ChildKey) -> str:
        # Stable text (no countdown): the status is rewritten only when the refusal changes.
        return (f"{key[1]} {key[2]} was refused by the API server (HTTP {self.status} "
                f"{self.reason}): {self.message}")


@dataclass
class ChildMemory:
    """What one CR's children writes taught the operator (kept in memory only)."""

    rejected: dict[ChildKey, Rejection] = field(default_factory=dict)
    unpersisted: dict[ChildKey, frozenset[str]] = field(default_factory=dict)  # dropped paths


@dataclass
class Applied:
    obj: Obj | None  # the live object after the write (None: absent, the write was refused)
    verb: str = ""  # created / updated / recreated ... ("" when nothing was written)
    rejection: Rejection | None = None
    dropped: list[str] = field(default_factory=list)  # fields the server did not keep


class ChildWriter:
    def __init__(self, kube: KubeClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.clock = kube, clock

    async def apply(self, key: ChildKey, want: Obj, have: Obj | None,
                    memory: ChildMemory) -> Applied:
        wanted = digest(want)
        rejection = memory.rejected.get(key)
        if rejection is not None:
            if rejection.digest == wanted and self.clock() < rejection.retry_at:
                return Applied(have, rejection=rejection)  # backing off: no write
            if rejection.digest != wanted:
                rejection = None  # the desired object changed: try it at once
        dropped = memory.unpersisted.get(key)
        if dropped and have is not None:
            pending = diff.apply_patch(want, have)
            if pending is None or set(leaf_paths(pending)) <= dropped:
                return Applied(have)  # only what the server keeps dropping differs
        try:
            applied = await self._write(want, have)
        except KubeError as exc:
            if exc.status not in REFUSED_STATUSES:
                raise
            attempts = (rejection.attempts if rejection else 0) + 1
            delay = REJECTION_BACKOFF_S[min(attempts, len(REJECTION_BACKOFF_S)) - 1]
            memory.rejected[key] = Rejection(wanted, exc.status, exc.reason, exc.message,
                                             attempts, self.clock() + delay)
            return Applied(have, rejection=memory.rejected[key])
        memory.rejected.pop(key, None)
        if applied.verb and applied.obj is not None:
            left = diff.apply_patch(want, applied.obj)
            if left:
                applied.dropped = sorted(set(leaf_paths(left)) - (dropped or set()))
                memory.unpersisted[key] = frozenset(leaf_paths(left))
            else:
                memory.unpersisted.pop(key, None)
        return applied

    async def _write(self, want: Obj, have: Obj | None) -> Applied:
        meta = want["metadata"]
        if have is None:
            try:
                created = await self.kube.create(want)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                fetched = await self.kube.get(want["apiVersion"], want["kind"],
                                              meta["namespace"], meta["name"])
                if fetched is None:
                    raise
                have = fetched  # created meanwhile (another reconcile or a restarted operator)
            else:
                metrics.WRITES.labels("create", want["kind"]).inc()
                return Applied(created, "created")
        patch = diff.apply_patch(want, have)
        if patch is None:
            return Applied(have)
        immutable = needs_recreate(want["kind"], patch)
        if immutable:
            await self.kube.delete(want["apiVersion"], want["kind"], meta["namespace"],
                                   meta["name"], propagation="Orphan")
            metrics.WRITES.labels("delete", want["kind"]).inc()
            created = await self.kube.create(want)
            metrics.WRITES.labels("create", want["kind"]).inc()
            return Applied(created,
                           f"recreated (immutable {', '.join(immutable)} changed; pods kept)")
        patched = await self.kube.merge_patch(want["apiVersion"], want["kind"],
                                              meta["namespace"], meta["name"], patch)
        metrics.WRITES.labels("patch", want["kind"]).inc()
        return Applied(patched, "updated")
