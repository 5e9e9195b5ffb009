"""The SSD volume the planner plans (PVC, emptyDir, admin-allowed hostPath) and the security
contexts it grants only with the admin policy (real planner and policy models)."""

from __future__ import annotations

from typing import Any

import pytest
from hicache_operator.api.config import AdminPolicy, OperatorConfig
from hicache_operator.plan import plan
from shc_testlib import CONFIG, all_containers, pod_spec
from shc_testlib import engine_container as _engine
from shc_testlib import example_cr as _cr
from shc_testlib import has_problem as _has
from shc_testlib import plan_problems as _problems

# ----------------------------------------------------------------------------- SSD


def test_ssd_capacity_above_volume_minus_headroom() -> None:
    problems = _problems(
        _cr("deepseek-r1-mi355x.yaml", lambda s: s["l3"]["ssd"].update(capacity="3400Gi"))
    )
    # 3500Gi - 5% (175Gi) = 3325Gi = 3570191564800 B < 3400Gi
    assert _has(problems, "spec.l3.ssd.capacity", "3400Gi", "3570191564800 B")


@pytest.mark.parametrize(("engine", "dirs"), [
    ("mori", tuple(f"/mnt/umbp-ssd/rank-{r}" for r in range(8))),  # one directory per rank
    ("hicache", ("/mnt/umbp-ssd",)),  # the pod's ranks share the drive
])
def test_pvc_ssd_via_volume_claim_templates(engine: str, dirs: tuple[str, ...]) -> None:
    p = plan(_cr("llama-3.1-405b-mi355x.yaml",
                 lambda s: s["l3"]["ssd"].update(engine=engine)), CONFIG)
    sts = p.objects[-1]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "umbp-ssd"  # the name single-drive pods always had
    assert claim["spec"]["storageClassName"] == "local-nvme"
    assert claim["spec"]["resources"]["requests"]["storage"] == "3500Gi"
    assert {"name": "umbp-ssd", "mountPath": "/mnt/umbp-ssd"} in _engine(p.objects)["volumeMounts"]
    assert p.ssd.dirs == dirs


@pytest.mark.parametrize(("engine", "container"), [("mori", "umbp-ssd"), ("hicache", "engine")])
def test_emptydir_ssd_requests_ephemeral_storage(engine: str, container: str) -> None:
    """Standalone: the mori engine's SSD lives in the umbp-ssd sidecar, the hicache engine's
    in the engine container (no umbp-ssd sidecar at all)."""
    def empty_dir(s: dict[str, Any]) -> None:
        s["l3"]["ssd"].update(engine=engine, volume={"emptyDir": {"sizeLimit": "900Gi"}})

    p = plan(_cr("llama-3.1-70b-mi355x.yaml", empty_dir), CONFIG)
    vol = next(v for v in pod_spec(p.objects)["volumes"] if v["name"] == "umbp-ssd")
    assert vol == {"name": "umbp-ssd", "emptyDir": {"sizeLimit": "900Gi"}}
    holder = next(c for c in all_containers(p.objects) if c["name"] == container)
    assert holder["resources"]["requests"]["ephemeral-storage"] == "900Gi"
    assert {"name": "umbp-ssd", "mountPath": "/mnt/umbp-ssd"} in holder["volumeMounts"]
    names = {c["name"] for c in all_containers(p.objects)}
    assert ("umbp-ssd" in names) == (engine == "mori")


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
    # SYS_NICE: numa auto needs mbind, which RuntimeDefault seccomp gates on it
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_NICE"]}
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
        allowHostIPC=True,
        allowed_capabilities=["IPC_LOCK", "CAP_SYS_ADMIN"],
    )
    p = plan(_cr("minimal-dram-only.yaml", wants), OperatorConfig(policy=policy))
    ctx = _engine(p.objects)["securityContext"]
    assert ctx["privileged"] is True and ctx["capabilities"]["add"] == ["IPC_LOCK", "SYS_ADMIN"]
    assert pod_spec(p.objects)["hostIPC"] is True


def test_sys_nice_removes_the_numa_warning_when_allowed() -> None:
    policy = AdminPolicy(allowed_capabilities=["IPC_LOCK", "SYS_NICE"])
    p = plan(_cr("minimal-dram-only.yaml"), OperatorConfig(policy=policy))
    assert not any("CAP_SYS_NICE" in w for w in p.warnings)
    no_nice = OperatorConfig(policy=AdminPolicy(allowed_capabilities=["IPC_LOCK"]))
    assert any("CAP_SYS_NICE" in w for w in plan(_cr("minimal-dram-only.yaml"), no_nice).warnings)
