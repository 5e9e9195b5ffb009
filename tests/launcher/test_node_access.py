"""What the launcher does about a real node's limits (issue: a real MI355X node is stricter).

Fake node trees as in test_command.py. These tests run as root (CI), which opens any file and
is never refused a syscall: the refusals are injected here (an opener raising ``EACCES`` for a
``root:<render gid> 0660`` device, a ``get_mempolicy`` probe answering ``EPERM``); the pod tier
(tests/pod/test_node_pod.py, test_strict_node_pod.py) meets the real ones as uid 10001 under
the RuntimeDefault seccomp profile.
"""

from __future__ import annotations

import errno
import os

import pytest
from hicache_umbp.launch.access import check_gpu_access, gpu_device_paths
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.gpus import probe_gpus
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch

from .conftest import io_uring_ok, launch_env
from .fakenode import FakeNode


def test_sglang_cpu_affinity_is_off_in_the_rendered_env(mi355x: FakeNode) -> None:
    """The upstream image sets SGLANG_SET_CPU_AFFINITY=1, and SGLang 0.5.23 then pins ranks to
    host cores outside the pod's cpuset (EINVAL under the static CPU manager): the launcher
    turns it off for the server it execs; per-rank NUMA placement stays the launcher's."""
    plan = plan_launch({**launch_env(), "SGLANG_SET_CPU_AFFINITY": "1"}, NodeRoot(mi355x.root),
                       io_uring_probe=io_uring_ok)
    assert plan.child_env["SGLANG_SET_CPU_AFFINITY"] == "0"
    assert plan.report["numa_per_rank"] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_gpu_device_the_pod_cannot_open_fails_with_the_gid_to_grant(mi355x: FakeNode) -> None:
    root = NodeRoot(mi355x.root)
    gpus = probe_gpus(root, {}).gpus[:2]
    kfd = mi355x.p("/dev/kfd")
    os.chown(kfd, 0, 992)
    os.chmod(kfd, 0o660)

    def deny(path: str, flags: int) -> int:
        assert flags & os.O_RDWR
        raise PermissionError(errno.EACCES, "Permission denied", path)

    with pytest.raises(LaunchError) as e:
        check_gpu_access(root, gpus, opener=deny)
    assert e.value.reason == "GpuAccessDenied"
    msg = str(e.value)
    assert "/dev/kfd" in msg and "owner 0:992, mode 0660" in msg
    assert "Add gid 992" in msg and "enginePodSecurity.supplementalGroups" in msg
    assert gpu_device_paths(gpus) == ["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD136"]


def test_a_missing_kfd_is_a_discovery_failure(mi355x: FakeNode) -> None:
    os.unlink(mi355x.p("/dev/kfd"))
    with pytest.raises(LaunchError) as e:
        plan_launch(launch_env(), NodeRoot(mi355x.root), io_uring_probe=io_uring_ok)
    assert e.value.reason == "GpuDiscoveryFailed" and "/dev/kfd does not exist" in str(e.value)


def test_refused_numa_syscalls_report_degraded_placement(mi355x: FakeNode) -> None:
    """Without CAP_SYS_NICE in the container's configuration, RuntimeDefault seccomp refuses
    mbind: the report says placement is degraded and no rank claims a NUMA node."""
    refused = "get_mempolicy is refused (EPERM): ..."
    plan = plan_launch(launch_env(), NodeRoot(mi355x.root), io_uring_probe=io_uring_ok,
                       mempolicy_probe=lambda: refused)
    assert plan.report["numa_placement"] == "degraded"
    assert plan.report["numa_per_rank"] == [-1] * 8
    assert "numa->unbound" in plan.report["fallbacks"]
    assert any(w.startswith("NUMA placement degraded") and "SYS_NICE" in w
               for w in plan.report["warnings"])
    assert plan.command.env_overrides["HICACHE_HOST_NUMA"] == ",".join(["-1"] * 8)


def test_granted_numa_syscalls_report_bound_placement(mi355x: FakeNode) -> None:
    plan = plan_launch(launch_env(), NodeRoot(mi355x.root), io_uring_probe=io_uring_ok,
                       mempolicy_probe=lambda: None)
    assert plan.report["numa_placement"] == "bound"
    assert plan.report["numa_per_rank"] == [0, 0, 0, 0, 1, 1, 1, 1]
