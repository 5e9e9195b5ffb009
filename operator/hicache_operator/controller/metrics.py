"""Operator metrics (prometheus_client), served on ``--metrics-port`` (default 9090).

- ``hicache_operator_reconciles_total{trigger,result}``: reconciles by trigger (create, update,
  resume, timer, drift) and result (ok, invalid, retry, error).
- ``hicache_operator_reconcile_duration_seconds``: histogram of one reconcile.
- ``hicache_operator_api_calls_total{method,code}``: the operator's own API calls.
- ``hicache_operator_writes_total{verb,kind}``: creates/patches/deletes it issued.
- ``hicache_operator_managed_objects{kind}``: children currently rendered across all CRs.
- ``hicache_operator_resources{phase}``: CRs per status phase.
- ``hicache_operator_cache_scrapes_total{result}``: SGLang /metrics scrapes of engine pods.
- ``hicache_operator_cache_scrape_duration_seconds``: histogram of one pod's scrape.
"""

from __future__ import annotations

import prometheus_client

REGISTRY = prometheus_client.CollectorRegistry(auto_describe=True)

RECONCILES = prometheus_client.Counter(
    "hicache_operator_reconciles", "Reconciles of SGLangHiCache resources",
    ("trigger", "result"), registry=REGISTRY)
RECONCILE_SECONDS = prometheus_client.Histogram(
    "hicache_operator_reconcile_duration_seconds", "Time to reconcile one SGLangHiCache",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
API_CALLS = prometheus_client.Counter(
    "hicache_operator_api_calls", "Kubernetes API calls made by the operator's API module",
    ("method", "code"), registry=REGISTRY)
WRITES = prometheus_client.Counter(
    "hicache_operator_writes", "Writes (create/patch/delete) issued by the operator",
    ("verb", "kind"), registry=REGISTRY)
MANAGED_OBJECTS = prometheus_client.Gauge(
    "hicache_operator_managed_objects", "Children rendered for all SGLangHiCache resources",
    ("kind",), registry=REGISTRY)
RESOURCES = prometheus_client.Gauge(
    "hicache_operator_resources", "SGLangHiCache resources by status phase", ("phase",),
    registry=REGISTRY)

CACHE_SCRAPES = prometheus_client.Counter(
    "hicache_operator_cache_scrapes", "Scrapes of engine pods' SGLang /metrics", ("result",),
    registry=REGISTRY)
CACHE_SCRAPE_SECONDS = prometheus_client.Histogram(
    "hicache_operator_cache_scrape_duration_seconds", "Time to scrape one engine pod",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY)

_started: set[int] = set()


def record_scrape(result: str, seconds: float) -> None:
    """One engine pod's /metrics scrape (the cache observer's listener)."""
    CACHE_SCRAPES.labels(result).inc()
    CACHE_SCRAPE_SECONDS.observe(seconds)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the /metrics HTTP endpoint once per port (idempotent across operator restarts)."""
    if port and port not in _started:
        prometheus_client.start_http_server(port, addr=addr, registry=REGISTRY)
        _started.add(port)
