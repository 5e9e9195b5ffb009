"""Pre-pull Pod: the new engine image pulled on an engine pod's node before its engine restarts
in place.

The kubelet stops a container before it pulls the container's new image, so without this a
multi-GB image pull would add to each engine's downtime. A pull pod is pinned to the node
(``nodeName``: no scheduler, no resources the node is short of), runs a no-op once
(``restartPolicy: Never``, ``activeDeadlineSeconds``), tolerates what the engine pod tolerates
and uses its ``imagePullSecrets``, so the kubelet pulls exactly what the engine will run. Its
command may not even exist in the image: the pull is what counts (``controller.rollout``
reads the pod's state). It carries its own ``app.kubernetes.io/name`` so no engine selector
(Services, PDB, the router, the CR's pod list) ever matches it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .context import MANAGED_BY, digest

PREPULL_APP_NAME = "sglang-hicache-prepull"
PREPULL_FOR = "hicache.sglang.ai/prepull-for"  # annotation: the engine pod it pulls for
# Enough for a shell to exit; requests == limits (its own Guaranteed QoS, never a burst).
_RESOURCES = {"cpu": "10m", "memory": "32Mi"}
_NON_ROOT_UID = 65534  # nobody: Pod Security "restricted" needs a non-root user


def prepull_selector(cr_name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": PREPULL_APP_NAME, "app.kubernetes.io/instance": cr_name}


def prepull_name(pod_name: str, image: str, node: str) -> str:
    return f"{pod_name}-pull-{digest({'image': image, 'node': node})[:10]}"


def build_prepull_pod(*, cr_name: str, namespace: str, engine_pod: Mapping[str, Any],
                      image: str, deadline_s: int) -> dict[str, Any]:
    """The pull pod for ``engine_pod``'s node and ``image`` (the operator adds the owner
    reference to the CR, as for every child)."""
    spec = engine_pod.get("spec") or {}
    pod_name = str((engine_pod.get("metadata") or {}).get("name", ""))
    node = str(spec.get("nodeName", ""))
    pod_spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": max(1, int(deadline_s)),
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": _NON_ROOT_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "pull",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", "true"],
            "resources": {"requests": dict(_RESOURCES), "limits": dict(_RESOURCES)},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
        }],
    }
    if spec.get("tolerations"):
        pod_spec["tolerations"] = list(spec["tolerations"])
    if spec.get("imagePullSecrets"):
        pod_spec["imagePullSecrets"] = list(spec["imagePullSecrets"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": prepull_name(pod_name, image, node),
            "namespace": namespace,
            "labels": {**prepull_selector(cr_name), "app.kubernetes.io/component": "prepull",
                       "app.kubernetes.io/managed-by": MANAGED_BY},
            "annotations": {PREPULL_FOR: pod_name},
        },
        "spec": pod_spec,
    }
