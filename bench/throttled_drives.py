"""Several drives with a bandwidth of their own, on a machine with one shared disk.

A node's SSD tier stripes pages over one volume per NVMe drive; what striping buys is each
drive's bandwidth added up. This machine has one virtual disk, so separate directories on it
share one bandwidth and show no scaling whatever the store does. Here each "drive" is a real
block device: a loop device over a sparse file in tmpfs (so the backing store is never the
bottleneck), formatted ext4 and mounted (``O_DIRECT`` works as on an NVMe volume), and the
kernel's blkio throttle (cgroup v1 ``blkio.throttle.{read,write}_bps_device``) caps what this
process can read from and write to each device. The cap is per device, as a drive's own
bandwidth is; I/O to one device never waits for another's budget.

What is real: the block devices, the filesystem, ``O_DIRECT``, the kernel's per-device throttle,
the store's threads. What is imitated: a drive's bandwidth (a throttle instead of flash) and its
latency (tmpfs behind the throttle is faster than flash, so small queue depths look better than
on a drive). Needs root, ``losetup``, ``mkfs.ext4`` and the cgroup v1 blkio hierarchy; where one
is missing :func:`throttled_drives` says which and yields nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")


def unavailable() -> str:
    """Why throttled drives cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root (loop devices, mount, the blkio cgroup)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        return f"needs the cgroup v1 blkio throttle ({BLKIO})"
    return ""


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def throttled_drives(count: int, bytes_per_s: int, size_bytes: int,
                     backing: str = "/dev/shm") -> Iterator[list[Path]]:
    """``count`` mounted ext4 volumes, each on its own loop device of ``size_bytes`` (sparse,
    in ``backing``), this process's reads and writes to each capped at ``bytes_per_s``. Yields
    the mount points; on exit the process leaves the cgroup and everything is removed."""
    why = unavailable()
    if why:
        raise RuntimeError(f"throttled drives: {why}")
    root = Path(tempfile.mkdtemp(prefix="hicache-drives-", dir=backing))
    mounts = Path(tempfile.mkdtemp(prefix="hicache-drives-", dir="/var/tmp"))
    group = BLKIO / f"hicache-bench-{os.getpid()}"
    loops: list[str] = []
    mounted: list[Path] = []
    joined = False
    try:
        group.mkdir()
        for i in range(count):
            image = root / f"nvme{i}.img"
            with image.open("wb") as f:
                f.truncate(size_bytes)
            loop = _run("losetup", "--find", "--show", str(image))
            loops.append(loop)
            _run("mkfs.ext4", "-q", "-E", "nodiscard", loop)
            mount = mounts / f"nvme{i}"
            mount.mkdir()
            _run("mount", "-o", "discard", loop, str(mount))  # freed blocks leave tmpfs
            mounted.append(mount)
            dev = Path(f"/sys/block/{Path(loop).name}/dev").read_text().strip()
            for kind in ("read", "write"):
                (group / f"blkio.throttle.{kind}_bps_device").write_text(
                    f"{dev} {bytes_per_s}\n")
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")  # every thread of it
        joined = True
        yield mounted
    finally:
        if joined:
            (BLKIO / "cgroup.procs").write_text(f"{os.getpid()}\n")
        for mount in mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        for loop in loops:
            subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            group.rmdir()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(mounts, ignore_errors=True)
