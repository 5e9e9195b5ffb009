"""NodeRoot path handling on a real temporary directory tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hicache_umbp.launch.noderoot import NodeRoot


def test_absolute_links_are_followed_inside_the_root(tmp_path: Path) -> None:
    """A sysfs tree copied from a real node may hold absolute links: they stay in the root."""
    dev = tmp_path / "sys/devices/pci0000:00/0000:05:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink("/sys/devices/pci0000:00/0000:05:00.0",
               tmp_path / "sys/bus/pci/devices/0000:05:00.0")
    root = NodeRoot(tmp_path)
    assert root.realpath("/sys/bus/pci/devices/0000:05:00.0") == (
        "/sys/devices/pci0000:00/0000:05:00.0")
    assert root.realpath("/sys/bus/pci/devices/0000:05:00.0/../../../devices") == "/sys/devices"


def test_reads_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/value").write_text("0x10 trailing\n")
    root = NodeRoot(tmp_path)
    assert root.read_int("/proc/value") == 16
    assert root.read_int("/proc/missing") is None
    assert root.read_text("/proc/missing") is None
    assert root.listdir("/nowhere") == []
    assert not root.is_real and NodeRoot("/").is_real
    with pytest.raises(ValueError, match="must be absolute"):
        root.path("relative/path")


def test_link_loops_are_reported(tmp_path: Path) -> None:
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    with pytest.raises(OSError, match="too many symbolic links"):
        NodeRoot(tmp_path).realpath("/a/x")
