"""Fixtures for the launcher tests: a fake node tree and the env the operator would render.

Env is always built with :func:`hicache_umbp.contract.settings.render_env` from contract keys, so
no test retypes a ``HICACHE_*`` name.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.load import render_env

from .fakenode import GIB, MIB, FakeNode

Env = dict[str, str]


def launch_env(**values: Any) -> Env:
    """A DeepSeek-R1 TP8 pod: 200 GiB host pool and 64 GiB UMBP DRAM per rank (embedded)."""
    base: dict[str, Any] = {
        "model_path": "deepseek-ai/DeepSeek-R1",
        "tp_size": 8,
        "umbp_local_ranks": 8,
        "host_pool_bytes": 200 * GIB,
        "umbp_dram_bytes": 64 * GIB,
        "umbp_namespace": "team-a/r1",
    }
    base.update(values)
    return render_env({k: v for k, v in base.items() if v is not None})


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "node")


@pytest.fixture
def mi355x(node: FakeNode) -> FakeNode:
    """8 MI355X GPUs on 2 NUMA nodes, a cgroup v2 hugetlb limit and node pages for 1600 GiB."""
    node.mi355x()
    node.cgroup_v2({2 * MIB: 1600 * GIB})
    node.hugepages(2 * MIB, free=819200, per_numa={0: 409600, 1: 409600})
    return node


@pytest.fixture
def env_factory() -> Callable[..., Env]:
    return launch_env


def io_uring_ok() -> str | None:
    return None


def io_uring_blocked() -> str | None:
    return "io_uring_setup failed with EPERM: blocked (seccomp profile or kernel.io_uring_disabled)"


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    """UNIX sockets a test listens on (a standalone sidecar's), closed after it."""
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def listen_on(node: FakeNode, path: str, socks: list[socket.socket]) -> None:
    """Listen on the node's ``path`` as a running sidecar does (added to ``socks``)."""
    host = node.p(path)
    host.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(host))
    s.listen(4)
    socks.append(s)
