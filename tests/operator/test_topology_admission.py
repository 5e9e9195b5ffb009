"""The kubelet's Topology Manager hint merge, computed by the planner (issue finding 4).

The merge follows ``pkg/kubelet/cm/topologymanager/policy.go`` (``mergePermutation``: the AND of
one hint per resource, preferred only when every hint is preferred and all masks are equal).
No kubelet runs here: the nearest real check is that the rules reproduce the documented
upstream outcome (an 8-GPU pod with CPUs that fit one socket fails ``restricted``), and that
docs/install.md recommends only a policy that admits every example.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hicache_operator.api.config import NodeFacts, OperatorConfig
from hicache_operator.plan import plan
from hicache_operator.planner.topology import Hint, admits, merge_hints, resource_hints

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def h(*nodes: int, preferred: bool = True) -> Hint:
    return Hint(frozenset(nodes), preferred)


def test_hints_of_one_resource_prefer_the_fewest_numa_nodes() -> None:
    assert resource_hints(8, [4, 4]) == [h(0, 1)]
    assert resource_hints(4, [4, 4]) == [h(0), h(1), h(0, 1, preferred=False)]
    assert resource_hints(8, [4, 4], single_only=True) == []


def test_merge_is_preferred_only_when_every_hint_is_and_all_sets_are_equal() -> None:
    gpus, cpus = [h(0, 1)], [h(0), h(1), h(0, 1, preferred=False)]
    merged = merge_hints([gpus, cpus], 2)
    assert merged == h(0, preferred=False)
    assert not admits("restricted", merged) and admits("best-effort", merged)
    assert merge_hints([[h(0, 1)], [h(0, 1)]], 2) == h(0, 1)
    assert merge_hints([[h(0), h(1)], [h(1)]], 2) == h(1)


def _plan(path: Path, **facts: Any) -> Any:
    cr = yaml.safe_load(path.read_text())
    config = OperatorConfig()
    if facts:
        config = config.model_copy(update={"node_facts": NodeFacts.model_validate(facts)})
    return plan(cr, config)


def test_restricted_rejects_the_deepseek_pod_and_the_plan_says_so() -> None:
    p = _plan(ROOT / "examples/deepseek-r1-mi355x.yaml", topology_manager_policy="restricted")
    assert p.topology.admitted_by == ("none", "best-effort")
    assert not p.topology.admission["restricted"].admitted
    warning = next(w for w in p.warnings if "topologyManagerPolicy restricted" in w)
    assert "TopologyAffinityError" in warning and "not preferred" in warning
    assert p.status_plan["topology"]["admittedBy"] == ["none", "best-effort"]


def test_a_one_socket_pod_passes_every_policy() -> None:
    p = _plan(ROOT / "examples/llama-3.1-70b-mi355x.yaml")
    assert p.topology.admitted_by == ("none", "best-effort", "restricted", "single-numa-node")


def _recommended_policies() -> list[str]:
    text = (ROOT / "docs/install.md").read_text()
    para = text[text.index("Recommended kubelet settings"):]
    para = para[:para.index("\n- ")]
    return re.findall(r"`topologyManagerPolicy: ([a-z-]+)`", para) + re.findall(
        r"topologyManagerPolicy: [a-z-]+` or `([a-z-]+)`", para)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_install_md_recommends_only_policies_that_admit_every_example(example: Path) -> None:
    recommended = _recommended_policies()
    assert recommended, "docs/install.md names no topologyManagerPolicy"
    admitted = _plan(example).topology.admitted_by
    assert set(recommended) <= set(admitted), (example.name, recommended, admitted)
    assert OperatorConfig().node_facts.topology_manager_policy in recommended
