"""The router's Role: read the pods of the CR's namespace, nothing else (least privilege)."""

from __future__ import annotations

from typing import Any

from .context import BuildInput

#: What smg's Kubernetes discovery needs: an initial list, then a watch (and get on relists).
ROUTER_RULES = ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},)


def build_router_role(b: BuildInput) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": b.metadata(b.names.router, "router"),
            "rules": [dict(rule) for rule in ROUTER_RULES]}
