"""The hicache SSD engine's drives at launch (``umbp_ssd_engine=hicache``), embedded and
standalone, on a real temporary filesystem with a fake mount table.

Real: the drive directories, the write probe, statvfs free space, the disk usage of what a
previous pod left in ``hicache-disk/``, UNIX sockets for the standalone DRAM sidecar. Faked: the
mount table (so a read-only mount can be shown to a test running as root), and where a test
needs a small volume, the statvfs of the drive (a declared size, as test_operator_boundary.py).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.load import load_store_config
from hicache_umbp.launch.errors import LaunchError
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch
from hicache_umbp.launch.ssd import drive_need
from hicache_umbp.launch.standalone import socket_paths

from .conftest import launch_env, listen_on
from .fakenode import GIB, MIB, FakeNode

DRIVES = "/mnt/umbp-ssd,/mnt/umbp-ssd-1"
OURS = dict(umbp_ssd_enabled=True, umbp_ssd_engine="hicache", umbp_ssd_dir=DRIVES,
            umbp_ssd_bytes=GIB)


def never_probed() -> str | None:
    raise AssertionError("the hicache engine never uses io_uring: no probe may run")


class SizedDrives(NodeRoot):
    """A node root whose drive mounts report ``free`` bytes free (the rest is real)."""

    def __init__(self, root: Path, free: int) -> None:
        super().__init__(root)
        self.free = free

    def statvfs(self, node_path: str) -> os.statvfs_result:
        real = super().statvfs(node_path)
        if not node_path.startswith("/mnt/umbp-ssd"):
            return real
        blocks = self.free // 4096
        return os.statvfs_result((4096, 4096, blocks * 2, blocks, blocks, real.f_files,
                                  real.f_ffree, real.f_favail, real.f_flag, real.f_namemax))


def _drives(node: FakeNode, *, read_only: tuple[str, ...] = ()) -> None:
    for d in DRIVES.split(","):
        node.ssd_mount(d, read_only=d in read_only)


def _plan(node: FakeNode, root: NodeRoot | None = None, **env: Any) -> Any:
    return plan_launch(launch_env(**{**OURS, **env}), root or NodeRoot(node.root),
                       io_uring_probe=never_probed)


def _error(node: FakeNode, root: NodeRoot | None = None, **env: Any) -> LaunchError:
    with pytest.raises(LaunchError) as e:
        _plan(node, root, **env)
    assert e.value.reason == "SsdUnavailable"
    return e.value


def test_every_drive_is_checked_and_written_without_rank_directories(mi355x: FakeNode) -> None:
    _drives(mi355x)
    ssd = _plan(mi355x).report["ssd"]
    assert ssd["engine"] == "hicache" and ssd["rank_dirs"] == []
    assert [d["dir"] for d in ssd["drives"]] == DRIVES.split(",")
    assert ssd["capacity_bytes"] == 8 * GIB  # 8 ranks x 1 GiB, one copy for the pod
    # each drive holds half, plus an index of 64 B per 4 KiB slot at most
    assert {d["need_bytes"] for d in ssd["drives"]} == {drive_need(4 * GIB)}
    assert drive_need(4 * GIB) == 4 * GIB + 4096 + 4 * GIB // 64
    assert ssd["io_backend"] == "preadv/pwritev threads" and ssd["io_backend_fallback"] is False
    for d in DRIVES.split(","):
        assert os.listdir(mi355x.p(d)) == []  # no rank directory, the probe file is gone


def test_index_bound_is_64_bytes_per_4_kib_slot() -> None:
    """``drive_need``: the share plus the index of its 4 KiB slots, whole 4 KiB pages."""
    assert drive_need(0) == 4096
    assert drive_need(4096 * 64) == 4096 * 64 + 4096 + 4096  # 4096 + 64 x 64 B -> 2 pages
    assert drive_need(GIB) == GIB + 4096 + GIB // 64


def test_a_drive_too_small_for_its_share_names_the_key_and_its_free_space(
        mi355x: FakeNode) -> None:
    _drives(mi355x)
    err = _error(mi355x, SizedDrives(mi355x.root, 3 * GIB))
    assert str(err) == (
        "umbp_ssd_bytes (HICACHE_UMBP_SSD_BYTES): the SSD tier's share of drive "
        "'/mnt/umbp-ssd' is 8 GiB / 2 drive(s) = 4 GiB + index = 4.06 GiB, but the volume has "
        "3 GiB free: lower spec.l3.ssd.capacity or give each drive a larger volume"), str(err)


def test_what_the_tier_already_holds_counts_as_free(mi355x: FakeNode) -> None:
    """A restarted pod finds its slot files on the drive: they are the tier's, not in the
    way (192 MiB free + 96 MiB of hicache-disk/ cover a 256 MiB share; without them, not)."""
    _drives(mi355x)
    small = SizedDrives(mi355x.root, 192 * MIB)
    assert "but the volume has 192 MiB free:" in str(
        _error(mi355x, small, umbp_ssd_bytes=64 * MIB))
    for d in DRIVES.split(","):
        data = mi355x.p(f"{d}/hicache-disk/data.hcd")
        data.parent.mkdir(parents=True)
        with open(data, "wb") as f:
            f.write(b"\1" * (96 * MIB))  # real blocks, not a sparse file
    ssd = _plan(mi355x, small, umbp_ssd_bytes=64 * MIB).report["ssd"]
    assert all(d["held_bytes"] >= 96 * MIB for d in ssd["drives"])
    assert ssd["used_by_cache_bytes"] >= 192 * MIB


def test_a_read_only_or_missing_drive_is_refused(mi355x: FakeNode) -> None:
    mi355x.ssd_mount("/mnt/umbp-ssd")
    assert "HICACHE_UMBP_SSD_DIR drive='/mnt/umbp-ssd-1' does not exist" in str(_error(mi355x))
    mi355x.ssd_mount("/mnt/umbp-ssd-1", read_only=True)
    assert str(_error(mi355x)) == (
        "HICACHE_UMBP_SSD_DIR drive='/mnt/umbp-ssd-1' is on a read-only mount "
        "(/mnt/umbp-ssd-1); the SSD tier must write there: mount the volume read-write")


def test_an_unwritable_drive_names_it_and_the_errno(mi355x: FakeNode) -> None:
    _drives(mi355x)
    mi355x.p("/mnt/umbp-ssd-1/.hicache-write-probe").mkdir()  # the probe cannot be a file
    err = _error(mi355x)
    assert str(err).startswith(
        "cannot write the SSD drive directory '/mnt/umbp-ssd-1' (HICACHE_UMBP_SSD_DIR): ")
    assert "(errno EISDIR)" in str(err)


def test_standalone_waits_only_for_the_dram_sidecar_and_checks_the_drives(
        mi355x: FakeNode, listeners: list[socket.socket]) -> None:
    """Standalone with the hicache engine: the engine holds the SSD tier, so there is no
    umbp-ssd sidecar to wait for (only dram.sock listens here) and the launcher checks the
    drives itself."""
    env: dict[str, Any] = dict(umbp_mode="standalone", umbp_dram_bytes=None,
                               umbp_socket_dir="/run/umbp")
    store = load_store_config({}, launch_env(**{**OURS, **env}))
    assert socket_paths(store) == ("/run/umbp/dram.sock", "/run/umbp/dram.sock.fd.sock")
    for p in socket_paths(store):
        listen_on(mi355x, p, listeners)
    _drives(mi355x)
    plan = _plan(mi355x, **env)
    assert plan.report["standalone"]["sockets"] == list(socket_paths(store))
    assert [d["dir"] for d in plan.report["ssd"]["drives"]] == DRIVES.split(",")
    extra = plan.command.extra_config
    assert extra["umbp_ssd_engine"] == "hicache" and extra["umbp_ssd_dir"] == DRIVES
