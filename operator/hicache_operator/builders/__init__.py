"""Pure builders: one module per Kubernetes kind, each a function of the planned pod."""

from .configmap import build_configmap
from .context import BuildInput, ObjectNames
from .pdb import build_pdb
from .services import build_client_service, build_headless_service
from .statefulset import build_statefulset

__all__ = [
    "BuildInput",
    "ObjectNames",
    "build_client_service",
    "build_configmap",
    "build_headless_service",
    "build_pdb",
    "build_statefulset",
]
