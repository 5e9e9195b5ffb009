"""What the CR's namespace says about its pods: the Pod Security Admission level."""

from __future__ import annotations

from ..planner.pod_security import ENFORCE_LABEL
from .kube import KubeClient, KubeError


async def pod_security_label(kube: KubeClient, namespace: str) -> str | None:
    """The namespace's ``pod-security.kubernetes.io/enforce`` label, read at each reconcile so
    a relabelled namespace is followed; ``None`` when absent or unreadable (a cluster that
    denies ``get namespaces``: the pods are then rendered as without the label)."""
    try:
        ns = await kube.get("v1", "Namespace", None, namespace)
    except KubeError as exc:
        if exc.status == 403:
            return None
        raise
    labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(ENFORCE_LABEL)
    return str(value) if value is not None else None
