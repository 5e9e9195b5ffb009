"""Pure builders: one module per Kubernetes kind, each a function of the planned pod."""

from .configmap import build_configmap
from .context import BuildInput, ObjectNames
from .deployment import build_router_deployment
from .pdb import build_pdb
from .role import build_router_role
from .rolebinding import build_router_rolebinding
from .router_pdb import build_router_pdb
from .serviceaccount import build_router_serviceaccount
from .services import build_client_service, build_headless_service
from .statefulset import build_statefulset

__all__ = [
    "BuildInput",
    "ObjectNames",
    "build_client_service",
    "build_configmap",
    "build_headless_service",
    "build_pdb",
    "build_router_deployment",
    "build_router_pdb",
    "build_router_role",
    "build_router_rolebinding",
    "build_router_serviceaccount",
    "build_statefulset",
]
