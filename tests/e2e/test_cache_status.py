"""Status that tells the truth: pods that exist, and the cache read from SGLang's own metrics.

Real: the operator (KopfRunner), the emulator, HTTP between the operator and the pods' metrics
endpoints (aiohttp servers on loopback addresses standing in for pod IPs), and the pages they
serve: real ``/metrics`` pages of SGLang 0.5.23 serving generated CPU pods, captured by the pod
tier (tests/support/sglang_pages.py). Faked: the emulated kubelet gives pods those loopback IPs,
and a pod's page is swapped for another real one to stand for time passing.
"""

from __future__ import annotations

from typing import Any

import pytest
import support.sglang_pages as P
import support.store_series as S
from e2e_lib import (
    EXAMPLES,
    NAMESPACE,
    RESYNC_S,
    Cluster,
    FakeSGLangMetrics,
    example,
    selector,
)
from hicache_operator.api.crd import PRINTER_COLUMNS
from hicache_operator.cachestats.sglang_metrics import aggregate, increase, parse_pod

pytestmark = pytest.mark.e2e

T0, T1 = P.page(P.EMBEDDED_T0), P.page(P.EMBEDDED_T1)
FAILING = P.page(P.BUILTIN_SIDECAR_RESTARTED)


def _expected_window() -> tuple[dict[str, float], float, str | None]:
    """status.cache of two pods that both served T0, then T1: the window between the two real
    pages, from SGLang's own answers to the requests in between (ratios); the host pool's use
    as the first scrape (T0) wrote it, because T1's moved by less than minRatioChange (0.02),
    which rewrites nothing."""
    between = P.told(P.EMBEDDED_T1)[len(P.told(P.EMBEDDED_T0)):]
    ratios = P.told_ratios(between)
    hit = {"total": round(sum(ratios.values()), 3), **{t: round(r, 3) for t, r in ratios.items()}}
    used = [aggregate([parse_pod(page)]).host_used_ratio for page in (T0, T1)]
    assert used[0] is not None and used[1] is not None and abs(used[1] - used[0]) < 0.02
    figures = aggregate([increase(parse_pod(T1), parse_pod(T0))] * 2)
    return hit, round(used[0], 3), figures.l3_writes


def _cr(name: str, replicas: int, port: int = 30000) -> dict[str, Any]:
    cr = example(next(p for p in EXAMPLES if "minimal" in p.stem), name)
    cr["spec"]["replicas"] = replicas
    cr["spec"]["engine"] = {"port": port}
    return cr


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.cr(name) or {}).get("status") or {})


def _cache(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(_status(cluster, name).get("cache") or {})


def _column(body: dict[str, Any], json_path: str) -> Any:
    node: Any = body
    for part in json_path.strip(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def test_status_replicas_counts_the_pods_that_exist(cluster: Cluster, operator: Any) -> None:
    """``status.replicas`` is what the scale subresource reads: pods that exist, not the
    desired count. With the emulated StatefulSet controller stopped no pod appears."""
    cluster.emu.call(lambda store: store.listeners.clear())
    cr = _cr("counted", replicas=2)
    cluster.apply(cr)
    cluster.wait_children(cr)
    cluster.wait(lambda: _status(cluster, "counted").get("observedGeneration") == 1,
                 "a status")
    assert (_status(cluster, "counted")["replicas"], cr["spec"]["replicas"]) == (0, 2)
    labels = {"app.kubernetes.io/name": "sglang-hicache",
              "app.kubernetes.io/instance": "counted"}
    cluster.emu.create("v1", "pods", {"metadata": {
        "name": "counted-0", "namespace": NAMESPACE, "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    cluster.wait(lambda: _status(cluster, "counted").get("replicas") == 1, "replicas 1")
    assert _status(cluster, "counted")["readyReplicas"] == 0


def test_cache_status_is_read_from_each_ready_pods_sglang_metrics(
        cluster: Cluster, operator: Any) -> None:
    with FakeSGLangMetrics(pods=2) as sglang:
        sglang.serve(T0)
        cr = _cr("cached", replicas=2, port=sglang.port)
        cluster.apply(cr)
        cluster.wait_children(cr)
        cluster.mark_pods_ready("cached", 2, ips=sglang.ips)
        # First scrape: a baseline per pod, the planned capacity, no ratio yet.
        cache = cluster.wait(lambda: (lambda c: c if c.get("pods") == 2 else {})(
            _cache(cluster, "cached")), "the first scrape of both pods")
        assert cache["tiers"] == [{"tier": "Host", "capacityBytes": 32 * 2**30},
                                  {"tier": "L3-DRAM", "capacityBytes": 64 * 2**30}]
        assert "hitRatio" not in cache
        # Traffic: both pods serve the same server's later page.
        sglang.serve(T1)
        cache = cluster.wait(lambda: (lambda c: c if "hitRatio" in c else {})(
            _cache(cluster, "cached")), "hit ratios")
        hit, host_used, l3_writes = _expected_window()
        assert cache["hitRatio"] == hit
        assert (cache["hostUsedRatio"], cache.get("l3Writes")) == (host_used, l3_writes)
        assert cache["windowSeconds"] == 300 and "message" not in cache
        body = cluster.cr("cached") or {}
        columns = {c["name"]: _column(body, c["jsonPath"]) for c in PRINTER_COLUMNS
                   if "cache" in c["jsonPath"]}
        assert columns == {"Hit": hit["total"], "Host-Hit": hit["host"], "L3-Hit": hit["storage"],
                           "Device-Hit": hit["device"], "L3-Writes": l3_writes,
                           # SGLang's pages alone: no store series, no split, no SSD figures
                           "SSD-Hit": None, "DRAM-Hit": None, "SSD-Read": None}
        # Unchanged figures: resyncs scrape (bounded: one request per pod) and write nothing.
        cluster.wait_settled(RESYNC_S)
        before = len(sglang.requests)
        assert cluster.writes_during(3 * RESYNC_S) == []
        scraped = len(sglang.requests) - before
        assert 2 <= scraped <= 2 * 5, scraped  # ~2 per resync of ~1 s, never a flood

        # The L3 stops taking writes (both pods serve the page of a real server whose every
        # L3 write failed): l3Writes Failing, one Event, and back.
        sglang.serve(FAILING)
        cluster.wait(lambda: _cache(cluster, "cached").get("l3Writes") == "Failing",
                     "l3Writes Failing")
        cluster.wait(lambda: [e for e in cluster.events("cached")
                              if e["reason"] == "StorageWritesFailing"], "the Event")
        sglang.serve(T1)
        cluster.wait(lambda: _cache(cluster, "cached").get("l3Writes") == "Ok", "l3Writes Ok")
        cluster.wait(lambda: [e for e in cluster.events("cached")
                              if e["reason"] == "StorageWritesRecovered"], "recovery Event")
        assert len([e for e in cluster.events("cached")
                    if e["reason"] == "StorageWritesFailing"]) == 1

        # A page the operator cannot read names the pod, and costs one status write.
        sglang.serve('sglang:prompt_tokens_total{broken="} 1\n', sglang.ips[1])
        cache = cluster.wait(lambda: (lambda c: c if "message" in c else {})(
            _cache(cluster, "cached")), "a scrape error in the status")
        assert "cached-1" in cache["message"] and cache["pods"] == 1
        cluster.wait_settled(RESYNC_S)
        assert cluster.writes_during(3 * RESYNC_S) == []


def test_pods_that_are_not_ready_are_not_scraped(cluster: Cluster, operator: Any) -> None:
    with FakeSGLangMetrics(pods=1) as sglang:
        sglang.serve(T0)
        cr = _cr("unready", replicas=1, port=sglang.port)
        cluster.apply(cr)
        cluster.wait_children(cr)
        cluster.wait(lambda: cluster.pods("unready"), "the pod")
        cluster.wait_settled(RESYNC_S)
        assert sglang.requests == []
        assert cluster.emu.list("v1", "pods", NAMESPACE, selector("unready"))
        cache = _cache(cluster, "unready")  # planned tiers, no live figure
        assert set(cache) == {"tiers", "pods", "windowSeconds"} and cache["pods"] == 0


def test_l3_hits_are_split_into_dram_and_ssd_in_status_and_columns(
        cluster: Cluster, operator: Any) -> None:
    """The pod's page: SGLang's real page after an engine restart and one L3 hit, with our
    store's series written by its real exporter (tests/support/store_series.py: 35 of the 105
    pages from the DRAM sidecar, 70 from the SSD tier). The first scrape sees the store before
    it read anything (every series at 0, no SGLang page yet), the second the hit: status.cache
    splits storage into l3Dram and l3Ssd and reports the SSD tier's bandwidth and fill, and
    the printer columns show them."""
    zero = S.store_series(S.ZERO_STATS)
    hit = S.page_with_store_series(P.page(P.STANDALONE_RESTARTED), S.FIXTURE.read_text())
    with FakeSGLangMetrics(pods=1) as sglang:
        sglang.serve(zero)
        cr = _cr("tiered", replicas=1, port=sglang.port)
        cluster.apply(cr)
        cluster.wait_children(cr)
        cluster.mark_pods_ready("tiered", 1, ips=sglang.ips)
        cluster.wait(lambda: _cache(cluster, "tiered").get("pods") == 1, "the first scrape")
        sglang.serve(hit)
        cache = cluster.wait(lambda: (lambda c: c if "hitRatio" in c else {})(
            _cache(cluster, "tiered")), "hit ratios")
        prompt = P.told(P.STANDALONE_RESTARTED)[0]["prompt_tokens"]
        storage = P.told(P.STANDALONE_RESTARTED)[0]["cached_tokens_details"]["storage"]
        assert cache["hitRatio"]["storage"] == round(storage / prompt, 3)
        assert cache["hitRatio"]["l3Dram"] == round(storage * 35 / 105 / prompt, 3)
        assert cache["hitRatio"]["l3Ssd"] == round(storage * 70 / 105 / prompt, 3)
        assert cache["ssd"] == {"readBytesPerSecond": 983_040_000,
                                "writeBytesPerSecond": 737_280_000, "pages": 210,
                                "capacityPages": 43_680, "evictions": 0, "readErrors": 0,
                                "writeErrors": 0}
        body = cluster.cr("tiered") or {}
        columns = {c["name"]: _column(body, c["jsonPath"]) for c in PRINTER_COLUMNS}
        assert columns["SSD-Hit"] == cache["hitRatio"]["l3Ssd"]
        assert columns["DRAM-Hit"] == cache["hitRatio"]["l3Dram"]
        assert columns["SSD-Read"] == 983_040_000
