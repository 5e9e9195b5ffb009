"""Pod Security Admission (issue 25, item 6): a namespace enforcing ``baseline``.

Real: the operator (kopf, every module) reading the namespace's
``pod-security.kubernetes.io/enforce`` label; the emulator's Pod Security Admission
(``tests/emulator/admission.py``: an independent reading of the standards, refusing pod
creation with 403 as the built-in plugin does) and its StatefulSet controller recording
``FailedCreate``. Emulated: the API server and the StatefulSet controller; no kubelet runs the
pods.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_lib import NAMESPACE, REPO, Cluster, example
from emulator.store import ApiError
from hicache_operator.api import OperatorConfig
from hicache_operator.plan import plan

pytestmark = pytest.mark.e2e
ENFORCE = "pod-security.kubernetes.io/enforce"


def _enforce(cluster: Cluster, level: str) -> None:
    cluster.emu.patch("v1", "namespaces", None, NAMESPACE,
                      {"metadata": {"labels": {ENFORCE: level}}})


def _cr(name: str, **spec: Any) -> dict[str, Any]:
    cr = example(REPO / "examples" / "minimal-dram-only.yaml", name)
    cr["spec"].update(replicas=1, **spec)
    return cr


def test_the_emulator_refuses_what_the_operator_rendered_before(cluster: Cluster) -> None:
    """The StatefulSet planned without the namespace's level (what the operator created
    before) gets FailedCreate and no pod: its engine adds IPC_LOCK and SYS_NICE."""
    _enforce(cluster, "baseline")
    sts = next(o for o in plan(_cr("old"), OperatorConfig()).objects
               if o["kind"] == "StatefulSet")
    cluster.emu.create("apps/v1", "statefulsets", sts, NAMESPACE)
    failed = cluster.wait(lambda: [e for e in cluster.events("old")
                                   if e.get("reason") == "FailedCreate"], "FailedCreate")
    assert 'violates PodSecurity "baseline:latest"' in failed[0]["message"]
    assert "IPC_LOCK" in failed[0]["message"]
    assert cluster.pods("old") == []
    pod = {"metadata": {"name": "direct"}, "spec": sts["spec"]["template"]["spec"]}
    with pytest.raises(ApiError) as err:
        cluster.emu.create("v1", "pods", pod, NAMESPACE)
    assert err.value.status == 403


def test_baseline_namespace_gets_pods_without_the_capabilities(cluster: Cluster,
                                                               operator: Any) -> None:
    _enforce(cluster, "baseline")
    cluster.apply(_cr("psa"))
    cluster.wait(lambda: len(cluster.pods("psa")) == 1, "the pod, admitted")
    sts = cluster.child(("apps/v1", "statefulsets"), "psa")
    assert sts is not None
    engine = sts["spec"]["template"]["spec"]["containers"][0]
    assert "add" not in engine["securityContext"]["capabilities"]
    valid = cluster.wait_condition("psa", "SpecValid", "True")
    assert "refuses the capabilities IPC_LOCK" in valid["message"]
    assert not [e for e in cluster.events("psa") if e.get("reason") == "FailedCreate"]


def test_what_baseline_cannot_admit_is_said_before_anything_is_created(
        cluster: Cluster, operator: Any) -> None:
    """The CR itself asks for SYS_NICE (the admin policy allows it, baseline does not): the
    CR says why and which level the namespace needs, and no child exists."""
    _enforce(cluster, "baseline")
    cluster.apply(_cr("needs", security={"capabilities": ["SYS_NICE"]}))
    cond = cluster.wait_condition("needs", "SpecValid", "False", "PodSecurityRejects")
    assert f"{ENFORCE}=privileged" in cond["message"] and "SYS_NICE" in cond["message"]
    assert cluster.children("needs") == {}
    assert any(e.get("reason") == "PodSecurityRejects" for e in cluster.events("needs"))
    # The namespace is relabelled: the next reconcile (resync) creates the workload.
    _enforce(cluster, "privileged")
    cluster.wait(lambda: cluster.child(("apps/v1", "statefulsets"), "needs"),
                 "the StatefulSet after the relabel", 60)
    cluster.wait(lambda: len(cluster.pods("needs")) == 1, "the pod")
