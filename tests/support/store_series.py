"""Our store's own ``/metrics`` series (``hicache_umbp_*``), written by the real exporter.

SGLang serves them on its ``/metrics`` page beside its own families: the store's
:class:`hicache_umbp.store.metrics.StoreMetrics` exports each rank's stats through
``prometheus_client`` in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, which SGLang sets with
``--enable-metrics``). :func:`store_series` runs that exporter, in that mode, in a child process
(its families are process-wide) and returns the exposition text the HTTP server would add to the
page. ``tests/fixtures/sglang-metrics/store-hicache-ssd-series.txt`` is its output for
:data:`AFTER_RESTART_STATS` (a unit test keeps the file equal to what the exporter writes).

The stats are chosen, not measured: they stand for the one L3 hit of the captured
standalone-after-restart page (1,680 tokens = 105 pages of 16 tokens, 35 served by the DRAM
sidecar and 70 by the hicache SSD tier). A pod-tier capture of a pod running the hicache engine
(``HICACHE_CAPTURE_METRICS_DIR``) carries the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "sglang-metrics"
           / "store-hicache-ssd-series.txt")

#: One rank's stats (the adapter's ``stats()``): 105 L3 pages, 70 of them from SSD, each page
#: two 24,576 B parts (the tiny Llama's K and V at pageSize 16) read in 3.5 ms.
AFTER_RESTART_STATS: dict[int, dict[str, Any]] = {0: {
    "tier_pages": {"dram": 35, "ssd": 70},
    "disk": {"read_bytes": 70 * 2 * 24_576, "read_ns": 3_500_000,
             "written_bytes": 105 * 2 * 24_576, "write_ns": 7_000_000, "evictions": 0,
             "write_errors": 0, "read_errors": 0, "pages": 210, "capacity": 43_680},
}}

#: The same rank before anything was read or written: every family at 0.
ZERO_STATS: dict[int, dict[str, Any]] = {0: {
    "tier_pages": {"dram": 0, "ssd": 0},
    "disk": {"read_bytes": 0, "read_ns": 0, "written_bytes": 0, "write_ns": 0, "evictions": 0,
             "write_errors": 0, "read_errors": 0, "pages": 0, "capacity": 43_680},
}}

_CHILD = """
import json, os, sys
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from hicache_umbp.store.metrics import StoreMetrics
for rank, stats in json.loads(sys.stdin.read()).items():
    StoreMetrics(int(rank)).update(stats)
registry = CollectorRegistry()
MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
sys.stdout.write(generate_latest(registry).decode())
"""


def store_series(stats_by_rank: dict[int, dict[str, Any]]) -> str:
    """The exposition text of the real exporter for these ranks' stats (module docstring)."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": d}
        done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(stats_by_rank),
                              capture_output=True, text=True, env=env, check=True, timeout=60)
    return done.stdout


def page_with_store_series(sglang_page: str, series: str) -> str:
    """A ``/metrics`` page: SGLang's families, then the store's."""
    return sglang_page.rstrip("\n") + "\n" + series
