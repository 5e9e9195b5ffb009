"""The in-pod launcher: probe the node, check hugepages and SSD, then exec SGLang.

Run as ``python -m hicache_umbp.launch [--dry-run] [--node-root DIR]``; see docs/launcher.md.
"""

from __future__ import annotations

from .errors import LaunchError
from .noderoot import NodeRoot
from .run import LaunchPlan, plan_launch

__all__ = ["LaunchError", "LaunchPlan", "NodeRoot", "plan_launch"]
