"""PodDisruptionBudget: one engine pod down at a time during voluntary disruptions."""

from __future__ import annotations

from typing import Any

from .context import BuildInput


def build_pdb(b: BuildInput) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": b.metadata(b.names.pdb, "engine"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": b.selector()},
            # A pod that never became ready (e.g. hugepages short) must not block node drains.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
