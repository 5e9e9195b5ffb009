"""bench/router_workload.py's routing model (pure): what an unbounded prefix cache per pod hits
for a routing, so the benchmark can tell a routing's cost from the engines' own misses."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from router_workload import Workload, common_prefix, ideal_hits, model_routing


def test_common_prefix() -> None:
    assert common_prefix("abcdef", "abcxyz") == 3
    assert common_prefix("abc", "abc") == 3
    assert common_prefix("", "abc") == common_prefix("x", "y") == 0


def test_ideal_hits_counts_only_what_the_same_pod_has_seen() -> None:
    requests = [("a", "sys q1", "sys q1 r1"), ("b", "sys q1 r1 q2", "sys q1 r1 q2 r2"),
                ("a", "sys q1 r1 q2 r2 q3", "sys q1 r1 q2 r2 q3 r3")]
    # 0 hits; 0 hits (pod b is new); pod a saw "sys q1 r1" (9 of 18 characters)
    assert ideal_hits(requests) == round(9 / (6 + 12 + 18), 4)
    same_pod = [("a", p, c) for _, p, c in requests]
    assert ideal_hits(same_pod) == round((0 + 9 + 15) / 36, 4)


def test_a_sticky_router_keeps_the_single_replica_hits_and_round_robin_loses_history() -> None:
    w = Workload(systems=2, users_per_system=2, turns=4, system_words=40)
    single = model_routing(w, 1, "sticky")
    assert model_routing(w, 2, "sticky") == single
    assert model_routing(w, 4, "round_robin") < model_routing(w, 2, "round_robin") < single
