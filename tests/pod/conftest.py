"""Fixtures of the pod tier: the tiny models, the test image, a node, a kubelet per test.

Needs the engine environment (scripts/build-engine-env.sh) as the interpreter, root (mount
namespaces, cgroups, hugepage reservation), cgroup v1 memory and cpuset, util-linux and
Debian's python3-seccomp (scripts/pod-node-tools.sh); :func:`pod.node.preflight` checks each
before any pod starts and a missing one fails with what to do, never a silent skip. The
checkout may live anywhere (the image's files are bound into every container, see
:mod:`pod.image`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from .image import Image, make_image
from .node import Node, preflight


@pytest.fixture(scope="session")
def pod_root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Where images, volumes and logs live: world-traversable (containers run as uid 10001,
    and pytest's own temp root is private to root), and not under /tmp, which is each
    container's own writable layer. Removed after a session without failures (kept, with every
    container's log, for a failed one)."""
    problems = preflight()
    if problems:
        pytest.fail("the pod tier cannot run on this machine:\n  " + "\n  ".join(problems))
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


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


@pytest.fixture
def workdir(pod_root: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The test's pods (their volumes, SSD claims of up to a few GiB, logs): removed when the
    test passed, so a session holds one passing test's files at a time (the whole tier kept
    20 GB until its end); a failed test's stay, with the session root."""
    d = _subdir(pod_root, "pods")
    yield d
    if request.node.stash.get(_PASSED, False):
        shutil.rmtree(d, ignore_errors=True)
