"""The SGLangHiCache API: spec/status models, operator configuration and the generated CRD."""

from .config import AdminPolicy, NodeFacts, OperatorConfig, OperatorConfigError
from .spec import SGLangHiCacheSpec
from .status import PlanStatus, SGLangHiCacheStatus
from .types import API_VERSION, GROUP, KIND, PLURAL, VERSION

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "AdminPolicy",
    "NodeFacts",
    "OperatorConfig",
    "OperatorConfigError",
    "PlanStatus",
    "SGLangHiCacheSpec",
    "SGLangHiCacheStatus",
]
