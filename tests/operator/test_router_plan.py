"""The router the planner renders (``spec.router``): when it runs, its tree from the pods'
capacity, its arguments, objects and RBAC, and the Service switch."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_operator.planner.router_sizing import ROUTER_TREE_DEFAULT_CHARS
from shc_testlib import load_example

pytestmark = pytest.mark.unit
CONFIG = OperatorConfig()
MIB = 1024**2


def _cr(name: str, mutate: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    cr = copy.deepcopy(load_example(name))
    if mutate is not None:
        mutate(cr["spec"])
    return cr


def _kinds(p: Any) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in p.objects}


def _args(p: Any) -> list[str]:
    dep = next(o for o in p.objects if o["kind"] == "Deployment")
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


def _arg(p: Any, flag: str) -> str:
    args = _args(p)
    return args[args.index(flag) + 1]


def test_on_by_default_from_two_replicas_off_for_one_and_on_when_asked() -> None:
    one = plan(_cr("minimal-dram-only.yaml"), CONFIG)
    assert one.spec.replicas == 1 and one.router is None
    assert not any(o["kind"] == "Deployment" for o in one.objects)
    two = plan(_cr("minimal-dram-only.yaml", lambda s: s.update(replicas=2)), CONFIG)
    assert two.router is not None
    off = plan(_cr("minimal-dram-only.yaml",
                   lambda s: s.update(replicas=2, router={"enabled": False})), CONFIG)
    assert off.router is None
    asked = plan(_cr("minimal-dram-only.yaml", lambda s: s.update(router={"enabled": True})),
                 CONFIG)
    assert asked.router is not None
    assert any("nothing to choose between" in w for w in asked.warnings)


def test_deepseek_tree_is_its_host_and_l3_capacity_in_characters() -> None:
    """DeepSeek-R1 bf16, mla: b = 70,272 B per token and rank (sizing.size_router)."""
    p = plan(_cr("deepseek-r1-mi355x.yaml", lambda s: s.update(replicas=2)), CONFIG)
    assert p.router is not None
    tokens = p.router.sizing.pod_tokens
    assert tokens is not None
    assert tokens.host == 200 * 2**30 // 70272 == 3_055_959  # one DP group, replicated latent
    assert tokens.l3_dram == 512 * 2**30 // 70272  # mla: one writer rank backs up
    assert tokens.l3_ssd == 3 * 2**40 // 70272 == 46_939_533
    assert tokens.total == tokens.host + tokens.l3_ssd
    tree = tokens.total * 4 * 4  # 2 replicas: sized for 4 pods, the smallest tree_pods
    assert int(_arg(p, "--max-tree-size")) == tree == 799_927_872
    # 1.25 x (2.7 B + 3,900 B / 2048 characters per request) = 1.25 x 4.605 B per character
    assert p.router.sizing.memory_bytes == -(-(256 * MIB * 4000 + 5 * 4605 * tree)
                                             // (4000 * MIB)) * MIB
    assert p.status_plan["router"]["treeChars"] == tree
    assert p.status_plan["router"]["tokensPerPod"]["total"] == tokens.total


def test_llama_mha_counts_every_attention_tp_rank_in_l3() -> None:
    """Llama-3.1-70B bf16 at TP4: b = 327,680 / 4 = 81,920 B; the standalone L3 holds the four
    ranks' parts of a token, so 4 b per token there."""
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    assert p.router is not None and p.router.sizing.pod_tokens is not None
    t = p.router.sizing.pod_tokens
    assert (t.host, t.l3_dram, t.l3_ssd) == (227 * 2**30 // 81920, 256 * 2**30 // (4 * 81920),
                                            800 * 2**30 // (4 * 81920))
    assert int(_arg(p, "--max-tree-size")) == t.total * 4 * 4


def test_max_pods_and_chars_per_token_scale_the_tree_and_replicas_do_not_when_set() -> None:
    def with_tree(replicas: int) -> Any:
        return plan(_cr("llama-3.1-70b-mi355x.yaml", lambda s: s.update(
            replicas=replicas, router={"tree": {"maxPods": 8, "charsPerToken": 3}})), CONFIG)

    two, three = with_tree(2), with_tree(3)
    assert two.router is not None and two.router.sizing.pod_tokens is not None
    assert int(_arg(two, "--max-tree-size")) == two.router.sizing.pod_tokens.total * 3 * 8
    # An autoscaler moving replicas does not touch the router's arguments (no restart).
    assert _args(two) == _args(three)


def test_without_the_geometry_the_tree_is_smg_default_and_a_warning_says_why() -> None:
    p = plan(_cr("minimal-dram-only.yaml", lambda s: s.update(replicas=2)), CONFIG)
    assert p.spec.model.kv_bytes_per_token is None
    assert int(_arg(p, "--max-tree-size")) == ROUTER_TREE_DEFAULT_CHARS
    assert any(w.startswith("router:") and "kvBytesPerToken" in w for w in p.warnings)


def test_short_turns_make_the_router_need_more_memory_per_character() -> None:
    """smg 1.13.0 measured (bench/router_memory.py): 2.7 B per tree character plus 3.9 KB per
    request; requests adding 256 characters each need 4x the memory per character of 2048."""
    from hicache_operator.planner.router_sizing import tree_millibytes_per_char

    assert (tree_millibytes_per_char(2048), tree_millibytes_per_char(256)) == (4605, 17935)
    long_turns = plan(_cr("deepseek-r1-mi355x.yaml", lambda s: s.update(replicas=2)), CONFIG)
    short = plan(_cr("deepseek-r1-mi355x.yaml", lambda s: s.update(
        replicas=2, router={"tree": {"requestChars": 256}})), CONFIG)
    assert long_turns.router is not None and short.router is not None
    assert short.router.sizing.tree_chars == long_turns.router.sizing.tree_chars
    assert 3.5 < (short.router.sizing.memory_bytes / long_turns.router.sizing.memory_bytes) < 4


def test_an_explicit_memory_caps_the_tree_and_an_explicit_size_must_fit_it() -> None:
    capped = plan(_cr("deepseek-r1-mi355x.yaml", lambda s: s.update(
        replicas=2, router={"resources": {"memory": "1Gi"}})), CONFIG)
    assert int(_arg(capped, "--max-tree-size")) == (2**30 - 256 * MIB) * 4000 // (5 * 4605)
    assert any("cut to" in w for w in capped.warnings)
    with pytest.raises(SpecError) as err:
        plan(_cr("deepseek-r1-mi355x.yaml", lambda s: s.update(
            replicas=2, router={"resources": {"memory": "1Gi"},
                                "tree": {"maxSize": 10**9}})), CONFIG)
    assert any(path == "spec.router.tree.maxSize" for path, _ in err.value.problems)
    with pytest.raises(SpecError) as err:
        plan(_cr("deepseek-r1-mi355x.yaml", lambda s: s.update(
            replicas=2, router={"resources": {"memory": "200Mi"}})), CONFIG)
    assert any(path == "spec.router.resources.memory" for path, _ in err.value.problems)


def test_flags_the_operator_renders_are_refused_in_extra_args() -> None:
    with pytest.raises(SpecError) as err:
        plan(_cr("minimal-dram-only.yaml", lambda s: s.update(
            replicas=2, router={"extraArgs": ["--log-level", "debug", "--selector=a=b"]})),
             CONFIG)
    assert [path for path, _ in err.value.problems] == ["spec.router.extraArgs[2]"]


def test_arguments_discover_the_crs_pods_in_its_namespace_only() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    args = _args(p)
    i = args.index("--selector")
    assert args[i + 1:i + 3] == ["app.kubernetes.io/instance=llama-70b",
                                 "app.kubernetes.io/name=sglang-hicache"]
    assert _arg(p, "--service-discovery-namespace") == p.namespace
    assert _arg(p, "--service-discovery-port") == str(p.spec.engine.port)
    assert _arg(p, "--policy") == "cache_aware"
    assert _arg(p, "--health-check-endpoint") == "/ready"
    rr = plan(_cr("llama-3.1-70b-mi355x.yaml", lambda s: s.update(
        router={"policy": "round_robin"})), CONFIG)
    assert _arg(rr, "--policy") == "round_robin"


def test_router_pods_are_never_selected_as_engines() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    objs = _kinds(p)
    dep = objs["Deployment/llama-70b-router"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    engine_selectors = [objs["Service/llama-70b-headless"]["spec"]["selector"],
                        objs["PodDisruptionBudget/llama-70b"]["spec"]["selector"]["matchLabels"],
                        objs["StatefulSet/llama-70b"]["spec"]["selector"]["matchLabels"]]
    for selector in engine_selectors:
        assert not all(pod_labels.get(k) == v for k, v in selector.items())
    # ... and the router discovers exactly the engine pods' labels.
    assert p.router is not None and p.router.selector == engine_selectors[0]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llama-70b-router"
    container = pod["containers"][0]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {p["name"] for p in container["ports"]} == {"http", "metrics", "mesh"}


def test_the_role_reads_pods_of_the_namespace_and_nothing_else() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    objs = _kinds(p)
    role = objs["Role/llama-70b-router"]
    assert role["metadata"]["namespace"] == p.namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    binding = objs["RoleBinding/llama-70b-router"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "llama-70b-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-70b-router",
                                    "namespace": p.namespace}]
    assert "ServiceAccount/llama-70b-router" in objs


def test_the_service_moves_to_the_router_only_once_it_serves() -> None:
    cr = _cr("llama-3.1-70b-mi355x.yaml")
    waiting = _kinds(plan(cr, CONFIG, router_serving=False))["Service/llama-70b"]
    assert waiting["spec"]["selector"]["app.kubernetes.io/name"] == "sglang-hicache"
    serving = _kinds(plan(cr, CONFIG))["Service/llama-70b"]
    assert serving["spec"]["selector"]["app.kubernetes.io/name"] == "sglang-hicache-router"
    assert serving["spec"]["sessionAffinity"] == "ClientIP"  # 2 router pods by default
    one = _kinds(plan(_cr("llama-3.1-70b-mi355x.yaml", lambda s: s.update(
        router={"replicas": 1})), CONFIG))["Service/llama-70b"]
    assert "sessionAffinity" not in one["spec"]
    assert serving["spec"]["ports"][0]["targetPort"] == "http"


def test_router_image_comes_from_the_cr_or_the_operator() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), OperatorConfig(router_image="reg/r:1"))
    assert _kinds(p)["Deployment/llama-70b-router"]["spec"]["template"]["spec"][
        "containers"][0]["image"] == "reg/r:1"
    q = plan(_cr("llama-3.1-70b-mi355x.yaml", lambda s: s.update(router={"image": "x/y:2"})),
             OperatorConfig(router_image="reg/r:1"))
    assert _kinds(q)["Deployment/llama-70b-router"]["spec"]["template"]["spec"][
        "containers"][0]["image"] == "x/y:2"
