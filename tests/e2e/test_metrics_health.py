"""The operator process's Prometheus metrics and kopf liveness endpoint (real HTTP).

Real: ``python -m hicache_operator run`` as a process, the emulator, urllib as the scraper.
"""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest
from e2e_lib import EXAMPLES, Cluster, OperatorProcess, example

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_metrics_and_liveness(cluster: Cluster, operator_process: OperatorProcess) -> None:
    metrics_port, health_port = _free_port(), _free_port()
    operator_process.start("--metrics-port", str(metrics_port),
                           "--liveness", f"http://127.0.0.1:{health_port}/healthz")
    cluster.wait_operator_watching()
    cr: dict[str, Any] = example(EXAMPLES[0], "scraped")
    cluster.apply(cr)
    cluster.wait_children(cr)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = cluster.wait(lambda: (lambda t: t if 'result="ok"' in t else "")(_get(metrics_url)),
                        "a successful reconcile in the metrics")
    assert 'hicache_operator_reconciles_total{result="ok",trigger="create"}' in text
    assert 'hicache_operator_managed_objects{kind="StatefulSet"} 1.0' in text
    assert 'hicache_operator_writes_total{kind="StatefulSet",verb="create"} 1.0' in text
    assert "hicache_operator_reconcile_duration_seconds_count" in text
    assert cluster.wait(lambda: _get(f"http://127.0.0.1:{health_port}/healthz"),
                        "kopf's liveness endpoint")
