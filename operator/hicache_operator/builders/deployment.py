"""The router's Deployment: SGLang's model gateway (smg) discovering the CR's engine pods."""

from __future__ import annotations

from typing import Any

from ..api.quantity import format_bytes
from .context import MANAGED_BY, BuildInput

ROUTER_UID = 10001  # USER of images/router/Dockerfile


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 2, "failureThreshold": failures}


def build_router_deployment(b: BuildInput) -> dict[str, Any]:
    plan = b.router
    assert plan is not None, "no router planned"
    r = b.spec.router
    sizing = plan.sizing
    resources = {"cpu": str(sizing.cpu), "memory": format_bytes(sizing.memory_bytes)}
    mesh = "--enable-mesh" in plan.args
    container: dict[str, Any] = {
        "name": "router",
        "image": b.router_image,
        "imagePullPolicy": b.image_pull_policy,
        "command": ["smg"],
        "args": list(plan.args),
        "ports": [
            {"name": "http", "containerPort": r.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": r.metrics_port, "protocol": "TCP"},
            *([{"name": "mesh", "containerPort": r.mesh.port, "protocol": "TCP"}]
              if mesh else []),
        ],
        # /readiness: 200 once the router has a healthy worker; /liveness: the process serves.
        "readinessProbe": _probe("/readiness", 5, 2),
        # Deletion: keep serving while Endpoints and kube-proxy drop the pod, then SIGTERM,
        # after which smg waits --shutdown-grace-period-secs for streams in flight. The
        # kubelet's own sleep action: the image needs no shell.
        **({"lifecycle": {"preStop": {"sleep": {"seconds": r.pre_stop_seconds}}}}
           if r.pre_stop_seconds else {}),
        "livenessProbe": _probe("/liveness", 10, 3),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        # The mesh names itself as its pod is named and advertises the pod's IP (the kubelet
        # expands $(POD_NAME) and $(POD_IP) in the arguments from these).
        **({"env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ]} if mesh else {}),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": ROUTER_UID,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_labels = {**b.router_selector(), "app.kubernetes.io/component": "router",
                  "app.kubernetes.io/managed-by": MANAGED_BY}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": b.metadata(b.names.router, "router"),
        "spec": {
            "replicas": r.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": b.router_selector()},
            # Never fewer routers than asked during a rollout: a new one is ready first.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": pod_labels,
                             "annotations": {"kubectl.kubernetes.io/default-container": "router"}},
                "spec": {
                    "serviceAccountName": b.names.router,
                    # The gateway reads its token to watch pods (the Role allows nothing else).
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": plan.termination_grace_s,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": ROUTER_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                },
            },
        },
    }
