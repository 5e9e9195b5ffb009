"""Fixtures of the pod tier: the tiny models, the test image, a node, a kubelet per test.

Needs the engine environment (scripts/build-engine-env.sh) as the interpreter, root (mount
namespaces, memory cgroups, hugepage reservation) and cgroup v1 memory; each of these is
checked and a missing one fails with what to do, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import make_image
from .node import Node
from .runtime import Image


@pytest.fixture(scope="session")
def pod_root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Where images, volumes and logs live: world-traversable (containers run as uid 10001,
    and pytest's own temp root is private to root), and not under /tmp, which sidecars mount a
    volume over. Removed after a session without failures (kept, with every container's log,
    for a failed one)."""
    if os.geteuid() != 0:
        pytest.fail("the pod tier runs containers like a kubelet: it needs root (mount "
                    "namespaces, memory cgroups, hugepage reservation)")
    root = Path(tempfile.mkdtemp(prefix="hicache-pod-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    yield root
    if request.session.testsfailed:
        print(f"\npod tier: logs and volumes kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


def _subdir(root: Path, name: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    os.chmod(d, 0o755)
    return d


@pytest.fixture(scope="session")
def models_dir(pod_root: Path) -> Path:
    from hicache_cpu_engine.tiny_model import make_model

    root = _subdir(pod_root, "models")
    make_model(root / "tiny-llama", "llama")
    make_model(root / "tiny-mla", "mla")
    return root


@pytest.fixture(scope="session")
def image(pod_root: Path) -> Image:
    return make_image(_subdir(pod_root, "image"))


@pytest.fixture
def node(pod_root: Path) -> Iterator[Node]:
    with Node(_subdir(pod_root, "node")) as n:
        yield n


@pytest.fixture
def workdir(pod_root: Path) -> Path:
    return _subdir(pod_root, "pods")
