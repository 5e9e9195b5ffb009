"""``kubectl rollout`` against a StatefulSet the operator runs ``InPlaceIfPossible``.

The StatefulSet is the operator's: its pod template is rendered from the CR and its
``updateStrategy`` holds the partition at ``replicas`` between in-place rollouts. What the
usual tools do to it, and what the operator makes of it:

- ``kubectl rollout restart sts/<name>`` writes the template annotation
  ``kubectl.kubernetes.io/restartedAt``. The operator carries it into its own template
  (:func:`carry_restart`), so the new revision differs only in that annotation and each pod's
  engine restarts in place, paced like any in-place rollout (the annotation reaches the pod;
  the launcher's watcher restarts the engine when it changes). Without this the pods were only
  relabelled and the rollout failed after its timeout.
- ``kubectl rollout undo`` (or ``kubectl edit``) changes the template behind the operator's
  back; the operator restores the template the CR describes at once and says so
  (:func:`outside_change`: Event ``TemplateChangedOutsideOperator``): change the CR instead
  (``spec.image``, ``spec.engine``), or ``kubectl rollout undo`` would be undone every time.
- ``kubectl rollout status`` reads the StatefulSet's own bookkeeping: while pods are updated
  in place the strategy is ``OnDelete``, for which it refuses ("only available for
  RollingUpdate"); the CR's ``Progressing`` condition and ``status.rollout`` are the source.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from ..builders.context import RESTARTED_AT_ANNOTATION
from . import diff
from .transitions import Event

Obj = dict[str, Any]


def _template_annotations(sts: Mapping[str, Any] | None) -> Mapping[str, Any]:
    template = ((sts or {}).get("spec") or {}).get("template") or {}
    return (template.get("metadata") or {}).get("annotations") or {}


def carry_restart(desired: Obj, live: Mapping[str, Any] | None) -> Obj:
    """``desired`` with the live template's ``restartedAt`` annotation, if it has one."""
    stamp = _template_annotations(live).get(RESTARTED_AT_ANNOTATION)
    if not stamp or _template_annotations(desired).get(RESTARTED_AT_ANNOTATION) == stamp:
        return desired
    out = copy.deepcopy(desired)
    meta = out["spec"]["template"].setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), RESTARTED_AT_ANNOTATION: stamp}
    return out


def outside_change(live: Mapping[str, Any] | None) -> str | None:
    """Why the live StatefulSet's pod template is not the one the operator last wrote (None:
    it is). Server defaults and added fields do not count; changed or removed ones do."""
    if not live:
        return None
    last = diff.last_applied(live)
    written = (last.get("spec") or {}).get("template")
    template = (live.get("spec") or {}).get("template") or {}
    if not written or diff.covers(template, written):
        return None
    name = (live.get("metadata") or {}).get("name", "")
    return (f"the pod template of StatefulSet {name} was changed outside the operator "
            "(kubectl rollout undo, kubectl edit or another tool); the operator restored the "
            "template the SGLangHiCache describes. Change the SGLangHiCache instead "
            "(spec.image, spec.engine, ...): its in-place rollout then updates the pods, and "
            "reverting it is the undo")


def outside_events(children: Iterable[Mapping[str, Any]], owner_uid: str) -> list[Event]:
    """A Warning Event for the CR's own StatefulSet whose template someone else changed."""
    out = []
    for child in children:
        if child.get("kind") == "StatefulSet" and diff.owned_by(child, owner_uid):
            why = outside_change(child)
            if why is not None:
                out.append(Event("Warning", "TemplateChangedOutsideOperator", why))
    return out
