"""The chart's default admin policy, enforced by the operator: a namespace user who may create a
SGLangHiCache gains no more than with a plain pod (DESIGN.md §9).

Real: helm renders the operator configuration; the operator's own loader and planner judge CRs
with it. The rules themselves are unit-tested at the planner level; this checks that the chart's
defaults switch them on, and that admin overrides in values reach the operator.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from chartkit import rendered_operator_config

pytestmark = pytest.mark.chart

BASE: dict[str, Any] = {
    "apiVersion": "hicache.sglang.ai/v1alpha1", "kind": "SGLangHiCache",
    "metadata": {"name": "probe", "namespace": "models"},
    "spec": {"model": {"path": "/models/llama"}, "engine": {"tensorParallelSize": 1},
             "hiCache": {"hostPoolPerRank": "16Gi"},
             "l3": {"mode": "embedded", "dram": {"capacity": "32Gi"}}},
}


def _cr(**spec_patch: Any) -> dict[str, Any]:
    cr = copy.deepcopy(BASE)
    for key, value in spec_patch.items():
        cr["spec"][key] = value
    return cr


def _ssd_host_path(path: str) -> dict[str, Any]:
    return {"mode": "embedded", "dram": {"capacity": "32Gi"},
            "ssd": {"enabled": True, "capacity": "100Gi",
                    "volume": {"hostPath": {"path": path, "size": "200Gi"}}}}


def _problems(cr: dict[str, Any], values: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    from hicache_operator.api.config import OperatorConfig
    from hicache_operator.plan.orchestrate import plan
    from hicache_operator.planner.errors import SpecError

    config = OperatorConfig.from_mapping(rendered_operator_config(values), source="chart")
    try:
        plan(cr, config)
    except SpecError as e:
        return e.problems
    return []


def _pod(cr: dict[str, Any], values: dict[str, Any] | None = None) -> dict[str, Any]:
    from hicache_operator.api.config import OperatorConfig
    from hicache_operator.plan.orchestrate import plan

    config = OperatorConfig.from_mapping(rendered_operator_config(values), source="chart")
    sts = next(o for o in plan(cr, config).objects if o["kind"] == "StatefulSet")
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


REFUSED_BY_DEFAULT = {
    "ssd hostPath": (_cr(l3=_ssd_host_path("/mnt/nvme0")), "spec.l3.ssd.volume.hostPath"),
    "model hostPath": (_cr(model={"path": "/models/llama",
                                  "volume": {"hostPath": {"path": "/etc"}}}),
                       "spec.model.volume.hostPath.path"),
    "privileged": (_cr(security={"privileged": True}), "spec.security.privileged"),
    "hostIPC": (_cr(security={"hostIPC": True}), "spec.security.hostIPC"),
    "hostNetwork": (_cr(security={"hostNetwork": True}), "spec.security.hostNetwork"),
    "SYS_ADMIN": (_cr(security={"capabilities": ["SYS_ADMIN"]}), "spec.security.capabilities"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BY_DEFAULT))
def test_default_chart_policy_refuses_host_access(case: str) -> None:
    cr, field = REFUSED_BY_DEFAULT[case]
    problems = _problems(cr)
    assert problems, f"{case} was accepted under the chart's default policy"
    assert any(path.startswith(field) for path, _ in problems), problems


def test_default_chart_policy_pods_are_unprivileged() -> None:
    pod = _pod(_cr())
    assert not pod.get("hostIPC") and not pod.get("hostNetwork") and not pod.get("hostPID")
    assert not any("hostPath" in v for v in pod.get("volumes", []))
    for container in [*pod["containers"], *pod.get("initContainers", [])]:
        sc = container["securityContext"]
        assert sc.get("privileged", False) is False
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        # Non-root (uid 10001): a bounding set only, never held (no ambient capabilities);
        # SYS_NICE only lets RuntimeDefault seccomp admit mbind for NUMA binding.
        assert set(sc["capabilities"].get("add", [])) <= {"IPC_LOCK", "SYS_NICE"}


def test_default_chart_engine_pods_run_as_the_image_non_root_user() -> None:
    from hicache_operator.api.config import ENGINE_IMAGE_UID

    ctx = _pod(_cr())["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == ENGINE_IMAGE_UID
    assert "supplementalGroups" not in ctx


def test_gpu_device_groups_in_values_reach_the_engine_pods() -> None:
    """The hosts' render/video gids vary per OS image: the admin lists them in values."""
    values = {"operatorConfig": {"enginePodSecurity": {"supplementalGroups": [44, 992]}}}
    ctx = _pod(_cr(), values)["securityContext"]
    assert ctx["supplementalGroups"] == [44, 992] and ctx["runAsNonRoot"] is True


def test_admin_allow_list_in_values_reaches_the_operator() -> None:
    values = {"operatorConfig": {"policy": {"allowedHostPathPrefixes": ["/mnt/nvme0"]}}}
    assert _problems(_cr(l3=_ssd_host_path("/mnt/nvme0/cache")), values) == []
    pod = _pod(_cr(l3=_ssd_host_path("/mnt/nvme0/cache")), values)
    assert any(v.get("hostPath", {}).get("path") == "/mnt/nvme0/cache"
               for v in pod["volumes"])
    # a prefix is a directory boundary, and other paths stay refused
    for path in ("/mnt/nvme0-other", "/mnt/nvme1", "/etc", "/mnt"):
        assert _problems(_cr(l3=_ssd_host_path(path)), values), path
