"""The rendered chart runs the real operator: its CRD, its configuration and its command line.

Real: helm renders the chart; the Kubernetes API emulator (tests/emulator, on kmock) loads the
rendered CRD and the rendered peering object; the operator runs as a separate process exactly
as the rendered Deployment starts it (``python -m hicache_operator`` + the rendered ``args`` +
the rendered config file), only the ports changed to free ones. Every request the operator
sends is then checked against the rendered RBAC: this is the RBAC-sufficiency check on real
traffic. Faked: the emulator stands in for an API server (its gaps are listed in its docstring).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import ROOT, by_kind, helm_template, one
from test_chart_rbac import granted

pytestmark = pytest.mark.chart

sys.path.insert(0, str(ROOT / "tests"))
from emulator.harness import EmulatorThread  # noqa: E402

NAMESPACE = "models"
EXAMPLE = ROOT / "examples" / "minimal-dram-only.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _verb(method: str, name: str | None, watch: bool) -> str:
    if watch:
        return "watch"
    return {"GET": "get" if name else "list", "POST": "create", "PATCH": "patch",
            "PUT": "update", "DELETE": "delete" if name else "deletecollection"}[method]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return helm_template(include_crds=True)


class OperatorProcess:
    """One operator replica started exactly as the rendered Deployment starts it."""

    def __init__(self, rendered: list[dict[str, Any]], emu: EmulatorThread, tmp: Path,
                 name: str) -> None:
        config = next(c for c in by_kind(rendered, "ConfigMap") if "operator.yaml" in c["data"])
        config_path = tmp / "operator.yaml"
        config_path.write_text(config["data"]["operator.yaml"])
        (container,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SGLANG_HICACHE_OPERATOR_CONFIG"] == "/etc/sglang-hicache/operator.yaml"
        self.ports = {"health": _free_port(), "metrics": _free_port()}
        args = []
        for arg in container["args"]:
            if arg.startswith("--liveness="):
                arg = f"--liveness=http://127.0.0.1:{self.ports['health']}/healthz"
            elif arg.startswith("--metrics-port="):
                arg = f"--metrics-port={self.ports['metrics']}"
            args.append(arg)
        self.log_path = tmp / f"{name}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hicache_operator", *args], cwd=ROOT, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "KUBECONFIG": str(emu.write_kubeconfig(tmp / "kubeconfig")),
                 "SGLANG_HICACHE_OPERATOR_CONFIG": str(config_path),
                 "POD_NAME": f"sglang-hicache-operator-{name}", "POD_NAMESPACE": "default"})

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.log_path.read_text()


@contextlib.contextmanager
def emulator_with_chart(rendered: list[dict[str, Any]]) -> Iterator[EmulatorThread]:
    """The emulator serving the rendered CRD, with the rendered peering object created."""
    crd = next(c for c in by_kind(rendered, "CustomResourceDefinition")
               if c["metadata"]["name"] == "sglanghicaches.hicache.sglang.ai")
    with EmulatorThread(crds=[crd]) as emu:
        emu.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": NAMESPACE}})
        emu.create("kopf.dev/v1", "clusterkopfpeerings", one(rendered, "ClusterKopfPeering"))
        yield emu


def _apply_example(emu: EmulatorThread) -> str:
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["metadata"]["namespace"] = NAMESPACE
    emu.create("hicache.sglang.ai/v1alpha1", "sglanghicaches", cr)
    return str(cr["metadata"]["name"])


@pytest.fixture(scope="module")
def running(rendered: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[EmulatorThread, dict[str, int]]]:
    tmp = tmp_path_factory.mktemp("operator")
    with emulator_with_chart(rendered) as emu:
        operator = OperatorProcess(rendered, emu, tmp, "a")
        try:
            yield emu, operator.ports
        finally:
            print(operator.stop()[-6000:])


def test_operator_reconciles_an_example_with_the_rendered_chart(
        running: tuple[EmulatorThread, dict[str, int]]) -> None:
    emu, ports = running
    name = _apply_example(emu)
    emu.wait_for(lambda: emu.list("apps/v1", "statefulsets", NAMESPACE), timeout=60,
                 what="the operator to create the StatefulSet")
    status = emu.wait_for(
        lambda: (emu.get("hicache.sglang.ai/v1alpha1", "sglanghicaches", NAMESPACE, name)
                 .get("status") or {}).get("conditions"),
        timeout=60, what="status conditions on the CR")
    spec_valid = next(c for c in status if c["type"] == "SpecValid")
    assert spec_valid["status"] == "True"
    # the operator runs with the chart's configuration: the default engine image from values
    (sts,) = emu.list("apps/v1", "statefulsets", NAMESPACE)
    images = {c["image"] for c in sts["spec"]["template"]["spec"]["containers"]}
    assert images == {"ghcr.io/sglang-hicache/engine:0.1.0"}
    # the rendered probes' endpoint answers
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['health']}/healthz", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10) as r:
        assert b"hicache_operator" in r.read()


def test_every_request_the_operator_sent_is_allowed_by_the_rendered_rbac(
        running: tuple[EmulatorThread, dict[str, int]], rendered: list[dict[str, Any]]) -> None:
    emu, _ = running
    assert emu.list("apps/v1", "statefulsets", NAMESPACE), \
        "no reconciled CR: test_operator_reconciles_an_example_with_the_rendered_chart failed"
    # The emulator's request log names the plural, not the API group; a plural served by two
    # groups (events: core v1 and events.k8s.io) counts as allowed when one of them is granted.
    groups: dict[str, set[str]] = {}
    for rt in emu.emulator.store.types.values():
        groups.setdefault(rt.plural, set()).add(rt.group)
    allowed = granted(rendered, NAMESPACE)
    used: set[tuple[str, str]] = set()
    forbidden: list[tuple[str, str, str]] = []
    for r in emu.requests():
        resource = f"{r.plural}/{r.subresource}" if r.subresource else r.plural
        verb = _verb(r.method, r.name, r.watch)
        used.add((resource, verb))
        if not any((g, resource, verb) in allowed for g in groups[r.plural]):
            forbidden.append(("|".join(sorted(groups[r.plural])), resource, verb))
    assert len(used) >= 8, sorted(used)
    assert not forbidden, f"requests the chart's RBAC would forbid: {sorted(set(forbidden))}"


def test_two_rendered_replicas_one_active_then_failover(
        rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The chart's default: 2 replicas with kopf peering. Exactly one must work (kopf pauses
    every replica when two share a priority), and the other must take over when it stops."""
    assert one(rendered, "Deployment")["spec"]["replicas"] == 2
    with emulator_with_chart(rendered) as emu:
        replicas = [OperatorProcess(rendered, emu, tmp_path, n) for n in ("a", "b")]
        logs = {}
        try:
            emu.wait_for(lambda: len(emu.get("kopf.dev/v1", "clusterkopfpeerings", None,
                                              "shc-sglang-hicache-operator")
                                      .get("status") or {}) == 2,
                         timeout=60, what="both replicas to announce themselves in the peering")
            _apply_example(emu)
            emu.wait_for(lambda: emu.list("apps/v1", "statefulsets", NAMESPACE), timeout=60,
                         what="one of two replicas to reconcile the CR (peering deadlock?)")
            # stop the replica that did the work; the other one must handle the next change.
            # kopf logs "Handler 'cr_event' succeeded" after the handler returns, i.e. a moment
            # after the StatefulSet appeared: wait for the line instead of reading the logs once.
            def worker() -> list[OperatorProcess]:
                return [r for r in replicas
                        if "Handler 'cr_event' succeeded" in r.log_path.read_text()]

            (active,) = emu.wait_for(worker, timeout=60,
                                     what="the active replica to finish the creation")
            logs["stopped"] = active.stop()
            emu.delete("apps/v1", "statefulsets", NAMESPACE,
                       emu.list("apps/v1", "statefulsets", NAMESPACE)[0]["metadata"]["name"])
            emu.wait_for(lambda: emu.list("apps/v1", "statefulsets", NAMESPACE), timeout=90,
                         what="the standby replica to take over and recreate the StatefulSet")
        finally:
            for i, r in enumerate(replicas):
                logs[str(i)] = r.stop()
            for name, text in logs.items():
                print(f"--- replica {name}\n{text[-3000:]}")
