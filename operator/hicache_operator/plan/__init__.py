"""The pure planner's entry: (CR, operator config, node facts) -> Kubernetes objects and a plan.

:func:`plan` runs the planner's rules (:mod:`hicache_operator.planner`) and the builders
(:mod:`hicache_operator.builders`); :func:`render_summary` explains a finished plan.
"""

from ..planner.errors import SpecError
from .orchestrate import Plan, plan
from .summary import render_summary

__all__ = ["Plan", "SpecError", "plan", "render_summary"]
