"""The pure planner: (CR, operator config, node facts) -> Kubernetes objects and a plan."""

from .errors import SpecError
from .plan import Plan, cache_tiers, plan

__all__ = ["Plan", "SpecError", "cache_tiers", "plan"]
