"""The router as a service of its own (issue 25, items 4 and 5): smg's load rules pinned, several
pods with a disruption budget, a grace period that covers a stream, and a tree size (an argument:
a change restarts every router pod with an empty tree) that scaling the engines leaves alone.

Real: the planner and builders on the examples. Nothing is faked; these are pure functions."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_operator.planner.router_sizing import shutdown_timing, tree_pods
from shc_testlib import load_example

pytestmark = pytest.mark.unit
CONFIG = OperatorConfig()
EXAMPLE = "llama-3.1-70b-mi355x.yaml"


def _plan(mutate: Callable[[dict[str, Any]], None] | None = None) -> Any:
    cr = copy.deepcopy(load_example(EXAMPLE))
    if mutate is not None:
        mutate(cr["spec"])
    return plan(cr, CONFIG)


def _obj(p: Any, kind: str, name: str = "llama-70b-router") -> dict[str, Any] | None:
    return next((o for o in p.objects if o["kind"] == kind and o["metadata"]["name"] == name),
                None)


def _deployment(p: Any) -> dict[str, Any]:
    dep = _obj(p, "Deployment")
    assert dep is not None
    return dep


def _args(p: Any) -> list[str]:
    return list(_deployment(p)["spec"]["template"]["spec"]["containers"][0]["args"])


def _replicas(n: int) -> Callable[[dict[str, Any]], None]:
    return lambda s: s.update(replicas=n)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 4), (2, 4), (5, 8), (9, 16)])
def test_scaling_the_engines_leaves_the_router_deployment_unchanged(before: int,
                                                                   after: int) -> None:
    """An autoscaler's scale within a power of two (at least 4) changes nothing the router
    runs with: no router pod restarts, no tree is emptied."""
    assert _deployment(_plan(_replicas(before))) == _deployment(_plan(_replicas(after)))


def test_max_pods_fixes_the_router_for_any_scale() -> None:
    def fixed(n: int) -> dict[str, Any]:
        return _deployment(_plan(lambda s: s.update(replicas=n,
                                                    router={"tree": {"maxPods": 32}})))
    assert fixed(2) == fixed(9) == fixed(31)


def test_crossing_a_power_of_two_resizes_the_tree_once() -> None:
    """The cost of the default: 4 -> 5 doubles the tree (one restart), 5 -> 8 does not."""
    size = {n: int(_args(_plan(_replicas(n)))[_args(_plan(_replicas(n))).index(
        "--max-tree-size") + 1]) for n in (4, 5, 8)}
    assert size[5] == 2 * size[4] and size[8] == size[5]
    assert [tree_pods(n, None) for n in (1, 2, 4, 5, 8, 9, 33)] == [4, 4, 4, 8, 8, 16, 64]
    assert tree_pods(3, 12) == 12


def test_load_rules_are_pinned_off_by_default_and_rendered_when_asked() -> None:
    """smg 1.13.0 skips a worker at >= 8 queued requests or >= 0.8 KV use and diverts one hit
    in 8 to a thin worker unless told otherwise: the planner always tells it."""
    args = _args(_plan())
    assert "--disable-worker-overload-protection" in args
    assert args[args.index("--worker-warmup-divert-every") + 1] == "0"
    assert "--worker-overload-waiting-requests" not in args
    on = _args(_plan(lambda s: s.update(router={
        "overload": {"protection": True, "waitingRequests": 32, "tokenUsage": 0.95},
        "warmupDivertEvery": 16})))
    assert "--disable-worker-overload-protection" not in on
    assert on[on.index("--worker-overload-waiting-requests") + 1] == "32"
    assert on[on.index("--worker-overload-token-usage") + 1] == "0.95"
    assert on[on.index("--worker-warmup-divert-every") + 1] == "16"


@pytest.mark.parametrize("flag", ["--worker-overload-protection",
                                  "--disable-worker-overload-protection",
                                  "--worker-warmup-divert-every=8",
                                  "--shutdown-grace-period-secs"])
def test_extra_args_may_not_set_the_pinned_flags(flag: str) -> None:
    with pytest.raises(SpecError) as err:
        _plan(lambda s: s.update(router={"extraArgs": [flag, "1"]}))
    assert "spec.router.extraArgs[0]" in str(err.value)


def test_grace_period_covers_the_longest_stream_after_the_endpoints_drop_the_pod() -> None:
    p = _plan(lambda s: s.update(router={"maxStreamSeconds": 1800, "preStopSeconds": 15}))
    pod = _deployment(p)["spec"]["template"]["spec"]
    args = _args(p)
    assert args[args.index("--shutdown-grace-period-secs") + 1] == "1800"
    assert pod["terminationGracePeriodSeconds"] == 15 + 1800 + 5 == shutdown_timing(1800, 15)[1]
    assert pod["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 15}}}
    default = _deployment(_plan())["spec"]["template"]["spec"]
    assert default["terminationGracePeriodSeconds"] == 10 + 600 + 5
    no_sleep = _deployment(_plan(lambda s: s.update(router={"preStopSeconds": 0})))
    assert "lifecycle" not in no_sleep["spec"]["template"]["spec"]["containers"][0]


def test_two_router_pods_by_default_with_a_budget_and_one_pod_warned() -> None:
    p = _plan()
    assert _deployment(p)["spec"]["replicas"] == 2
    pdb = _obj(p, "PodDisruptionBudget")
    assert pdb is not None
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == \
        _deployment(p)["spec"]["selector"]["matchLabels"]
    service = _obj(p, "Service", "llama-70b")
    assert service is not None and service["spec"]["sessionAffinity"] == "ClientIP"
    one = _plan(lambda s: s.update(router={"replicas": 1}))
    assert _obj(one, "PodDisruptionBudget") is None
    assert any("one router pod" in w for w in one.warnings)
    assert not any("one router pod" in w for w in p.warnings)


def test_two_router_pods_join_a_mesh_that_finds_its_peers_by_their_labels() -> None:
    """smg names itself by the pod and advertises the pod IP (the kubelet expands both from
    the container's env); its peers are the pods of the router Deployment's own selector."""
    p = _plan()
    dep = _deployment(p)
    args = _args(p)
    assert args[args.index("--mesh-server-name") + 1] == "$(POD_NAME)"
    assert args[args.index("--mesh-advertise-host") + 1] == "$(POD_IP)"
    assert args[args.index("--mesh-port") + 1] == "39527"
    at = args.index("--router-selector")
    labels = dep["spec"]["selector"]["matchLabels"]
    assert args[at + 1:at + 1 + len(labels)] == [f"{k}={v}" for k, v in sorted(labels.items())]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]} == {
        "POD_NAME": "metadata.name", "POD_IP": "status.podIP"}
    assert {"name": "mesh", "containerPort": 39527, "protocol": "TCP"} in container["ports"]
    one = _args(_plan(lambda s: s.update(router={"replicas": 1})))
    assert "--enable-mesh" not in one
    off = _args(_plan(lambda s: s.update(router={"mesh": {"enabled": False}})))
    assert "--enable-mesh" not in off
    with pytest.raises(SpecError):
        _plan(lambda s: s.update(router={"extraArgs": ["--mesh-peer-urls", "x:1"]}))
