"""Cache affinity under load through the real router: smg 1.13.0's defaults vs the planner's.

``make bench-router-load`` (the router environment, ``make router-env``; no root, no engine).
SGLang's model gateway runs with the routing arguments the planner renders for a 2-replica CR, in
front of three stand-in engines (``tests/e2e/sglang_standin.py``) that report the load the
workload sets on ``/v1/loads``. The workload (``tests/e2e/router_load_lib.py``): 16 sessions,
turn 0 spread while idle; then the pod holding the most sessions reports 16 queued requests and
0.9 KV use, a third pod joins, and 3 follow-up turns per session follow one at a time.

Cases: ``planner`` (the rendered arguments: overload protection off, no warm-up diversion),
``smg-defaults`` (the same without the load rules: protection at 8 queued / 0.8 KV use,
diversion 1 in 8), ``protection-only`` and ``divert-only`` (one rule at smg's default each).
Per case: follow-ups that reached the pod holding the previous turn (``affinity``), the
characters of the follow-ups already sent to the chosen pod (``prefix_hit_ratio``: an unbounded
cache's prefix hits) and the follow-ups the joining pod got. The last line is one JSON object.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import yaml  # noqa: E402
from hicache_operator.api import OperatorConfig  # noqa: E402
from hicache_operator.plan import plan  # noqa: E402
from router_load_lib import LOAD_RULE_FLAGS, drop_flags, routing_args, run_case  # noqa: E402

SMG = ROOT / ".cache" / "bin" / "smg"
IPS = ("127.0.0.40", "127.0.0.41", "127.0.0.42")


def rendered_args() -> list[str]:
    doc = yaml.safe_load((ROOT / "examples" / "minimal-dram-only.yaml").read_text())
    doc["metadata"] = {"name": "bench", "namespace": "default"}
    doc["spec"]["replicas"] = 2
    p = plan(doc, OperatorConfig())
    return routing_args(next(o for o in p.objects if o["kind"] == "Deployment"))


def main() -> None:
    if not SMG.exists():
        sys.exit(f"{SMG} is missing: run `make router-env`")
    rendered = rendered_args()
    defaults = drop_flags(rendered, LOAD_RULE_FLAGS)
    cases: dict[str, list[str]] = {
        "planner": rendered,
        "smg-defaults": defaults,
        "protection-only": [*defaults, "--worker-warmup-divert-every", "0"],
        "divert-only": [*defaults, "--disable-worker-overload-protection"],
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in cases.items():
            r = run_case(SMG, name, args, IPS, Path(tmp) / "smg.log")
            results[name] = r.as_dict()
            print(f"{name:16} affinity {r.affine}/{r.followups} = {r.affinity:.3f}  "
                  f"prefix hit ratio {r.prefix_hit_ratio:.3f}  sessions on the busy pod "
                  f"{r.sessions_on_busy}  to the joining pod {r.to_new_worker}", flush=True)
    base = results["smg-defaults"]
    summary = {
        "bench": "router_load", "smg": "1.13.0", "cases": results,
        "affinity_planner_over_defaults": round(
            results["planner"]["affinity"] / base["affinity"], 4) if base["affinity"] else None,
        "prefix_hit_planner_over_defaults": round(
            results["planner"]["prefix_hit_ratio"] / base["prefix_hit_ratio"], 4)
        if base["prefix_hit_ratio"] else None,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
