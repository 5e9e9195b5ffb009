"""Operator reconcile benchmark against the Kubernetes API emulator.

The real operator runs as a child process (``python -m hicache_operator run``); the emulator
(tests/emulator) runs in this process and counts every request. Measured in one run:

1. one CR: time from create to all of its children present;
2. 200 CRs created at once (the three examples, renamed): time until every CR has all its
   children and a status for generation 1; API writes; peak operator RSS;
3. one full no-op resync (every CR's timer re-reads it at least once, nothing changed): writes
   (the window is checked to cover every CR: ``noop_resync_crs``).

Targets (DESIGN.md §8): 1 CR < 1 s, 200 CRs < 30 s, 0 writes on a no-op resync.
The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from emulator import CHART_CRD, EmulatorThread  # noqa: E402
from hicache_operator.api import OperatorConfig  # noqa: E402
from hicache_operator.planner import plan  # noqa: E402

NAMESPACE = "bench"
CR_API, CRS = "hicache.sglang.ai/v1alpha1", "sglanghicaches"
RESYNC_S = float(os.environ.get("BENCH_RESYNC_SECONDS", "5"))
MANY = int(os.environ.get("BENCH_CRS", "200"))
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CHILD_KINDS = {"StatefulSet": "statefulsets", "Service": "services", "ConfigMap": "configmaps",
               "PodDisruptionBudget": "poddisruptionbudgets"}


def load_crds() -> list[dict[str, Any]]:
    """The chart's CRDs (generated from the models if the chart copy is missing)."""
    docs = [dict(doc) for path in sorted(CHART_CRD.parent.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]
    if not CHART_CRD.exists():
        from hicache_operator.api.crd import crd_yaml

        docs.append(dict(yaml.safe_load(crd_yaml())))
    return docs


def cr_named(index: int, name: str) -> dict[str, Any]:
    doc = dict(yaml.safe_load(EXAMPLES[index % len(EXAMPLES)].read_text()))
    doc["metadata"] = {"name": name, "namespace": NAMESPACE}
    return doc


def expected_children(cr: dict[str, Any]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in plan(cr, OperatorConfig()).objects}


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Bench:
    def __init__(self, emu: EmulatorThread) -> None:
        self.emu = emu

    def snapshot(self) -> tuple[set[tuple[str, str, str]], dict[str, int]]:
        """All (kind, instance, name) children and each CR's observedGeneration, atomically."""
        def read(store: Any) -> tuple[set[tuple[str, str, str]], dict[str, int]]:
            children = set()
            for (_, plural, ns, name), obj in store.objects.items():
                if ns == NAMESPACE and plural in CHILD_KINDS.values():
                    instance = (obj["metadata"].get("labels") or {}).get(
                        "app.kubernetes.io/instance", "")
                    children.add((obj["kind"], instance, name))
            gens = {key[3]: int((obj.get("status") or {}).get("observedGeneration") or 0)
                    for key, obj in store.objects.items() if key[1] == CRS}
            return children, gens
        return self.emu.call(read)

    def create_all(self, crs: list[dict[str, Any]]) -> None:
        rtype = self.emu.rtype(CR_API, CRS)
        self.emu.call(lambda store: [store.create(rtype, NAMESPACE, cr) for cr in crs])

    def wait_converged(self, crs: list[dict[str, Any]], want_status: bool,
                       timeout: float = 300) -> float:
        started = time.perf_counter()
        wanted = {(kind, cr["metadata"]["name"], name)
                  for cr in crs for kind, name in expected_children(cr)}
        names = {cr["metadata"]["name"] for cr in crs}
        while True:
            children, gens = self.snapshot()
            done = wanted <= children and (not want_status or all(gens.get(n) for n in names))
            if done:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"not converged after {timeout} s: "
                                 f"{len(wanted - children)} children missing")
            time.sleep(0.01 if len(crs) == 1 else 0.1)

    def wait_handled(self, names: list[str], timeout: float = 120) -> None:
        key = "hicache.sglang.ai/last-handled-configuration"

        def handled(store: Any) -> int:
            return sum(1 for (_, plural, ns, name), obj in store.objects.items()
                       if plural == CRS and name in wanted
                       and key in (obj["metadata"].get("annotations") or {}))
        wanted = set(names)
        deadline = time.monotonic() + timeout
        while self.emu.call(handled) < len(wanted):
            if time.monotonic() > deadline:
                raise SystemExit("kopf did not finish handling every CR")
            time.sleep(0.2)

    def wait_resynced(self, names: set[str], since: int, min_s: float,
                      timeout: float = 300) -> int:
        """Wait until every CR in ``names`` was read (GET) after request ``since`` and ``min_s``
        passed; returns how many were (all, unless the timeout ends the wait)."""
        started = time.monotonic()
        while True:
            read = {r.name for r in self.emu.requests()[since:]
                    if r.method == "GET" and r.plural == CRS and not r.watch}
            covered = len(names & read)
            elapsed = time.monotonic() - started
            if (covered == len(names) and elapsed >= min_s) or elapsed > timeout:
                return covered
            time.sleep(0.2)

    def writes(self) -> int:
        return len(self.emu.writes())

    def settle(self, period: float, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            before = self.writes()
            time.sleep(period)
            if self.writes() == before or time.monotonic() > deadline:
                return


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, \
            EmulatorThread(crds=load_crds(), bookmark_interval=5.0) as emu:
        emu.create("v1", "namespaces", {"metadata": {"name": NAMESPACE}})
        kubeconfig = emu.write_kubeconfig(Path(tmp) / "kubeconfig", NAMESPACE)
        env = dict(os.environ, KUBECONFIG=str(kubeconfig),
                   SGLANG_HICACHE_RESYNC_SECONDS=str(RESYNC_S))
        env.pop("SGLANG_HICACHE_OPERATOR_CONFIG", None)
        log_path = Path(os.environ.get("BENCH_OPERATOR_LOG", Path(tmp) / "operator.log"))
        log = open(log_path, "wb")  # noqa: SIM115
        operator = subprocess.Popen(
            [sys.executable, "-m", "hicache_operator", "run", "--standalone", "-n", NAMESPACE,
             "--metrics-port", "0"], env=env, stdout=log, stderr=subprocess.STDOUT)
        bench = Bench(emu)
        try:
            deadline = time.monotonic() + 60
            while not any(r.watch and r.plural == CRS for r in emu.requests()):
                if time.monotonic() > deadline or operator.poll() is not None:
                    raise SystemExit("the operator did not start; see its log")
                time.sleep(0.05)

            one = [cr_named(0, "single")]
            bench.create_all(one)
            one_cr_s = bench.wait_converged(one, want_status=False)
            one_cr_status_s = one_cr_s + bench.wait_converged(one, want_status=True)
            bench.settle(1.0)

            many = [cr_named(i, f"shc-{i:03d}") for i in range(MANY)]
            writes_before = bench.writes()
            bench.create_all(many)
            many_s = bench.wait_converged(many, want_status=True)
            many_log = emu.writes()[writes_before:]
            many_writes = len(many_log)
            many_kinds = Counter(
                f"{r.method} {r.plural}{'/' + r.subresource if r.subresource else ''}"
                for r in many_log)
            # The no-op window starts once kopf has recorded every CR as handled and the
            # operator has been quiet for a whole resync period.
            bench.wait_handled([cr["metadata"]["name"] for cr in many])
            bench.settle(RESYNC_S)

            # One full resync: the window lasts until every CR's timer has re-read it (each
            # reconcile GETs its CR afresh) and at least 1.5 resync periods, so a loaded machine
            # whose timers lag cannot report 0 writes for a resync that covered only some CRs.
            noop_before = bench.writes()
            requests_before = len(emu.requests())
            window_started = time.perf_counter()
            resynced = bench.wait_resynced({cr["metadata"]["name"] for cr in many},
                                           requests_before, min_s=RESYNC_S * 1.5)
            noop_window_s = time.perf_counter() - window_started
            noop_log = emu.writes()[noop_before:]
            noop_writes = len(noop_log)
            noop_kinds = Counter(
                f"{r.method} {r.plural}{'/' + r.subresource if r.subresource else ''}"
                for r in noop_log)
            noop_reads = len(emu.requests()) - requests_before - noop_writes
            rss = peak_rss_mb(operator.pid)
            fields = Path(f"/proc/{operator.pid}/stat").read_text().rsplit(")", 1)[1].split()
            operator_cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            emulator_cpu_s = time.process_time()
        finally:
            operator.terminate()
            try:
                operator.wait(20)
            except subprocess.TimeoutExpired:
                operator.kill()
            log.close()
    serial_estimate = one_cr_status_s * MANY
    print(f"1 CR: children present in {one_cr_s:.3f} s, status written at {one_cr_status_s:.3f} s "
          "(target < 1 s)")
    print(f"{MANY} CRs at once: converged in {many_s:.2f} s (target < 30 s); "
          f"{many_s / MANY * 1000:.1f} ms per CR; vs {MANY}x the single-CR time "
          f"({serial_estimate:.1f} s): {many_s / serial_estimate:.2f}x")
    print(f"API writes for {MANY} CRs: {many_writes} ({many_writes / MANY:.1f} per CR): "
          + ", ".join(f"{k} {v / MANY:.2f}/CR" for k, v in sorted(many_kinds.items())))
    print(f"no-op resync of {resynced}/{MANY} CRs over {noop_window_s:.1f} s: {noop_writes} "
          f"writes {dict(noop_kinds)}, {noop_reads} reads")
    print(f"peak operator RSS: {rss:.1f} MB; CPU: operator {operator_cpu_s:.1f} s, "
          f"emulator+bench {emulator_cpu_s:.1f} s")
    print(json.dumps({"one_cr_s": round(one_cr_s, 4), "one_cr_status_s": round(one_cr_status_s, 4),
                      "two_hundred_crs_s": round(many_s, 3), "crs": MANY,
                      "total_writes": many_writes, "writes_per_cr": round(many_writes / MANY, 2),
                      "noop_resync_writes": noop_writes, "noop_resync_reads": noop_reads,
                      "noop_resync_crs": resynced,
                      "peak_rss_mb": round(rss, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
