"""API server rules for the router's kinds (Deployments, RoleBindings) that the OpenAPI schemas
do not state, from apps/v1 and rbac/v1 validation:

- a Deployment's (and StatefulSet's) ``spec.selector`` must match its pod template's labels
  (``selector does not match template labels``), and is immutable after creation;
- a RoleBinding's ``roleRef`` is immutable (``cannot change roleRef``): changing it means a new
  binding;
- a Role's rules name at least one verb each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Cause = tuple[str, str]


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or \
                (op == "NotIn" and present and labels.get(key) in values) or \
                (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def workload_causes(obj: Mapping[str, Any]) -> list[Cause]:
    """Create and update checks of one object (empty: the server stores it)."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    causes: list[Cause] = []
    if kind in ("Deployment", "StatefulSet"):
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        selector = spec.get("selector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            causes.append(("spec.selector", "Invalid value: empty selector is invalid for "
                                            "deployment" if kind == "Deployment" else
                           "Invalid value: empty selector"))
        elif not _selector_matches(selector, labels):
            causes.append(("spec.template.metadata.labels",
                           "Invalid value: `selector` does not match template `labels`"))
    if kind == "Role":
        for i, rule in enumerate(obj.get("rules") or []):
            if not rule.get("verbs"):
                causes.append((f"rules[{i}].verbs", "Required value: verbs must contain at "
                                                    "least one value"))
    return causes


def immutable_causes(kind: str, new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    """Fields the server refuses to change on update (422 Invalid)."""
    if kind == "Deployment" and (new.get("spec") or {}).get("selector") != \
            (old.get("spec") or {}).get("selector"):
        return [("spec.selector", "Invalid value: field is immutable")]
    if kind == "RoleBinding" and new.get("roleRef") != old.get("roleRef"):
        return [("roleRef", "Invalid value: cannot change roleRef")]
    return []
