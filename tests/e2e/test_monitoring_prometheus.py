"""A real Prometheus, configured from the chart's PodMonitors and PrometheusRule, discovers the
CR's engine and router pods through the API emulator and every rule and dashboard query returns
series.

Real: helm rendering the chart's PodMonitors, PrometheusRule and dashboard; Debian's Prometheus
2.42 with those rules and the scrape jobs prometheus-operator generates from those PodMonitors
(``support.prometheus``), discovering the pods the emulator lists (Debian's build has no
Kubernetes discovery: the pods come through its HTTP discovery with the labels its Kubernetes
pod role gives them, ``support.prometheus.PodDiscovery``); the operator and the router
Deployment it plans; the real smg 1.13.0 router, its ``smg_*`` metrics after requests routed
through it. Emulated: the API server and the
controllers (pod IPs on loopback). Faked: the engines, which answer with the real SGLang 0.5.23
``/metrics`` pages of ``tests/fixtures/sglang-metrics`` (the pod tier scrapes real ones); the
second pod's page carries our store's series too (L3 pages by tier, the SSD tier's bytes,
seconds, fill and errors), written by the store's real exporter for chosen stats
(``tests/support/store_series.py``), so the L3-tier and SSD rules and panels have series.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import support.store_series as S
from e2e_lib import NAMESPACE, REPO, Cluster
from router_lib import (  # noqa: F401 (router_process is a fixture)
    NAME,
    POD_IPS,
    ROUTER_POD_IP,
    _cr,
    _free_port,
    _healthy_workers,
    _set_ready,
    router_process,
)
from sglang_standin import SGLangStandIn
from support.prometheus import (
    PodDiscovery,
    PrometheusServer,
    chart_monitoring,
    monitoring_queries,
    scrape_configs,
    wait_for_series,
)

pytestmark = pytest.mark.e2e
PAGES = (REPO / "tests/fixtures/sglang-metrics/real-0.5.23-tp1-umbp-embedded.txt",
         REPO / "tests/fixtures/sglang-metrics/real-0.5.23-tp1-umbp-standalone-after-restart.txt")


def test_every_rule_and_dashboard_query_returns_series(
        cluster: Cluster, operator: Any, router_process: Any,  # noqa: F811
        tmp_path: Path) -> None:
    monitors, rules, dashboard = chart_monitoring(NAMESPACE)
    engine_port, router_port, metrics_port = _free_port(), _free_port(), _free_port()
    cr = _cr(engine_port, router_port, metrics_port)
    cr["spec"]["replicas"] = 2
    tiered = tmp_path / "standalone-after-restart-with-store-series.txt"
    tiered.write_text(S.page_with_store_series(PAGES[1].read_text(), S.FIXTURE.read_text()))
    cluster.apply(cr)
    deployment = cluster.wait(lambda: cluster.child(("apps/v1", "deployments"),
                                                    f"{NAME}-router"), "the router Deployment")
    with SGLangStandIn(POD_IPS[0], engine_port, PAGES[0]), \
            SGLangStandIn(POD_IPS[1], engine_port, tiered):
        router_process(deployment)
        router_pod = cluster.wait(
            lambda: next(iter(cluster.emu.list("v1", "pods", NAMESPACE,
                                               "app.kubernetes.io/name=sglang-hicache-router")),
                         None), "the router pod")
        _set_ready(cluster, router_pod["metadata"]["name"], ROUTER_POD_IP, True)
        cluster.mark_pods_ready(NAME, 2, list(POD_IPS))
        url = {f"http://{ip}:{engine_port}" for ip in POD_IPS}
        cluster.wait(lambda: _healthy_workers(router_port) == url, "both workers", 60)
        for i in range(6):
            request = urllib.request.Request(
                f"http://127.0.0.1:{router_port}/generate", method="POST",
                data=json.dumps({"model": "/models/tiny-llama", "text": f"session {i}",
                                 "sampling_params": {"max_new_tokens": 1}}).encode(),
                headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=10).read()
        with PodDiscovery(cluster.emu.url, [NAMESPACE]) as sd, PrometheusServer(
                tmp_path, scrape_configs(monitors, sd.url, interval="1s"), rules) as prom:
            wait_for_series(prom, monitoring_queries(rules, dashboard), 90)
            targets = prom.targets()
            assert {(t["labels"]["component"], t["labels"]["pod_ip"]) for t in targets
                    if t["health"] == "up"} == {("engine", POD_IPS[0]), ("engine", POD_IPS[1]),
                                                ("router", ROUTER_POD_IP)}
            # The router serves both pods: the alert's join finds no pod outside its set.
            assert prom.query('hicache:router_workers:healthy') [0]["value"][1] == "2"
            assert prom.query('(hicache:engine_up == 1) unless on (namespace, '
                              'hicache_instance, pod_ip) (hicache:router_worker_healthy == 1)'
                              ) == []
