"""Pod Security Admission (issue 25, item 6): the pure checker and what the planner renders for
a namespace's enforced level.

Real: ``planner.pod_security`` and ``plan()`` on the examples; the checker is compared with the
emulator's independent reading of the same standards (``tests/emulator/admission.py``) on every
object the planner renders. Nothing is faked."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from emulator.admission import violations as emulator_violations
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import SpecError, plan
from hicache_operator.planner.pod_security import check_pod, least_level, parse_level
from shc_testlib import load_example

pytestmark = pytest.mark.unit
CONFIG = OperatorConfig()
EXAMPLES = ("deepseek-r1-mi355x.yaml", "llama-3.1-70b-mi355x.yaml", "minimal-dram-only.yaml")


def _cr(name: str, mutate: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    cr = copy.deepcopy(load_example(name))
    if mutate is not None:
        mutate(cr["spec"])
    return cr


def _pods(p: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(o["kind"], o["spec"]["template"]) for o in p.objects
            if o["kind"] in ("StatefulSet", "Deployment")]


def _engine_caps(p: Any) -> list[str]:
    sts = next(o for o in p.objects if o["kind"] == "StatefulSet")
    ctx = sts["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    return list(ctx["capabilities"].get("add") or [])


BASE_POD: dict[str, Any] = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "c", "image": "x", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
    "volumes": [{"name": "v", "emptyDir": {}}],
}


def _with(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    pod = copy.deepcopy(BASE_POD)
    mutate(pod)
    return pod


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    # (name, mutation, the least level that admits it)
    ("compliant", lambda p: None, "restricted"),
    ("IPC_LOCK", lambda p: p["containers"][0]["securityContext"]["capabilities"]
     .update(add=["IPC_LOCK"]), "privileged"),
    ("CHOWN", lambda p: p["containers"][0]["securityContext"]["capabilities"]
     .update(add=["CHOWN"]), "baseline"),
    ("NET_BIND_SERVICE", lambda p: p["containers"][0]["securityContext"]["capabilities"]
     .update(add=["NET_BIND_SERVICE"]), "restricted"),
    ("privileged", lambda p: p["containers"][0]["securityContext"].update(privileged=True),
     "privileged"),
    ("hostIPC", lambda p: p.update(hostIPC=True), "privileged"),
    ("hostPath", lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/mnt"}}),
     "privileged"),
    ("hostPort", lambda p: p["containers"][0].update(ports=[{"containerPort": 1,
                                                             "hostPort": 80}]), "privileged"),
    ("procMount", lambda p: p["containers"][0]["securityContext"].update(
        procMount="Unmasked"), "privileged"),
    ("unsafe sysctl", lambda p: p["securityContext"].update(
        sysctls=[{"name": "vm.max_map_count", "value": "1"}]), "privileged"),
    ("safe sysctl", lambda p: p["securityContext"].update(
        sysctls=[{"name": "net.ipv4.tcp_syncookies", "value": "1"}]), "restricted"),
    ("seccomp unconfined", lambda p: p["securityContext"].update(
        seccompProfile={"type": "Unconfined"}), "privileged"),
    ("seccomp unset", lambda p: p["securityContext"].pop("seccompProfile"), "baseline"),
    ("selinux user", lambda p: p["securityContext"].update(
        seLinuxOptions={"user": "system_u"}), "privileged"),
    ("apparmor unconfined", lambda p: p["securityContext"].update(
        appArmorProfile={"type": "Unconfined"}), "privileged"),
    ("nfs volume", lambda p: p["volumes"].append({"name": "n", "nfs": {"server": "s",
                                                                        "path": "/"}}),
     "baseline"),
    ("escalation", lambda p: p["containers"][0]["securityContext"].pop(
        "allowPrivilegeEscalation"), "baseline"),
    ("root allowed", lambda p: p["securityContext"].pop("runAsNonRoot"), "baseline"),
    ("uid 0", lambda p: p["securityContext"].update(runAsUser=0), "baseline"),
    ("no drop ALL", lambda p: p["containers"][0]["securityContext"].pop("capabilities"),
     "baseline"),
]


@pytest.mark.parametrize(("name", "mutate", "need"), CASES, ids=[c[0] for c in CASES])
def test_each_control_at_each_level_agrees_with_the_emulators_reading(
        name: str, mutate: Callable[[dict[str, Any]], None], need: str) -> None:
    pod = _with(mutate)
    assert least_level(pod) == need
    for level in ("baseline", "restricted"):
        ours = bool(check_pod(pod, level))
        theirs = bool(emulator_violations({"spec": pod}, level))
        assert ours == theirs, (level, check_pod(pod, level))


def test_a_label_that_is_no_level_is_enforced_as_restricted_and_warned() -> None:
    assert parse_level(None) == "privileged" and parse_level("baseline") == "baseline"
    assert parse_level("strict") is None
    p = plan(_cr("minimal-dram-only.yaml"), CONFIG, pod_security="strict")
    assert any("'strict' is not a level" in w for w in p.warnings)
    assert _engine_caps(p) == []


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_the_examples_render_what_baseline_and_restricted_admit(example: str,
                                                                level: str) -> None:
    """Without the namespace's level the engine adds IPC_LOCK and SYS_NICE (the chart's
    policy allows them), which both levels refuse; with it, neither, NUMA binding degraded
    and warned, and every rendered pod passes both readings of the standard."""
    assert set(_engine_caps(plan(_cr(example), CONFIG))) >= {"IPC_LOCK"}
    p = plan(_cr(example), CONFIG, pod_security=level)
    assert _engine_caps(p) == []
    for _, template in _pods(p):
        assert check_pod(template["spec"], level) == []  # type: ignore[arg-type]
        assert emulator_violations(template, level) == []
    assert any("refuses the capabilities" in w for w in p.warnings)
    if p.spec.hi_cache.host_allocator.numa == "auto":
        assert any("NUMA placement degraded" in w and "Pod Security" in w for w in p.warnings)


def test_what_cannot_be_dropped_is_refused_with_what_the_namespace_must_allow() -> None:
    """A CR asking for a capability, and a hostPath SSD: the plan names the level they need
    and why, with reason PodSecurityRejects, and nothing is planned."""
    config = OperatorConfig.model_validate({"policy": {
        "allowedCapabilities": ["IPC_LOCK", "SYS_NICE", "SYS_PTRACE"],
        "allowedHostPathPrefixes": ["/mnt/"]}})
    cr = _cr("minimal-dram-only.yaml", lambda s: s.update(
        security={"capabilities": ["SYS_PTRACE"]}))
    assert plan(cr, config, pod_security="privileged")
    with pytest.raises(SpecError) as err:
        plan(cr, config, pod_security="baseline")
    assert err.value.reason == "PodSecurityRejects"
    text = str(err.value)
    assert "enforces Pod Security level baseline" in text and "SYS_PTRACE" in text
    assert "pod-security.kubernetes.io/enforce=privileged" in text
    assert "spec.security.capabilities" in text
    ssd = _cr("minimal-dram-only.yaml", lambda s: s["l3"].update(
        ssd={"enabled": True, "capacity": "10Gi", "ioBackend": "posix",
             "volume": {"hostPath": {"path": "/mnt/nvme0", "size": "20Gi"}}}))
    with pytest.raises(SpecError) as err2:
        plan(ssd, config, pod_security="restricted")
    assert "hostPath" in str(err2.value) and err2.value.reason == "PodSecurityRejects"
