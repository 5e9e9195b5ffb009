"""The router's PodDisruptionBudget: a node drain never takes every router pod at once."""

from __future__ import annotations

from typing import Any

from .context import BuildInput


def build_router_pdb(b: BuildInput) -> dict[str, Any]:
    """At most one router pod evicted at a time (planned only with two or more: with one,
    ``maxUnavailable: 1`` protects nothing and ``0`` would block every drain of its node)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": b.metadata(b.names.router, "router"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": b.router_selector()},
            # A router pod that never became ready serves nothing: evicting it costs nothing.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
