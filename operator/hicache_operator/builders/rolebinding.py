"""Binds the router's Role to its ServiceAccount, in the CR's namespace only."""

from __future__ import annotations

from typing import Any

from .context import BuildInput


def build_router_rolebinding(b: BuildInput) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": b.metadata(b.names.router, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": b.names.router},
        "subjects": [{"kind": "ServiceAccount", "name": b.names.router,
                      "namespace": b.namespace}],
    }
