"""The headless Service (stable pod DNS for the StatefulSet) and the client Service."""

from __future__ import annotations

from typing import Any

from .context import BuildInput


def _ports(b: BuildInput) -> list[dict[str, Any]]:
    return [{"name": "http", "port": b.spec.engine.port, "targetPort": "http", "protocol": "TCP"}]


def build_headless_service(b: BuildInput) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": b.metadata(b.names.headless_service, "engine"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": b.selector(),
            "ports": _ports(b),
        },
    }


def build_client_service(b: BuildInput) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": b.metadata(b.names.service, "engine"),
        "spec": {"type": "ClusterIP", "selector": b.selector(), "ports": _ports(b)},
    }
