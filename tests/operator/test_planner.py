"""The planner's rules, one test per rule, with expected numbers worked out by hand.

Everything is real: the planner, the backend's env contract and launcher command renderer it
calls, the operator config models. No fakes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hicache_operator.api.config import AdminPolicy, NodeFacts, OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_umbp.contract.load import load_launch_config
from shc_testlib import all_containers, load_example, pod_spec

GI = 1024**3
CONFIG = OperatorConfig()


def _cr(example: str, mutate: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    cr = copy.deepcopy(load_example(example))
    if mutate:
        mutate(cr["spec"])
    return cr


def _problems(cr: dict[str, Any], config: OperatorConfig = CONFIG) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        plan(cr, config)
    assert isinstance(err.value, ValueError)
    return err.value.problems


def _has(problems: list[tuple[str, str]], path: str, *fragments: str) -> bool:
    return any(p == path and all(f in m for f in fragments) for p, m in problems)


def _engine(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in pod_spec(objects)["containers"] if c["name"] == "engine")


def _configmap_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    data = cm["data"]
    assert isinstance(data, dict)
    return data


# ----------------------------------------------------------------------------- sizing


def test_tp8_embedded_sizing_by_hand() -> None:
    """llama-405b: 8 ranks x 200Gi on 2Mi pages = 1600Gi hugepages; memory = roundup(1.1 x
    (16 + 12 x 8)) = 123.2Gi + shm 32Gi + 4 KiB-backed UMBP DRAM 512Gi + write-back rings
    8 x floor(1Gi / 2,064,384) x 2,064,384 B = 8 x 1,073,479,680 B (7.998Gi) + embedded SSD
    staging 8 x 16 x 2,064,384 B = 264,241,152 B (0.246Gi) = 675.44Gi -> 676Gi (page part:
    64 tokens x 516,096 B / 2 / 8 ranks); cpu 4 + 8 x 8."""
    p = plan(_cr("llama-3.1-405b-mi355x.yaml"), CONFIG)
    res = _engine(p.objects)["resources"]
    expected = {"cpu": "68", "memory": "676Gi", "hugepages-2Mi": "1600Gi", "amd.com/gpu": "8"}
    assert res["limits"] == expected
    assert res["requests"] == expected
    assert p.sizing.dram_per_rank == 64 * GI
    assert p.sizing.ssd_per_rank == 384 * GI
    shm = next(v for v in pod_spec(p.objects)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert p.status_plan["hugepagesPerPod"] == "1600Gi (2Mi)"


def test_host_pool_rounds_up_to_whole_hugepages() -> None:
    def odd_pool(s: dict[str, Any]) -> None:
        s["hiCache"]["hostPoolPerRank"] = 10 * GI + 1
        s["hiCache"]["hostAllocator"] = {"hugePageSize": "1Gi"}

    p = plan(_cr("minimal-dram-only.yaml", odd_pool), CONFIG)
    assert p.sizing.host_pool_per_rank == 11 * GI
    assert _engine(p.objects)["resources"]["limits"]["hugepages-1Gi"] == "11Gi"


def test_hugepage_backed_dram_joins_the_hugepage_request() -> None:
    def dram_on_2mi(s: dict[str, Any]) -> None:
        s["l3"]["dram"]["hugePageSize"] = "2Mi"

    p = plan(_cr("minimal-dram-only.yaml", dram_on_2mi), CONFIG)
    limits = _engine(p.objects)["resources"]["limits"]
    assert limits["hugepages-2Mi"] == "96Gi"  # 32Gi host pool + 64Gi DRAM
    # memory no longer carries the DRAM: roundup(1.1 x 28Gi) + 16Gi shm = 30.8 + 16 -> 47Gi
    assert limits["memory"] == "47Gi"


def test_every_container_is_guaranteed_with_integer_cpus() -> None:
    for example in (
        "deepseek-r1-mi355x.yaml",
        "llama-3.1-70b-mi355x.yaml",
        "minimal-dram-only.yaml",
    ):
        p = plan(_cr(example), CONFIG)
        for c in all_containers(p.objects):
            req, lim = c["resources"]["requests"], c["resources"]["limits"]
            assert {k: v for k, v in req.items() if k != "ephemeral-storage"} == lim, c["name"]
            assert lim["cpu"].isdigit() and lim["memory"], c["name"]


def test_explicit_memory_below_minimum_shows_the_arithmetic() -> None:
    problems = _problems(
        _cr("minimal-dram-only.yaml", lambda s: s.update(resources={"memory": "20Gi"}))
    )
    # shm 16Gi + 4 KiB DRAM 64Gi + 4Gi process = 84Gi = 90194313216 B
    assert _has(problems, "spec.resources.memory", "21474836480 B", "90194313216 B")


def test_host_pool_larger_than_the_node_is_rejected_with_arithmetic() -> None:
    problems = _problems(
        _cr("deepseek-r1-mi355x.yaml", lambda s: s["hiCache"].update(hostPoolPerRank="400Gi"))
    )
    assert _has(
        problems, "spec.hiCache.hostPoolPerRank", "more than the node's", str(3 * 1024 * GI)
    )


def test_admin_max_hugepages_per_pod() -> None:
    config = OperatorConfig(policy=AdminPolicy(max_hugepages_per_pod="1Ti"))
    problems = _problems(_cr("deepseek-r1-mi355x.yaml"), config)
    assert _has(problems, "spec.hiCache.hostPoolPerRank", "maxHugepagesPerPod 1Ti")


def test_host_pool_below_one_gb_is_rejected() -> None:
    problems = _problems(
        _cr("minimal-dram-only.yaml", lambda s: s["hiCache"].update(hostPoolPerRank="512Mi"))
    )
    assert _has(problems, "spec.hiCache.hostPoolPerRank", "below 1 GB")


@pytest.mark.parametrize("value", [0, "0", "0Gi"])
def test_a_zero_host_pool_is_rejected_not_turned_into_ratio_sizing(value: Any) -> None:
    """--hicache-size 0 would make SGLang size the pool by its default ratio, silently."""
    problems = _problems(
        _cr("minimal-dram-only.yaml", lambda s: s["hiCache"].update(hostPoolPerRank=value))
    )
    assert _has(problems, "spec.hiCache.hostPoolPerRank", "0 B is below 1 GB", "hostPoolRatio")


def test_booleans_are_not_quantities_or_cpus() -> None:
    """pydantic's lax ints would read false as 0 bytes, true as 1 CPU or one replica; every
    such field is reported at once."""

    def mutate(s: dict[str, Any]) -> None:
        s["hiCache"]["hostPoolPerRank"] = False
        s["l3"]["dram"]["capacity"] = True
        s["resources"] = {"cpu": True, "memory": False}
        s["replicas"] = True
        s["engine"] = {"tensorParallelSize": True, "gpusPerPod": False}

    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    for path in (
        "spec.replicas",
        "spec.engine.tensorParallelSize",
        "spec.engine.gpusPerPod",
        "spec.hiCache.hostPoolPerRank",
        "spec.l3.dram.capacity",
        "spec.resources.cpu",
        "spec.resources.memory",
    ):
        assert _has(problems, path, "is a boolean"), (path, problems)


def test_integers_and_booleans_are_what_the_crd_types_say() -> None:
    """pydantic's lax mode would read "8" as 8 and 0 or "yes" as a boolean; the CRD's
    integer and boolean types refuse them, and so does the planner (found by hypothesis)."""

    def mutate(s: dict[str, Any]) -> None:
        s["engine"] = {"tensorParallelSize": "1", "enableDpAttention": 0}
        s["l3"]["dram"]["prefault"] = "yes"
        s["model"]["kvBytesPerToken"] = "70272"

    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    assert _has(problems, "spec.engine.tensorParallelSize", "'1' is a string, not an integer")
    assert _has(problems, "spec.model.kvBytesPerToken", "is a string, not an integer")
    for path in ("spec.engine.enableDpAttention", "spec.l3.dram.prefault"):
        assert _has(problems, path, "is not a boolean (true or false)"), (path, problems)


def test_ratio_needs_4k_pages_and_explicit_memory() -> None:
    def ratio(s: dict[str, Any]) -> None:
        s["hiCache"] = {"hostPoolRatio": 2.0, "hostAllocator": {"hugePageSize": "none"}}

    assert _has(
        _problems(_cr("minimal-dram-only.yaml", ratio)),
        "spec.resources.memory",
        "cannot size memory",
    )

    def ratio_with_memory(s: dict[str, Any]) -> None:
        ratio(s)
        s["resources"] = {"memory": "300Gi"}

    p = plan(_cr("minimal-dram-only.yaml", ratio_with_memory), CONFIG)
    assert "--hicache-ratio" in p.engine.sglang_argv
    assert "hugepages-2Mi" not in _engine(p.objects)["resources"]["limits"]


# ----------------------------------------------------------------------------- parallelism


def test_gpus_per_pod_must_match_tp_times_dp() -> None:
    problems = _problems(
        _cr("llama-3.1-70b-mi355x.yaml", lambda s: s["engine"].update(gpusPerPod=8))
    )
    assert _has(problems, "spec.engine.gpusPerPod", "tensorParallelSize 4 x dataParallelSize 1 = 4")


def test_more_gpus_than_the_node_has() -> None:
    problems = _problems(
        _cr("deepseek-r1-mi355x.yaml", lambda s: s["engine"].update(tensorParallelSize=16))
    )
    assert _has(problems, "spec.engine", "16 GPUs per pod > 8 GPUs")


def test_dp_attention_shares_tp_gpus_and_needs_divisible_sizes() -> None:
    p = plan(
        _cr(
            "deepseek-r1-mi355x.yaml",
            lambda s: s["engine"].update(dataParallelSize=8, enableDpAttention=True),
        ),
        CONFIG,
    )
    assert p.sizing.ranks == 8
    assert "--attn-dp-size" in p.engine.sglang_argv
    problems = _problems(
        _cr(
            "deepseek-r1-mi355x.yaml",
            lambda s: s["engine"].update(dataParallelSize=3, enableDpAttention=True),
        )
    )
    assert _has(problems, "spec.engine.dataParallelSize", "not a multiple")


# ----------------------------------------------------------------------------- env and args


def test_env_is_what_the_backend_reads_back() -> None:
    p = plan(_cr("llama-3.1-405b-mi355x.yaml"), CONFIG)
    env = _configmap_env(p.objects)
    assert all(k.startswith("HICACHE_") for k in env)
    cfg = load_launch_config(env)
    assert cfg.host_pool_bytes == (200 * GI,) * 8
    assert cfg.store.umbp_dram_bytes == (64 * GI,) * 8
    assert cfg.store.umbp_ssd_bytes == (384 * GI,) * 8
    assert cfg.store.umbp_local_ranks == 8 and cfg.tp_size == 8
    assert cfg.store.umbp_namespace == "inference/llama-405b"
    assert cfg.numa_policy == "auto"
    assert env["HICACHE_HOST_POOL_BYTES"] == str(200 * GI)  # plain bytes, never "200Gi"
    engine = _engine(p.objects)
    assert engine["envFrom"] == [{"configMapRef": {"name": "llama-405b-hicache"}}]
    assert engine["command"] == ["python", "-m", "hicache_umbp.launch"]


def test_owned_flags_and_env_are_rejected_by_name() -> None:
    def collide(s: dict[str, Any]) -> None:
        s["engine"]["extraArgs"] = [
            "--tp-size=4",
            "--hicache-size",
            "10",
            "--page-size",
            "--trust-remote-code",
        ]
        s["engine"]["env"] = [
            {"name": "HICACHE_TP_SIZE", "value": "1"},
            {"name": "UMBP_DRAM_CAPACITY", "value": "1"},
            {"name": "SGLANG_DP_RANK", "value": "0"},
            {"name": "FINE", "value": "1"},
        ]

    problems = _problems(_cr("deepseek-r1-mi355x.yaml", collide))
    assert _has(problems, "spec.engine.extraArgs[0]", "--tp-size")
    assert _has(problems, "spec.engine.extraArgs[1]", "--hicache-size")
    assert _has(problems, "spec.engine.extraArgs[3]", "--page-size")
    for i, name in enumerate(("HICACHE_TP_SIZE", "UMBP_DRAM_CAPACITY", "SGLANG_DP_RANK")):
        assert _has(problems, f"spec.engine.env[{i}].name", name)
    assert len(problems) == 6


@pytest.mark.parametrize(
    ("arg", "owned"),
    [
        ("--model=/other", "--model"),
        ("--page-s", "--page-size"),
        ("--tp", "--tp-size"),
        ("--hicache", "--hicache-"),
        ("--enable-hier", "--enable-hierarchical-cache"),
    ],
)
def test_aliases_and_abbreviations_of_owned_flags_are_rejected(arg: str, owned: str) -> None:
    """SGLang's argparse resolves aliases and unambiguous prefixes to the owned flag."""
    def mutate(s: dict[str, Any]) -> None:
        s.setdefault("engine", {})["extraArgs"] = [arg, "8"]

    problems = _problems(_cr("minimal-dram-only.yaml", mutate))
    assert _has(problems, "spec.engine.extraArgs[0]", owned, "set by the operator"), problems


def test_flags_that_are_no_prefix_of_an_owned_flag_pass() -> None:
    args = ["--trust-remote-code", "--enable-dp-lm-head", "--mem-fraction-static", "0.8"]

    def mutate(s: dict[str, Any]) -> None:
        s.setdefault("engine", {})["extraArgs"] = args

    p = plan(_cr("minimal-dram-only.yaml", mutate), CONFIG)
    assert list(p.engine.sglang_argv[-len(args) :]) == args


def test_write_through_only_when_allowed() -> None:
    assert _has(
        _problems(
            _cr(
                "minimal-dram-only.yaml", lambda s: s["hiCache"].update(writePolicy="write_through")
            )
        ),
        "spec.hiCache.writePolicy",
        "allowWriteThrough",
    )
    p = plan(
        _cr(
            "minimal-dram-only.yaml",
            lambda s: s["hiCache"].update(writePolicy="write_through", allowWriteThrough=True),
        ),
        CONFIG,
    )
    assert _configmap_env(p.objects)["HICACHE_WRITE_POLICY"] == "write_through"


def test_layer_first_is_rejected() -> None:
    assert _has(
        _problems(
            _cr("minimal-dram-only.yaml", lambda s: s["hiCache"].update(memLayout="layer_first"))
        ),
        "spec.hiCache.memLayout",
        "page-first",
    )


def test_all_problems_are_reported_at_once() -> None:
    def many(s: dict[str, Any]) -> None:
        s["engine"]["tensorParallelSize"] = 0
        s["hiCache"]["memLayout"] = "sideways"
        s["l3"]["mode"] = "distributed"
        s["placement"]["gpuModel"] = "H100"
        s["bogus"] = 1

    problems = _problems(_cr("deepseek-r1-mi355x.yaml", many))
    paths = {p for p, _ in problems}
    assert {
        "spec.engine.tensorParallelSize",
        "spec.hiCache.memLayout",
        "spec.l3.mode",
        "spec.placement.gpuModel",
        "spec.bogus",
    } <= paths


@pytest.mark.parametrize("name", ["Upper", "9starts-with-digit", "a" * 53, "has_underscore"])
def test_bad_names_are_rejected(name: str) -> None:
    cr = _cr("minimal-dram-only.yaml")
    cr["metadata"]["name"] = name
    assert _has(_problems(cr), "metadata.name", "DNS-1035")


def test_no_l3_tier_is_rejected() -> None:
    problems = _problems(_cr("minimal-dram-only.yaml", lambda s: s.pop("l3")))
    assert _has(problems, "spec.l3", "no L3 tier")


# ----------------------------------------------------------------------------- placement


def test_mi355x_affinity_accepts_both_label_forms() -> None:
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    terms = pod_spec(p.objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    exprs = [t["matchExpressions"] for t in terms]
    assert [{"key": "amd.com/gpu.device-id", "operator": "In", "values": ["75a3", "75b3"]}] in exprs
    assert [{"key": "amd.com/gpu.device-id.75a3", "operator": "Gt", "values": ["0"]}] in exprs
    assert [{"key": "amd.com/gpu.device-id.75b3", "operator": "Gt", "values": ["0"]}] in exprs


def test_other_models_come_from_the_table() -> None:
    p = plan(
        _cr("minimal-dram-only.yaml", lambda s: s.update(placement={"gpuModel": "MI300X"})), CONFIG
    )
    terms = pod_spec(p.objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["74a1"]
    assert _has(
        _problems(
            _cr("minimal-dram-only.yaml", lambda s: s.update(placement={"gpuModel": "MI999X"}))
        ),
        "spec.placement.gpuModel",
        "MI999X",
    )


def test_user_required_node_terms_are_anded_with_gpu_terms() -> None:
    def zones(s: dict[str, Any]) -> None:
        s["placement"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    ]
                }
            }
        }

    p = plan(_cr("deepseek-r1-mi355x.yaml", zones), CONFIG)
    terms = pod_spec(p.objects)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2 * 4  # 2 user terms x 4 GPU label-form terms
    assert all(t["matchExpressions"][0]["key"] == "zone" for t in terms)


def test_gpu_taint_tolerated_unhealthy_never_by_default() -> None:
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    tolerations = pod_spec(p.objects)["tolerations"]
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert all(t.get("key") != "amd-gpu-unhealthy" and t.get("key") for t in tolerations)
    assert not any("amd-gpu-unhealthy" in w for w in p.warnings)
    p2 = plan(
        _cr(
            "deepseek-r1-mi355x.yaml",
            lambda s: s["placement"].update(tolerations=[{"operator": "Exists"}]),
        ),
        CONFIG,
    )
    assert any("amd-gpu-unhealthy" in w for w in p2.warnings)


def test_gpu_requests_and_limits() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    res = _engine(p.objects)["resources"]
    assert res["requests"]["amd.com/gpu"] == res["limits"]["amd.com/gpu"] == "4"


# ----------------------------------------------------------------------------- NUMA


def test_rank_numa_map_and_single_numa_node_verdict() -> None:
    p8 = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    assert [r["numaNode"] for r in p8.status_plan["ranks"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert p8.status_plan["topology"]["singleNumaNodeCompatible"] is False
    assert any(
        "single-numa-node" in w and "8 GPUs per pod span 2 NUMA nodes" in w for w in p8.warnings
    )
    p4 = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    assert p4.status_plan["topology"] == {
        "singleNumaNodeCompatible": True,
        "reasons": [],
        "podsPerNode": 2,
        "podsPerNodeLimitedBy": ["gpus"],
    }


def test_node_facts_override_the_map() -> None:
    facts = NodeFacts(gpu_numa=[1, 1, 1, 1, 0, 0, 0, 0], memory="4Ti")
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG, facts)
    assert [r["numaNode"] for r in p.status_plan["ranks"]] == [1, 1, 1, 1, 0, 0, 0, 0]
    one_socket = NodeFacts(numa_nodes=1, gpus_per_numa_node=8, memory="4Ti")
    p1 = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG, one_socket)
    assert p1.status_plan["topology"]["singleNumaNodeCompatible"] is True


# ----------------------------------------------------------------------------- SSD


def test_ssd_capacity_above_volume_minus_headroom() -> None:
    problems = _problems(
        _cr("deepseek-r1-mi355x.yaml", lambda s: s["l3"]["ssd"].update(capacity="3400Gi"))
    )
    # 3500Gi - 5% (175Gi) = 3325Gi = 3570191564800 B < 3400Gi
    assert _has(problems, "spec.l3.ssd.capacity", "3400Gi", "3570191564800 B")


def test_pvc_ssd_via_volume_claim_templates() -> None:
    p = plan(_cr("llama-3.1-405b-mi355x.yaml"), CONFIG)
    sts = p.objects[-1]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "local-nvme"
    assert claim["spec"]["resources"]["requests"]["storage"] == "3500Gi"
    assert {"name": "umbp-ssd", "mountPath": "/mnt/umbp-ssd"} in _engine(p.objects)["volumeMounts"]
    assert p.ssd.rank_dirs[7] == "/mnt/umbp-ssd/rank-7"


def test_emptydir_ssd_requests_ephemeral_storage() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    vol = next(v for v in pod_spec(p.objects)["volumes"] if v["name"] == "umbp-ssd")
    assert vol == {"name": "umbp-ssd", "emptyDir": {"sizeLimit": "900Gi"}}
    ssd = next(c for c in all_containers(p.objects) if c["name"] == "umbp-ssd")
    assert ssd["resources"]["requests"]["ephemeral-storage"] == "900Gi"


@pytest.mark.parametrize(
    "path,prefixes,ok",
    [
        ("/mnt/nvme0", [], False),
        ("/mnt/nvme0", ["/mnt"], True),
        ("/mnt/../etc", ["/mnt"], False),
        ("/mntx/data", ["/mnt"], False),
        ("/var/lib/kubelet", ["/mnt/"], False),
    ],
)
def test_host_path_only_under_admin_prefixes(path: str, prefixes: list[str], ok: bool) -> None:
    config = OperatorConfig(policy=AdminPolicy(allowed_host_path_prefixes=prefixes))

    def host(s: dict[str, Any]) -> None:
        s["l3"]["ssd"]["volume"] = {"hostPath": {"path": path, "size": "3500Gi"}}

    cr = _cr("deepseek-r1-mi355x.yaml", host)
    if ok:
        vol = next(
            v for v in pod_spec(plan(cr, config).objects)["volumes"] if v["name"] == "umbp-ssd"
        )
        assert vol["hostPath"]["path"] == path
    else:
        assert _has(_problems(cr, config), "spec.l3.ssd.volume.hostPath.path", "admin policy")


def test_host_path_ssd_warns_that_fs_group_does_not_apply() -> None:
    policy = OperatorConfig(policy=AdminPolicy(allowed_host_path_prefixes=["/mnt"]))

    def host_path(s: dict[str, Any]) -> None:
        s["l3"]["ssd"]["volume"] = {"hostPath": {"path": "/mnt/nvme0", "size": "4Ti"}}

    p = plan(_cr("deepseek-r1-mi355x.yaml", host_path), policy)
    assert any("writable by uid 10001" in w for w in p.warnings), p.warnings
    p = plan(_cr("deepseek-r1-mi355x.yaml"), policy)
    assert not any("fsGroup" in w for w in p.warnings)


def test_model_volume_host_path_needs_the_policy_too() -> None:
    cr = _cr(
        "minimal-dram-only.yaml", lambda s: s["model"].update(volume={"hostPath": {"path": "/etc"}})
    )
    assert _has(_problems(cr), "spec.model.volume.hostPath.path", "admin policy")


# ----------------------------------------------------------------------------- security


def test_engine_security_context_defaults() -> None:
    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    spec = pod_spec(p.objects)
    ctx = _engine(p.objects)["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert ctx["allowPrivilegeEscalation"] is False
    assert "privileged" not in ctx
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostIPC" not in spec and "hostNetwork" not in spec
    assert spec["automountServiceAccountToken"] is False
    # Non-root identity pinned in the pod (the engine image's uid), SSD volumes group-writable.
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
    }


def test_engine_pod_identity_comes_from_the_operator_config() -> None:
    """The admin sets uid/gids (e.g. the hosts' render/video gids for /dev/kfd, /dev/dri);
    sidecars share the pod-level identity. A CR has no field for it."""
    config = OperatorConfig.from_mapping(
        {
            "enginePodSecurity": {
                "runAsUser": 20000,
                "runAsGroup": 20000,
                "supplementalGroups": [44, 992],
                "fsGroup": None,
            }
        }
    )
    p = plan(_cr("deepseek-r1-mi355x.yaml"), config)
    assert pod_spec(p.objects)["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 20000,
        "runAsGroup": 20000,
        "supplementalGroups": [44, 992],
    }
    root = OperatorConfig.from_mapping(
        {"enginePodSecurity": {"runAsNonRoot": False, "runAsUser": 0, "fsGroup": None}}
    )
    ctx = pod_spec(plan(_cr("minimal-dram-only.yaml"), root).objects)["securityContext"]
    assert ctx == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 0}
    bad = _cr("minimal-dram-only.yaml", lambda s: s.update(enginePodSecurity={"runAsUser": 0}))
    assert _has(_problems(bad), "spec.enginePodSecurity", "unknown field")


@pytest.mark.parametrize(
    ("identity", "fragment"),
    [
        ({"runAsUser": 0}, "runAsUser 0 (root) contradicts runAsNonRoot true"),
        ({"supplementalGroups": [44, 44]}, "lists a gid twice"),
        ({"supplementalGroups": [-1]}, "enginePodSecurity.supplementalGroups.0"),
        ({"fsGroup": "render"}, "enginePodSecurity.fsGroup"),
    ],
)
def test_bad_engine_pod_identity_is_a_config_error(
    identity: dict[str, Any], fragment: str
) -> None:
    from hicache_operator.api.config import OperatorConfigError

    with pytest.raises(OperatorConfigError, match="enginePodSecurity") as err:
        OperatorConfig.from_mapping({"enginePodSecurity": identity})
    assert fragment in str(err.value)


def test_privileges_need_the_policy() -> None:
    def wants(s: dict[str, Any]) -> None:
        s["security"] = {"privileged": True, "hostIPC": True, "capabilities": ["SYS_ADMIN"]}

    problems = _problems(_cr("minimal-dram-only.yaml", wants))
    assert _has(problems, "spec.security.privileged", "admin policy")
    assert _has(problems, "spec.security.hostIPC", "admin policy")
    assert _has(problems, "spec.security.capabilities[0]", "SYS_ADMIN")
    policy = AdminPolicy(
        allow_privileged=True,
        allow_host_ipc=True,
        allowed_capabilities=["IPC_LOCK", "CAP_SYS_ADMIN"],
    )
    p = plan(_cr("minimal-dram-only.yaml", wants), OperatorConfig(policy=policy))
    ctx = _engine(p.objects)["securityContext"]
    assert ctx["privileged"] is True and ctx["capabilities"]["add"] == ["IPC_LOCK", "SYS_ADMIN"]
    assert pod_spec(p.objects)["hostIPC"] is True


def test_sys_nice_removes_the_numa_warning_when_allowed() -> None:
    policy = AdminPolicy(allowed_capabilities=["IPC_LOCK", "SYS_NICE"])
    cr = _cr("minimal-dram-only.yaml", lambda s: s.update(security={"capabilities": ["SYS_NICE"]}))
    p = plan(cr, OperatorConfig(policy=policy))
    assert not any("CAP_SYS_NICE" in w for w in p.warnings)
    assert any("CAP_SYS_NICE" in w for w in plan(_cr("minimal-dram-only.yaml"), CONFIG).warnings)


# ----------------------------------------------------------------------------- standalone


def test_standalone_sidecars_one_per_medium_share_the_socket_dir() -> None:
    p = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    spec = pod_spec(p.objects)
    sidecars = {c["name"]: c for c in spec["initContainers"]}
    assert set(sidecars) == {"umbp-dram", "umbp-ssd"}
    for medium, c in sidecars.items():
        assert c["restartPolicy"] == "Always"
        sock = f"/var/run/umbp/{medium.removeprefix('umbp-')}.sock"
        assert c["command"] == ["umbp_standalone_server", f"unix:{sock}"]
        assert {"name": "umbp-sockets", "mountPath": "/var/run/umbp"} in c["volumeMounts"]
    assert {"name": "umbp-sockets", "mountPath": "/var/run/umbp"} in _engine(p.objects)[
        "volumeMounts"
    ]
    dram_env = {e["name"]: e["value"] for e in sidecars["umbp-dram"]["env"]}
    assert dram_env["UMBP_DRAM_CAPACITY"] == str(256 * GI)
    ssd_env = {e["name"]: e["value"] for e in sidecars["umbp-ssd"]["env"]}
    assert ssd_env["UMBP_SSD_CAPACITY"] == str(800 * GI)
    assert ssd_env["UMBP_SSD_DIR"] == "/mnt/umbp-ssd"
    env = _configmap_env(p.objects)
    assert env["HICACHE_UMBP_MODE"] == "standalone"
    assert "HICACHE_UMBP_DRAM_BYTES" not in env  # embedded-only keys are never rendered
    # DRAM sidecar holds its 4 KiB-backed 256Gi plus 2Gi overhead.
    assert sidecars["umbp-dram"]["resources"]["limits"]["memory"] == "258Gi"


def test_standalone_needs_a_dram_server() -> None:
    problems = _problems(
        _cr("llama-3.1-70b-mi355x.yaml", lambda s: s["l3"]["dram"].update(capacity=0))
    )
    assert _has(problems, "spec.l3.dram.capacity", "standalone")


# ----------------------------------------------------------------------------- objects


def test_objects_are_deterministic_labelled_and_without_owner_refs() -> None:
    a = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    b = plan(_cr("llama-3.1-70b-mi355x.yaml"), CONFIG)
    assert a.objects == b.objects
    assert [f"{o['kind']}/{o['metadata']['name']}" for o in a.objects] == [
        "ConfigMap/llama-70b-hicache",
        "Service/llama-70b-headless",
        "Service/llama-70b",
        "PodDisruptionBudget/llama-70b",
        "StatefulSet/llama-70b",
    ]
    for o in a.objects:
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "sglang-hicache"
        assert labels["app.kubernetes.io/instance"] == "llama-70b"
        assert labels["app.kubernetes.io/managed-by"] == "sglang-hicache-operator"
        assert labels["app.kubernetes.io/component"] in {"engine", "config"}
        assert o["metadata"]["namespace"] == "inference"
        assert "ownerReferences" not in o["metadata"]
    headless = a.objects[1]
    assert headless["spec"]["clusterIP"] == "None"
    assert a.objects[-1]["spec"]["serviceName"] == "llama-70b-headless"


def test_config_change_rolls_pods_via_the_hash_annotation() -> None:
    a = plan(_cr("minimal-dram-only.yaml"), CONFIG)
    b = plan(
        _cr("minimal-dram-only.yaml", lambda s: s["l3"]["dram"].update(capacity="128Gi")), CONFIG
    )
    key = "hicache.sglang.ai/config-hash"

    def annotation(p: Any) -> str:
        return str(p.objects[-1]["spec"]["template"]["metadata"]["annotations"][key])

    assert annotation(a) != annotation(b)


def test_status_plan_is_valid_status() -> None:
    from hicache_operator.api.status import PlanStatus

    p = plan(_cr("deepseek-r1-mi355x.yaml"), CONFIG)
    parsed = PlanStatus.model_validate(p.status_plan)
    assert parsed.gpus_per_pod == 8 and parsed.host_pool_bytes_per_rank == 200 * GI


def test_env_names_the_operator_sets_in_the_pod_are_owned() -> None:
    cr = _cr(
        "minimal-dram-only.yaml",
        lambda s: s.update(engine={"env": [{"name": "POD_NAME", "value": "x"}]}),
    )
    assert _has(_problems(cr), "spec.engine.env[0].name", "POD_NAME")


def test_ssd_volume_retention_keeps_pvcs_unless_the_cr_opts_in() -> None:
    """PVCs survive scale-down always, and the CR's deletion unless deleteWithResource."""
    cr = load_example("deepseek-r1-mi355x.yaml")
    policy = _sts_of(plan(cr, OperatorConfig()))["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert policy == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    cr["spec"]["l3"]["ssd"]["volume"]["claimTemplate"]["deleteWithResource"] = True
    sts = _sts_of(plan(cr, OperatorConfig()))
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    assert "deleteWithResource" not in str(sts["spec"]["volumeClaimTemplates"])


def _sts_of(result: Any) -> dict[str, Any]:
    return next(o for o in result.objects if o["kind"] == "StatefulSet")


def test_parse_errors_and_semantic_problems_are_reported_together() -> None:
    """A field that fails to parse does not hide the CR's other problems; its own echoes
    (e.g. 'set exactly one of hostPoolPerRank or hostPoolRatio') are not repeated."""
    cr = load_example("deepseek-r1-mi355x.yaml")
    cr["spec"]["hiCache"].update(hostPoolPerRank="10Gx", memLayout="layer_first")
    cr["spec"]["engine"]["tensorParallelSize"] = 16
    cr["spec"]["placement"]["gpuModel"] = "H100"
    with pytest.raises(SpecError) as info:
        plan(cr, OperatorConfig())
    paths = [p for p, _ in info.value.problems]
    assert "spec.hiCache.hostPoolPerRank" in paths
    assert "spec.placement.gpuModel" in paths
    assert "spec.hiCache.memLayout" in paths
    assert any(p.startswith("spec.engine") for p in paths)
    assert "spec.hiCache" not in paths


def test_pdb_is_planned_only_for_more_than_one_replica() -> None:
    cr = load_example("llama-3.1-70b-mi355x.yaml")
    assert cr["spec"]["replicas"] == 2
    kinds = [o["kind"] for o in plan(cr, OperatorConfig()).objects]
    assert "PodDisruptionBudget" in kinds
    cr["spec"]["replicas"] = 1
    assert "PodDisruptionBudget" not in [o["kind"] for o in plan(cr, OperatorConfig()).objects]
