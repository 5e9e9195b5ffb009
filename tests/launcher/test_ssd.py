"""SSD tier preparation on a real temporary filesystem with a fake mount table.

Real: directory creation, the write probe, statvfs free space, disk usage. Faked: the mount
table (/proc/self/mountinfo of the fake root, so a read-only mount can be shown to a test running
as root) and the io_uring syscall probe where a test needs io_uring to be blocked.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch
from hicache_umbp.launch.ssd import io_uring_syscall_probe

from .conftest import io_uring_blocked, io_uring_ok, launch_env
from .fakenode import MIB, FakeNode

# 16 MiB per rank: the check reads the real filesystem's free space, which a machine running
# other jobs may have little of (1 GiB per rank failed here with 6.7 GiB free).
SSD = dict(umbp_ssd_enabled=True, umbp_ssd_dir="/mnt/nvme", umbp_ssd_bytes=16 * MIB)


def _plan(node: FakeNode, probe=io_uring_ok, **env: object):
    return plan_launch(launch_env(**{**SSD, **env}), NodeRoot(node.root), io_uring_probe=probe)


def _error(node: FakeNode, probe=io_uring_ok, **env: object) -> LaunchError:
    with pytest.raises(LaunchError) as e:
        _plan(node, probe, **env)
    assert e.value.reason == "SsdUnavailable"
    return e.value


def test_rank_directories_are_created_and_written(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    plan = _plan(mi355x)
    ssd = plan.report["ssd"]
    assert ssd["rank_dirs"] == [f"/mnt/nvme/rank-{i}" for i in range(8)]
    assert ssd["capacity_bytes"] == 8 * 16 * MIB
    assert ssd["io_backend"] == "io_uring"
    for i in range(8):
        assert os.listdir(mi355x.p(f"/mnt/nvme/rank-{i}")) == []  # the probe file is gone
    st = os.statvfs(mi355x.p("/mnt/nvme"))
    assert 0 < ssd["free_bytes"] <= st.f_blocks * st.f_frsize


def test_data_already_in_rank_directories_counts_as_cache(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    mi355x.write("/mnt/nvme/rank-0/segment-0", "x" * 65536)
    assert _plan(mi355x).report["ssd"]["used_by_cache_bytes"] >= 65536


def test_ssd_too_small_gives_the_numbers(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    err = _error(mi355x, umbp_ssd_bytes=1 << 50)
    assert re.fullmatch(
        r"SSD tier needs 8 x 1024 TiB = 8192 TiB \(HICACHE_UMBP_SSD_BYTES\) under "
        r"HICACHE_UMBP_SSD_DIR='/mnt/nvme'; the filesystem has [0-9.]+ [KMGT]iB free: the volume "
        r"is smaller than spec.l3.ssd.capacity or shared with other data", str(err)), str(err)


def test_read_only_mount_is_refused(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme", read_only=True)
    assert str(_error(mi355x)) == (
        "HICACHE_UMBP_SSD_DIR='/mnt/nvme' is on a read-only mount (/mnt/nvme); the SSD tier "
        "must write there: mount the volume read-write")
    assert not mi355x.p("/mnt/nvme/rank-0").exists()


def test_subdirectory_of_a_read_only_mount_is_refused(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme", read_only=True)
    mi355x.p("/mnt/nvme/cache").mkdir()
    err = _error(mi355x, umbp_ssd_dir="/mnt/nvme/cache")
    assert "is on a read-only mount (/mnt/nvme)" in str(err)


def test_missing_mount_is_refused(mi355x: FakeNode) -> None:
    assert str(_error(mi355x)) == (
        "HICACHE_UMBP_SSD_DIR='/mnt/nvme' does not exist or is not a directory: the SSD volume "
        "is not mounted there (check spec.l3.ssd.volume and the pod's volumeMounts)")


def test_unwritable_rank_directory_names_rank_and_errno(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    mi355x.write("/mnt/nvme/rank-3", "not a directory")
    assert str(_error(mi355x)) == (
        "cannot write rank 3's SSD directory '/mnt/nvme/rank-3' under HICACHE_UMBP_SSD_DIR="
        "'/mnt/nvme': File exists (errno EEXIST); the volume must be writable by the engine's "
        "user (fsGroup)")


def test_blocked_io_uring_fails_unless_posix_fallback_is_allowed(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    assert str(_error(mi355x, io_uring_blocked)) == (
        "HICACHE_UMBP_SSD_IO_BACKEND=io_uring is not available: io_uring_setup failed with "
        "EPERM: blocked (seccomp profile or kernel.io_uring_disabled). Allow io_uring in the "
        "pod's seccomp profile, choose ioBackend posix, or set "
        "HICACHE_SSD_ALLOW_POSIX_FALLBACK=true to fall back to posix")
    plan = _plan(mi355x, io_uring_blocked, ssd_allow_posix_fallback=True)
    assert plan.report["fallbacks"] == ["io_uring->posix"]
    assert plan.command.env_overrides["HICACHE_UMBP_SSD_IO_BACKEND"] == "posix"
    assert plan.command.extra_config["umbp_ssd_io_backend"] == "posix"


def test_io_uring_disabled_by_sysctl_needs_no_syscall(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    mi355x.write("/proc/sys/kernel/io_uring_disabled", "2\n")

    def must_not_run() -> str | None:
        raise AssertionError("the syscall probe ran although the sysctl disables io_uring")

    assert "io_uring is not available: kernel.io_uring_disabled=2 on the node" in str(
        _error(mi355x, must_not_run))


def test_posix_backend_skips_the_io_uring_probe(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/nvme")
    plan = _plan(mi355x, io_uring_blocked, umbp_ssd_io_backend="posix")
    assert plan.report["ssd"]["io_backend"] == "posix"
    assert plan.report["fallbacks"] == []


def test_real_io_uring_probe_answers() -> None:
    """The real syscall: either this kernel gives an io_uring (None) or says why not."""
    result = io_uring_syscall_probe()
    assert result is None or result.startswith("io_uring_setup failed with ")


def test_standalone_mode_leaves_the_ssd_to_the_sidecar(mi355x: FakeNode) -> None:
    plan_report: dict[str, Any] = {}
    with pytest.raises(LaunchError) as e:
        plan_launch(
            launch_env(umbp_mode="standalone", umbp_dram_bytes=None, umbp_ssd_enabled=True,
                       umbp_socket_dir="/run/umbp", umbp_standalone_wait_s=0),
            NodeRoot(mi355x.root), report=plan_report)
    assert e.value.reason == "StandaloneServerUnavailable"  # got past the SSD step
    assert plan_report["ssd"] is None
