"""The router's ServiceAccount (the identity its Role is bound to)."""

from __future__ import annotations

from typing import Any

from .context import BuildInput


def build_router_serviceaccount(b: BuildInput) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": b.metadata(b.names.router, "router")}
