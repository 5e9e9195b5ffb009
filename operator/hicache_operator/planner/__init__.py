"""The pure planner: (CR, operator config, node facts) -> Kubernetes objects and a plan."""

from .errors import SpecError
from .plan import Plan, plan
from .summary import render_summary

__all__ = ["Plan", "SpecError", "plan", "render_summary"]
