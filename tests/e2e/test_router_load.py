"""Cache affinity under load: smg 1.13.0's defaults against the arguments the planner renders.

Real: the planner's router Deployment for a CR (``plan()``, the same function the operator runs)
and SGLang's model gateway ``smg`` 1.13.0 started with its routing arguments; smg's load polls,
cache-aware tree and worker API. Faked: the engines (``sglang_standin``), which report the load
the workload sets; workers come from ``--worker-urls`` and ``POST /workers``, not discovery
(``router_load_lib`` says what the workload does). Counts only: which worker each follow-up
turn reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_lib import REPO
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import plan
from router_lib import SMG
from router_load_lib import LOAD_RULE_FLAGS, drop_flags, routing_args, run_case

pytestmark = pytest.mark.e2e
IPS = ("127.0.0.30", "127.0.0.31", "127.0.0.32")


def _deployment() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "minimal-dram-only.yaml").read_text())
    doc["metadata"] = {"name": "loaded", "namespace": "default"}
    doc["spec"]["replicas"] = 2
    doc["spec"]["router"] = {"healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 1,
                                             "failureThreshold": 1, "successThreshold": 1}}
    p = plan(doc, OperatorConfig())
    return next(o for o in p.objects if o["kind"] == "Deployment")


def test_busy_holders_keep_their_sessions_only_with_the_planners_load_rules(
        tmp_path: Path) -> None:
    if not SMG.exists():
        pytest.fail(f"{SMG} is missing: run `make router-env` (bash scripts/build-router-env.sh)")
    rendered = routing_args(_deployment())
    assert "--disable-worker-overload-protection" in rendered
    smg_defaults = drop_flags(rendered, LOAD_RULE_FLAGS)
    assert "--worker-warmup-divert-every" not in smg_defaults

    planner = run_case(SMG, "planner", rendered, IPS, tmp_path / "smg.log")
    defaults = run_case(SMG, "smg-defaults", smg_defaults, IPS, tmp_path / "smg.log")

    # The busy worker held sessions (else the run shows nothing).
    assert planner.sessions_on_busy >= 8 and defaults.sessions_on_busy >= 8
    # The planner's rules: every follow-up reaches the pod holding its previous turn, the
    # busy one included, and the joining pod takes no hit away.
    assert planner.affine == planner.followups == 48
    assert planner.to_new_worker == 0
    # smg's defaults: each session held by the busy pod loses its next turn to another pod
    # (a full prefill there), which then holds it.
    assert defaults.affine == defaults.followups - defaults.sessions_on_busy
    assert defaults.prefix_hit_ratio < planner.prefix_hit_ratio
