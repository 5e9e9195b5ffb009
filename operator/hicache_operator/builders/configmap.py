"""The ConfigMap holding the rendered backend env (HICACHE_*), loaded with envFrom."""

from __future__ import annotations

from typing import Any

from .context import BuildInput


def build_configmap(b: BuildInput) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": b.metadata(b.names.configmap, "config"),
        "data": dict(sorted(b.engine.env.items())),
    }
