"""A real Prometheus (Debian's 2.42, ``make router-env``) configured the way prometheus-operator
would configure it from the chart's PodMonitors and PrometheusRule.

``scrape_configs`` translates each PodMonitor into the scrape job prometheus-operator generates
for it (``pkg/prometheus/promcfg.go``: Kubernetes pod discovery in the selected namespaces; keep
pods whose labels match ``selector.matchLabels`` and the container port named by the endpoint;
``namespace``, ``container``, ``pod``, ``job`` and ``endpoint`` target labels; then the
PodMonitor's own relabelings). ``PrometheusServer`` runs the binary with that configuration and
the chart's rule groups and answers instant queries.

Discovery: Debian builds its prometheus without Kubernetes service discovery (its 2.42 refuses
``kubernetes_sd_configs``: "field kubernetes_sd_configs not found in type
config.ScrapeConfig"). ``PodDiscovery`` is the nearest real alternative: it lists the pods from
the Kubernetes API (the emulator, over HTTP, on every refresh) and serves them through
Prometheus' own HTTP service discovery with the ``__meta_kubernetes_pod_*`` labels Prometheus'
Kubernetes pod role gives each container port, so every relabeling, scrape and rule runs in the
real Prometheus unchanged.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .processes import stop_group

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / ".cache" / "bin" / "prometheus"


def _label(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A PodMonitor relabeling (camelCase) as Prometheus configuration (snake_case)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in rule.items()}


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Target groups as Prometheus' Kubernetes ``pod`` role discovers them: one target per
    container port of each pod with an IP, with its ``__meta_kubernetes_*`` labels."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        common = {"__meta_kubernetes_namespace": meta["namespace"],
                  "__meta_kubernetes_pod_name": meta["name"],
                  "__meta_kubernetes_pod_ip": ip,
                  "__meta_kubernetes_pod_uid": meta.get("uid", ""),
                  "__meta_kubernetes_pod_phase": status.get("phase", ""),
                  "__meta_kubernetes_pod_ready": str(ready).lower()}
        for key, value in (meta.get("labels") or {}).items():
            common[f"__meta_kubernetes_pod_label_{_label(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{_label(key)}"] = "true"
        for container in (pod.get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                host = f"[{ip}]" if ":" in ip else ip
                groups.append({"targets": [f"{host}:{port['containerPort']}"], "labels": {
                    **common,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol",
                                                                              "TCP")}})
    return groups


class PodDiscovery:
    """Serves ``pod_targets`` of the pods the API at ``api_server`` lists, for ``http_sd``."""

    def __init__(self, api_server: str, namespaces: Iterable[str]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.api_server, self.namespaces = api_server.rstrip("/"), list(namespaces)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(owner.groups()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def groups(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = []
        for ns in self.namespaces:
            with urllib.request.urlopen(f"{self.api_server}/api/v1/namespaces/{ns}/pods",
                                        timeout=5) as r:
                pods.extend(json.loads(r.read())["items"])
        return pod_targets(pods)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/sd"

    def __enter__(self) -> PodDiscovery:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_configs(podmonitors: Iterable[Mapping[str, Any]], sd_url: str,
                   interval: str | None = None) -> list[dict[str, Any]]:
    """``sd_url``: a ``PodDiscovery`` (http_sd) standing in for ``kubernetes_sd_configs``."""
    jobs = []
    for pm in podmonitors:
        meta, spec = pm["metadata"], pm["spec"]
        sd: dict[str, Any] = {"url": sd_url, "refresh_interval": "1s"}
        for i, ep in enumerate(spec["podMetricsEndpoints"]):
            relabel: list[dict[str, Any]] = []
            for key, value in sorted((spec["selector"].get("matchLabels") or {}).items()):
                relabel.append({
                    "source_labels": [f"__meta_kubernetes_pod_label_{_label(key)}",
                                      f"__meta_kubernetes_pod_labelpresent_{_label(key)}"],
                    "regex": f"({re.escape(value)});true", "action": "keep"})
            relabel += [
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                 "regex": ep["port"], "action": "keep"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"],
                 "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"target_label": "job",
                 "replacement": f"{meta['namespace']}/{meta['name']}"},
                {"target_label": "endpoint", "replacement": ep["port"]},
                *(_relabel(r) for r in ep.get("relabelings") or []),
            ]
            jobs.append({
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
                "honor_labels": False,
                "scrape_interval": interval or ep.get("interval", "30s"),
                # A scrape may take its whole interval (the global default would cap it at
                # the global 1 s interval).
                "scrape_timeout": interval or ep.get("interval", "30s"),
                "metrics_path": ep.get("path", "/metrics"),
                "http_sd_configs": [sd],
                "relabel_configs": relabel,
            })
    return jobs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """``with PrometheusServer(workdir, scrape, rule_groups) as prom: prom.query("up")``."""

    def __init__(self, workdir: Path, scrape: list[dict[str, Any]],
                 rule_groups: Mapping[str, Any], evaluation_interval: str = "1s") -> None:
        if not PROMETHEUS.exists():
            raise AssertionError(f"{PROMETHEUS} missing: run `make router-env`")
        self.workdir = workdir
        self.port = _free_port()
        (workdir / "rules.yaml").write_text(yaml.safe_dump(dict(rule_groups), sort_keys=False))
        (workdir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": evaluation_interval},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": scrape,
        }, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        log = open(self.workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--web.console.templates=/nonexistent", "--web.console.libraries=/nonexistent"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        self.__exit__()
        raise AssertionError("prometheus did not become ready:\n"
                             + (self.workdir / "prometheus.log").read_text()[-3000:])

    def __exit__(self, *exc: object) -> None:
        stop_group(self.proc, 20)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            return list(json.loads(r.read())["data"]["activeTargets"])


def monitoring_queries(rule_groups: Mapping[str, Any],
                       dashboard: Mapping[str, Any]) -> dict[str, str]:
    """What must return series: every recording rule, the ``up`` of both kinds of target the
    alerts join on, and every dashboard query (Grafana variables as "all", rate windows 1m)."""
    out = {}
    for group in rule_groups["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                out[f"rule {rule['record']}"] = rule["record"]
    out["alert join: engine targets"] = 'up{component="engine"}'
    out["alert join: router targets"] = 'up{component="router"}'
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$namespace", ".*").replace("$instance", ".*")
                    .replace("$__rate_interval", "1m"))
            out[f"panel {panel['title']!r} {target['refId']}"] = expr
    return out


def chart_monitoring(namespace: str) -> tuple[list[dict[str, Any]], dict[str, Any],
                                                dict[str, Any]]:
    """The chart's PodMonitors, rule groups (evaluated every second) and dashboard, rendered by
    helm with ``monitoring.*`` on for ``namespace``."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "chart"))
    from chartkit import by_kind, helm_template, one

    objects = helm_template({"monitoring": {
        "namespaces": [namespace], "podMonitors": {"enabled": True},
        "prometheusRule": {"enabled": True, "interval": "1s"}, "dashboard": {"enabled": True}}})
    rules = {"groups": one(objects, "PrometheusRule")["spec"]["groups"]}
    dashboard = json.loads(next(c for c in by_kind(objects, "ConfigMap")
                                if c["metadata"]["name"].endswith("-dashboard"))
                           ["data"]["sglang-hicache.json"])
    return [dict(m) for m in by_kind(objects, "PodMonitor")], rules, dashboard


def wait_for_series(prom: PrometheusServer, queries: Mapping[str, str],
                    timeout: float = 120) -> None:
    """Every query returns at least one series within ``timeout`` (else the empty ones)."""
    deadline = time.monotonic() + timeout
    empty = dict(queries)
    while empty and time.monotonic() < deadline:
        empty = {k: q for k, q in empty.items() if not prom.query(q)}
        time.sleep(1)
    if empty:
        targets = [(t["labels"].get("job"), t["scrapeUrl"], t["health"], t.get("lastError"))
                   for t in prom.targets()]
        raise AssertionError(f"no series for: {sorted(empty)}; targets: {targets}")
