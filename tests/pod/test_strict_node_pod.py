"""The generated pod on a node as strict as a real MI355X node (issue: findings 2, 7 and 10).

Real, as in test_serving_pod.py: the planner's objects, the launcher as the container command,
uid 10001 with the pod's groups, the RuntimeDefault seccomp profile generated from the
container's configured capabilities, the GPU device files' owner and mode, the kubelet's
``preStop`` and grace period. Faked: the GPUs (device files and sysfs of a MI355X node) and the
compute device (CPU).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .harness import admin_config, load_cr, plan_pod, running_pod, start_pod
from .node import NODE_RENDER_GID

pytestmark = pytest.mark.pod


def _report(pod: Any) -> dict[str, Any]:
    path = pod.volume_host_path("hicache-run") / "launch-report.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


@pytest.mark.timeout(300)
def test_an_engine_without_the_nodes_render_gid_fails_naming_it(node, image, workdir: Path,
                                                                 models_dir: Path) -> None:
    """The admin did not list the node's render gid: the device files (root:992 0660) cannot
    be opened by uid 10001, whose groups are the image's (44, 109) and fsGroup. The launcher
    fails before SGLang starts and says which gid and which setting."""
    planned = plan_pod(load_cr("cpu/tiny-llama-embedded.yaml"), admin_config(None))
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        engine = pod.container("engine")
        pod.wait(lambda: engine.exit_codes != [], 120, "engine exit")
        log = engine.log_text(20000)
        assert "GpuAccessDenied" in log, log
        assert f"Add gid {NODE_RENDER_GID}" in log and "enginePodSecurity.supplementalGroups" in log
        report = _report(pod)
        assert report["reason"] == "GpuAccessDenied" and not report["ok"]
    finally:
        pod.close()


def _launch_report(planned: Any, node: Any, image: Any, workdir: Path,
                   models_dir: Path) -> dict[str, Any]:
    """Start the planned pod, wait until the launcher wrote its report (or the engine exited),
    stop the pod; the report."""
    pod = start_pod(planned, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait(lambda: bool(_report(pod).get("argv"))
                 or pod.container("engine").exit_codes != [], 180, "launch report")
        return _report(pod)
    finally:
        pod.close()


@pytest.mark.timeout(600)
def test_numa_placement_is_bound_with_sys_nice_and_reported_degraded_without(
        node, image, workdir: Path, models_dir: Path) -> None:
    """numa: auto. With SYS_NICE allowed (the default policy) the engine container is configured
    with it, the RuntimeDefault profile admits mbind and the launcher reports the ranks bound.
    Where the admin policy does not allow it, the profile refuses get_mempolicy (EPERM) and the
    report says placement is degraded instead of claiming NUMA nodes; the plan warns too."""
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    no_nice = admin_config(node, policy={"allowedCapabilities": ["IPC_LOCK"]})
    planned = plan_pod(cr, no_nice)
    assert any(w.startswith("NUMA placement degraded") for w in planned.plan.warnings)
    report = _launch_report(planned, node, image, workdir / "no-nice", models_dir)
    assert report["numa_placement"] == "degraded", report
    assert report["numa_per_rank"] == [-1]
    planned = plan_pod(cr, admin_config(node))
    engine_sc = planned.statefulset["spec"]["template"]["spec"]["containers"][0][
        "securityContext"]
    assert "SYS_NICE" in engine_sc["capabilities"]["add"]
    report = _launch_report(planned, node, image, workdir / "nice", models_dir)
    assert report["numa_placement"] == "bound", report
    assert report["numa_per_rank"] == [0]


@pytest.mark.timeout(900)
def test_termination_runs_the_drain_hook_before_sigterm(node, image, workdir: Path,
                                                        models_dir: Path) -> None:
    """The planned preStop drains (readiness off, in-flight requests finish) inside the planned
    grace period; the kubelet sends SIGTERM only after it."""
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    with running_pod(cr, node, image, workdir, models_dir) as (pod, c):
        c.generate("a short prompt before the pod is deleted")
        engine = pod.container("engine")
        assert engine.spec["lifecycle"]["preStop"]["exec"]["command"][:3] == [
            "python", "-m", "hicache_umbp.drain"]
        engine.kill(reason="Killing")
        hooks = pod.events_of("engine", "PreStop")
        assert hooks, pod.events_of("engine")
        assert "drained" in hooks[0].message, hooks[0].message
