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
    """What clients send requests to: the router when it runs (once it has an available pod,
    so the switch never leaves the Service without endpoints), else the engine pods."""
    spec: dict[str, Any] = {"type": "ClusterIP", "selector": b.selector(), "ports": _ports(b)}
    component = "engine"
    if b.router is not None and b.router_serving:
        component = "router"
        spec["selector"] = b.router_selector()
        if b.spec.router.replicas > 1:  # the mesh does not hand a new router the old tree
            spec["sessionAffinity"] = "ClientIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": b.metadata(b.names.service, component),
        "spec": spec,
    }
