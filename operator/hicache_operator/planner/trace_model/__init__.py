"""A trace-driven model of the whole cache: what each tier of a planned pod would hit on a trace.

Pure and typed like the rest of the planner. Layers (``make lint``, contract
``trace-model-layers``): ``capacity`` (a plan's tiers in tokens, from the planner's sizing),
``served`` (scaled slices for served pods) and ``curve`` over ``estimate`` over ``replay`` over
``routing`` and ``pod`` over ``tiers`` over ``trace``. docs/capacity-planning.md explains the
model and its assumptions.
"""

from .capacity import NoGeometry, PodModel, pod_model, router_config
from .curve import Curve, curve
from .estimate import MEASURED_BANDWIDTH, Estimate, estimate, measured_bandwidth, verdicts
from .replay import ReplayResult, footprint_tokens, replay, single_lru, theoretical_hit
from .routing import ROUTER_POLICIES, RouterConfig
from .served import (
    model_for_slice,
    pressure_capacities,
    prompt_ids,
    prompt_text,
    scale_trace,
)
from .tiers import TIER_LABELS, TIERS, Policy, TierTokens
from .trace import BUILTIN_TRACES, Trace, TraceError, load_trace

__all__ = [
    "BUILTIN_TRACES", "MEASURED_BANDWIDTH", "ROUTER_POLICIES", "TIERS", "TIER_LABELS", "Curve",
    "Estimate", "NoGeometry", "PodModel", "Policy", "ReplayResult", "RouterConfig", "TierTokens",
    "Trace", "TraceError", "curve", "estimate", "footprint_tokens", "load_trace",
    "measured_bandwidth",
    "model_for_slice", "pod_model", "pressure_capacities", "prompt_ids", "prompt_text", "replay",
    "router_config", "scale_trace", "single_lru", "theoretical_hit", "verdicts",
]
