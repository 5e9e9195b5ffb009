"""Operator reconcile benchmark against the Kubernetes API emulator, with cache scraping on.

The real operator runs as a child process (``python -m hicache_operator run``); the emulator
(tests/emulator) runs in this process and counts every request; an aiohttp server on loopback
stands in for every engine pod's SGLang ``/metrics`` (the provisional fixture of
tests/fixtures/sglang-metrics, padded with histogram lines to ``BENCH_PAGE_KIB`` KiB, the
order of a real page). Measured in one run:

1. one CR: time from create to all of its children present;
2. 200 CRs created at once (the three examples, renamed): time until every CR has all its
   children and a status for generation 1; API writes; peak operator RSS;
3. every pod made ready with a pod IP; the operator scrapes them on its resync timer until
   every CR shows cache figures;
4. two full no-op resyncs (every CR's timer re-reads it at least once, nothing changed), the
   first before any pod is ready (nothing to scrape), the second with every ready pod scraped:
   writes, each printed with its path and body keys (each window is checked to cover every CR:
   ``noop_resync_crs``), scrapes, and the operator's CPU per CR and resync in both.
5. the scrape cost: the operator's own ``CacheObserver`` (fetch + parse + window) scraping the
   same server from this process's main thread, CPU measured for that thread only (the server
   runs in its own thread); per CR = per pod x the mean pods per CR.

Targets (DESIGN.md §8, issue 13): 1 CR < 1 s, 200 CRs < 30 s, 0 writes on a no-op resync with
scraping on, peak RSS < 150 MB. The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import yaml  # noqa: E402
from e2e_lib import FakeSGLangMetrics  # noqa: E402
from emulator import CHART_CRD, EmulatorThread  # noqa: E402
from hicache_operator.api import OperatorConfig  # noqa: E402
from hicache_operator.cachestats.observer import CacheObserver  # noqa: E402
from hicache_operator.cachestats.sglang_metrics import parse_pod  # noqa: E402
from hicache_operator.plan import plan  # noqa: E402

NAMESPACE = "bench"
CR_API, CRS = "hicache.sglang.ai/v1alpha1", "sglanghicaches"
RESYNC_S = float(os.environ.get("BENCH_RESYNC_SECONDS", "5"))
MANY = int(os.environ.get("BENCH_CRS", "200"))
PAGE_KIB = int(os.environ.get("BENCH_PAGE_KIB", "64"))
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
FIXTURE = REPO / "tests/fixtures/sglang-metrics/provisional-0.5.23-tp2-umbp-t0.txt"
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


def metrics_page(kib: int) -> str:
    """The fixture plus SGLang-like histogram noise up to ``kib`` KiB (skipped by the parser)."""
    lines = [FIXTURE.read_text()]
    size, i = len(lines[0]), 0
    while size < kib * 1024:
        line = (f'sglang:e2e_request_latency_seconds_bucket{{engine_type="unified",'
                f'is_streaming="false",le="{0.1 * (i % 40 + 1):.1f}",model_name="qwen-small",'
                f'series="{i // 40}"}} {i}.0\n')
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)


def cr_named(index: int, name: str, port: int) -> dict[str, Any]:
    doc = dict(yaml.safe_load(EXAMPLES[index % len(EXAMPLES)].read_text()))
    doc["metadata"] = {"name": name, "namespace": NAMESPACE}
    doc["spec"].setdefault("engine", {})["port"] = port
    return doc


def expected_children(cr: dict[str, Any]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in plan(cr, OperatorConfig()).objects}


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kind_of(record: Any) -> str:
    sub = f"/{record.subresource}" if record.subresource else ""
    return f"{record.method} {record.plural}{sub}"


class Bench:
    def __init__(self, emu: EmulatorThread) -> None:
        self.emu = emu

    def snapshot(self) -> tuple[set[tuple[str, str, str]], dict[str, dict[str, Any]]]:
        """All (kind, instance, name) children and each CR's status, atomically."""
        def read(store: Any) -> tuple[set[tuple[str, str, str]], dict[str, dict[str, Any]]]:
            children = set()
            for (_, plural, ns, name), obj in store.objects.items():
                if ns == NAMESPACE and plural in CHILD_KINDS.values():
                    instance = (obj["metadata"].get("labels") or {}).get(
                        "app.kubernetes.io/instance", "")
                    children.add((obj["kind"], instance, name))
            statuses = {key[3]: obj.get("status") or {}
                        for key, obj in store.objects.items() if key[1] == CRS}
            return children, statuses
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
            children, statuses = self.snapshot()
            done = wanted <= children and (not want_status or all(
                statuses.get(n, {}).get("observedGeneration") for n in names))
            if done:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"not converged after {timeout} s: "
                                 f"{len(wanted - children)} children missing")
            time.sleep(0.01 if len(crs) == 1 else 0.1)

    def make_pods_ready(self, ip: str) -> int:
        """Every pod of the namespace Ready with ``ip`` (the emulated kubelet)."""
        sim = self.emu.simulator
        assert sim is not None

        def ready(store: Any) -> int:
            pods = [key[3] for key in list(store.objects) if key[1] == "pods"
                    and key[2] == NAMESPACE]
            for name in pods:
                sim.pod_ready(NAMESPACE, name, ip)
            return len(pods)
        return int(self.emu.call(ready))

    def wait_scraped(self, names: set[str], timeout: float = 300) -> float:
        """Until every CR's status shows cache figures read from all of its ready pods."""
        started = time.perf_counter()
        while True:
            _, statuses = self.snapshot()
            done = all((statuses.get(n, {}).get("cache") or {}).get("hostUsedRatio") is not None
                       and statuses[n]["cache"].get("pods") == statuses[n].get("readyReplicas")
                       for n in names)
            if done:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise SystemExit("not every CR shows scraped cache figures")
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

    def noop_window(self, names: set[str], pid: int, sglang: FakeSGLangMetrics) -> dict[str, Any]:
        """One full no-op resync: the window lasts until every CR's timer has re-read it (each
        reconcile GETs its CR afresh) and at least 1.5 resync periods, so a loaded machine whose
        timers lag cannot report 0 writes for a resync that covered only some CRs."""
        writes_before, requests_before = self.writes(), len(self.emu.requests())
        scrapes_before, cpu_before = len(sglang.requests), cpu_seconds(pid)
        started = time.perf_counter()
        resynced = self.wait_resynced(names, requests_before, min_s=RESYNC_S * 1.5)
        seconds = time.perf_counter() - started
        log = self.emu.writes()[writes_before:]
        return {"resynced": resynced, "seconds": seconds, "log": log,
                "reads": len(self.emu.requests()) - requests_before - len(log),
                "scrapes": len(sglang.requests) - scrapes_before,
                "cpu_ms_per_cr_resync": 1000 * (cpu_seconds(pid) - cpu_before)
                / (len(names) * seconds / RESYNC_S)}

    def settle(self, period: float, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            before = self.writes()
            time.sleep(period)
            if self.writes() == before or time.monotonic() > deadline:
                return


def thread_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def scrape_cpu_ms_per_pod(sglang: FakeSGLangMetrics, rounds: int = 200) -> float:
    """CPU of the operator's scrape path (CacheObserver.observe: HTTP fetch, parse, window)
    per pod, in this thread only (the fake server has its own thread)."""
    observer = CacheObserver(OperatorConfig().cache_metrics)
    pods = [{"metadata": {"name": f"p-{i}", "uid": str(i)},
             "status": {"podIP": sglang.ips[0], "conditions": [
                 {"type": "Ready", "status": "True"}]}} for i in range(4)]

    async def run() -> float:
        await observer.observe(("bench", "x"), pods, sglang.port)  # connections warm
        started = thread_cpu_s()
        for _ in range(rounds):
            await observer.observe(("bench", "x"), pods, sglang.port)
        spent = thread_cpu_s() - started
        await observer.close()
        return spent

    return 1000 * asyncio.run(run()) / (rounds * len(pods))


def scrape_histogram(port: int) -> tuple[float, float]:
    """(sum seconds, count) of the operator's per-pod scrape histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {}
    for name in ("sum", "count"):
        found = re.search(rf"^hicache_operator_cache_scrape_duration_seconds_{name} (\S+)$",
                          text, re.M)
        values[name] = float(found.group(1)) if found else 0.0
    return values["sum"], values["count"]


def main() -> int:
    page = metrics_page(PAGE_KIB)
    metrics_port = free_port()
    with tempfile.TemporaryDirectory() as tmp, FakeSGLangMetrics(pods=1) as sglang, \
            EmulatorThread(crds=load_crds(), bookmark_interval=5.0) as emu:
        sglang.serve(page)
        emu.create("v1", "namespaces", {"metadata": {"name": NAMESPACE}})
        kubeconfig = emu.write_kubeconfig(Path(tmp) / "kubeconfig", NAMESPACE)
        config = Path(tmp) / "operator.yaml"
        config.write_text(f"resyncSeconds: {RESYNC_S}\n")
        env = dict(os.environ, KUBECONFIG=str(kubeconfig),
                   SGLANG_HICACHE_OPERATOR_CONFIG=str(config))
        log_path = Path(os.environ.get("BENCH_OPERATOR_LOG", Path(tmp) / "operator.log"))
        log = open(log_path, "wb")  # noqa: SIM115
        operator = subprocess.Popen(
            [sys.executable, "-m", "hicache_operator", "run", "--standalone", "-n", NAMESPACE,
             "--metrics-port", str(metrics_port),
             *os.environ.get("BENCH_OPERATOR_ARGS", "").split()],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        bench = Bench(emu)
        try:
            deadline = time.monotonic() + 60
            while not any(r.watch and r.plural == CRS for r in emu.requests()):
                if time.monotonic() > deadline or operator.poll() is not None:
                    raise SystemExit("the operator did not start; see its log")
                time.sleep(0.05)

            one = [cr_named(0, "single", sglang.port)]
            bench.create_all(one)
            one_cr_s = bench.wait_converged(one, want_status=False)
            one_cr_status_s = one_cr_s + bench.wait_converged(one, want_status=True)
            bench.settle(1.0)

            many = [cr_named(i, f"shc-{i:03d}", sglang.port) for i in range(MANY)]
            names = {cr["metadata"]["name"] for cr in many} | {"single"}
            writes_before = bench.writes()
            bench.create_all(many)
            many_s = bench.wait_converged(many, want_status=True)
            many_log = emu.writes()[writes_before:]
            many_kinds = Counter(kind_of(r) for r in many_log)

            bench.settle(RESYNC_S)
            quiet = bench.noop_window(names, operator.pid, sglang)  # no pod ready: no scrape

            pods = bench.make_pods_ready(sglang.ips[0])
            scraped_s = bench.wait_scraped(names)
            bench.settle(RESYNC_S)
            histogram_before = scrape_histogram(metrics_port)
            noop = bench.noop_window(names, operator.pid, sglang)
            histogram = scrape_histogram(metrics_port)
            rss = peak_rss_mb(operator.pid)
            pod_scrape_ms = scrape_cpu_ms_per_pod(sglang)
            operator_cpu_s = cpu_seconds(operator.pid)
            emulator_cpu_s = time.process_time()
        finally:
            operator.terminate()
            try:
                operator.wait(20)
            except subprocess.TimeoutExpired:
                operator.kill()
            log.close()
    serial_estimate = one_cr_status_s * MANY
    scrape_count = histogram[1] - histogram_before[1]
    scrape_ms = 1000 * (histogram[0] - histogram_before[0]) / max(scrape_count, 1)
    started = time.perf_counter()
    for _ in range(20):
        parse_pod(page)
    parse_ms = (time.perf_counter() - started) / 20 * 1000
    pods_per_cr = pods / len(names)
    print(f"1 CR: children present in {one_cr_s:.3f} s, status written at {one_cr_status_s:.3f} s "
          "(target < 1 s)")
    print(f"{MANY} CRs at once: converged in {many_s:.2f} s (target < 30 s); "
          f"{many_s / MANY * 1000:.1f} ms per CR; vs {MANY}x the single-CR time "
          f"({serial_estimate:.1f} s): {many_s / serial_estimate:.2f}x")
    print(f"API writes for {MANY} CRs: {len(many_log)} ({len(many_log) / MANY:.1f} per CR): "
          + ", ".join(f"{k} {v / MANY:.2f}/CR" for k, v in sorted(many_kinds.items())))
    for title, window in (("without pods to scrape", quiet), ("with cache scraping on", noop)):
        print(f"no-op resync of {window['resynced']}/{len(names)} CRs over "
              f"{window['seconds']:.1f} s {title}: {len(window['log'])} writes "
              f"{dict(Counter(kind_of(r) for r in window['log']))}, {window['reads']} reads, "
              f"{window['scrapes']} pod scrapes; operator CPU "
              f"{window['cpu_ms_per_cr_resync']:.2f} ms per CR per resync")
        for record in window["log"]:  # every write counted in the window, with what it wrote
            print(f"  no-op window write: {record.method} {record.path} -> {record.code} "
                  f"keys {list(record.body_keys)}")
    print(f"{pods} pods ready; every CR's cache figures scraped within {scraped_s:.1f} s")
    print(f"scrape cost: {pod_scrape_ms:.2f} ms CPU per pod (fetch + parse + window, operator "
          f"code), {pod_scrape_ms * pods_per_cr:.2f} ms per CR per resync ({pods_per_cr:.2f} "
          f"pods per CR); parsing one {len(page) // 1024} KiB page alone {parse_ms:.2f} ms; "
          f"{scrape_ms:.1f} ms wall per pod scrape in the operator (loopback server in the busy "
          f"bench process, {scrape_count:.0f} scrapes)")
    print(f"peak operator RSS: {rss:.1f} MB (target < 150 MB); CPU: operator "
          f"{operator_cpu_s:.1f} s, emulator+bench {emulator_cpu_s:.1f} s")
    print(json.dumps({"one_cr_s": round(one_cr_s, 4), "one_cr_status_s": round(one_cr_status_s, 4),
                      "two_hundred_crs_s": round(many_s, 3), "crs": MANY,
                      "total_writes": len(many_log),
                      "writes_per_cr": round(len(many_log) / MANY, 2),
                      "noop_resync_writes": len(noop["log"]),
                      "noop_resync_writes_unscraped": len(quiet["log"]),
                      "noop_resync_reads": noop["reads"], "noop_resync_crs": noop["resynced"],
                      "noop_scrapes": noop["scrapes"],
                      "scrape_cpu_ms_per_pod": round(pod_scrape_ms, 3),
                      "scrape_cpu_ms_per_cr_resync": round(pod_scrape_ms * pods_per_cr, 3),
                      "cpu_ms_per_cr_resync_unscraped": round(quiet["cpu_ms_per_cr_resync"], 2),
                      "cpu_ms_per_cr_resync_scraped": round(noop["cpu_ms_per_cr_resync"], 2),
                      "parse_ms_per_page": round(parse_ms, 3),
                      "scrape_wall_ms_per_pod": round(scrape_ms, 2),
                      "page_kib": len(page) // 1024, "peak_rss_mb": round(rss, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
