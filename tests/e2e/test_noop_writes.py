"""Zero writes on a no-op resync, every time: kopf writes nothing but the finalizer.

The writes ``make bench-reconcile`` once counted in a no-op window were kopf's own: its
last-handled-configuration annotation, re-written when kopf's event stream lagged more than
its 5 s consistency timeout and it handled an event older than its own annotation patch as a
new creation. The operator now keeps no diff-base in the CR; these tests pin that down, with
the lag reproduced.

Real: the operator (KopfRunner), the emulator; the request log records every write with the
key paths of its body. Faked: the lag (the emulator holds every SGLangHiCache watch event back
by 6 s). The metrics pages are real pages of SGLang 0.5.23 captured by the pod tier.
"""

from __future__ import annotations

from typing import Any

import pytest
import support.sglang_pages as P
from e2e_lib import EXAMPLES, RESYNC_S, Cluster, FakeSGLangMetrics, example
from emulator import Fault

pytestmark = pytest.mark.e2e

FINALIZER_KEYS = {"test /metadata/resourceVersion", "add /metadata/finalizers",
                  "add /metadata/finalizers/-", "metadata.finalizers"}


def _cr_writes(cluster: Cluster) -> list[Any]:
    return [r for r in cluster.emu.writes() if r.plural == "sglanghicaches" and not
            r.subresource]


def _assert_only_finalizers(cluster: Cluster, names: list[str]) -> None:
    writes = _cr_writes(cluster)
    for record in writes:
        assert set(record.body_keys) <= FINALIZER_KEYS, (record.path, record.body_keys)
    applied = [r.name for r in writes if r.code == 200]
    assert sorted(applied) == sorted(names), applied  # one finalizer patch per CR


def test_kopf_writes_only_the_finalizer_and_a_noop_resync_nothing(
        cluster: Cluster, operator: Any) -> None:
    crs = [example(path, f"noop-{i}") for i, path in enumerate(EXAMPLES)]
    for cr in crs:
        cluster.apply(cr)
    for cr in crs:
        cluster.wait_children(cr)
        cluster.mark_pods_ready(cr["metadata"]["name"], int(cr["spec"].get("replicas", 1)))
        cluster.wait_condition(cr["metadata"]["name"], "Ready", "True")
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(4 * RESYNC_S) == []
    _assert_only_finalizers(cluster, [cr["metadata"]["name"] for cr in crs])


def test_a_lagging_event_stream_causes_no_extra_writes(cluster: Cluster, operator: Any) -> None:
    """Every SGLangHiCache event reaches kopf 6 s late (beyond its 5 s consistency timeout):
    the operator still converges, and writes nothing but the finalizer to the CR."""
    cluster.emu.drop_watches()  # the operator re-watches through the lagging stream
    cluster.emu.add_fault(Fault(method="WATCH", plural="sglanghicaches", event_delay=6.0,
                                times=None))
    cr = example(EXAMPLES[-1], "lagged")
    cluster.apply(cr)
    cluster.wait_children(cr, timeout=60)
    cluster.wait_condition("lagged", "SpecValid", "True", timeout=60)
    cluster.patch_spec("lagged", {"replicas": 3})
    cr["spec"]["replicas"] = 3
    cluster.wait_children(cr, timeout=60)
    cluster.wait(lambda: ((cluster.cr("lagged") or {}).get("status") or {}).get(
        "observedGeneration") == 2, "observedGeneration 2", timeout=60)
    cluster.wait_settled(RESYNC_S + 7, timeout=90)  # the lagging events have all arrived
    assert cluster.writes_during(2 * RESYNC_S + 7) == []
    _assert_only_finalizers(cluster, ["lagged"])


def test_noop_resync_with_cache_scraping_writes_nothing(cluster: Cluster, operator: Any) -> None:
    """Ready pods, their SGLang metrics scraped on every resync, nothing changing: 0 writes."""
    with FakeSGLangMetrics(pods=2) as sglang:
        sglang.serve(P.page(P.EMBEDDED_T0))
        cr = example(next(p for p in EXAMPLES if "minimal" in p.stem), "scraped")
        cr["spec"]["replicas"] = 2
        cr["spec"]["engine"] = {"port": sglang.port}
        cluster.apply(cr)
        cluster.wait_children(cr)
        cluster.mark_pods_ready("scraped", 2, ips=sglang.ips)
        cluster.wait(lambda: (((cluster.cr("scraped") or {}).get("status") or {}).get(
            "cache") or {}).get("pods") == 2, "both pods scraped")
        cluster.wait_settled(RESYNC_S)
        before = len(sglang.requests)
        assert cluster.writes_during(4 * RESYNC_S) == []
        assert len(sglang.requests) > before  # scraping went on all along
