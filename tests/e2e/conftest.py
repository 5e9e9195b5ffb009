"""End-to-end fixtures: the real operator (kopf) against the Kubernetes API emulator.

Real: kopf 1.45, every operator module (handlers, reconcile, kube client, planner, builders),
the emulator's HTTP server and store, the chart's CRDs (SGLangHiCache with its schema and CEL
rules; kopf peering). Emulated: the API server itself, and the StatefulSet controller/kubelet
(pods and PVCs appear, tests set their states). See ``tests/emulator/__init__.py`` for the
emulator's known gaps.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_lib import NAMESPACE, Cluster, OperatorProcess, load_crds, write_operator_config
from emulator import EmulatorThread
from kopf.testing import KopfRunner


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    with EmulatorThread(crds=load_crds(), bookmark_interval=0.5) as emu:
        emu.create("v1", "namespaces", {"metadata": {"name": NAMESPACE}})
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        # The default configuration with a short resync timer: kopf reads a timer's interval
        # when the handlers are imported, in the first test that runs the operator in-process.
        config = write_operator_config(tmp_path / "operator.yaml")
        monkeypatch.setenv("SGLANG_HICACHE_OPERATOR_CONFIG", str(config))
        yield Cluster(emu, kubeconfig)


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    """The operator in-process (kopf.testing.KopfRunner); any crash fails the test at exit."""
    args = ["run", "--standalone", "-n", NAMESPACE, "-m", "hicache_operator.controller.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        cluster.wait_operator_watching()
        yield runner


@pytest.fixture
def operator_process(cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as a separate process (``python -m hicache_operator run``), killable."""
    process = OperatorProcess(cluster, tmp_path / "operator.log")
    try:
        yield process
    finally:
        process.stop()
