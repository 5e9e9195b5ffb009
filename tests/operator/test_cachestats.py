"""SGLang cache metrics: parsing, per-pod reduction, windows, the status block, the HTTP scrape.

Real: the provisional fixtures in tests/fixtures/sglang-metrics/ are prometheus_client's own
multiprocess exposition of SGLang 0.5.23's metric definitions (see make_provisional.py; the
counts are made up), an aiohttp server on loopback for the scrape. Nothing else is faked.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from hicache_operator.cachestats.observer import CacheObservation
from hicache_operator.cachestats.scrape import (
    ScrapeError,
    fetch_page,
    metrics_url,
    pod_url,
    scrape_cache_figures,
)
from hicache_operator.cachestats.sglang_metrics import (
    MetricsFormatError,
    aggregate,
    figures_from_pages,
    increase,
    parse_pod,
    parse_samples,
)
from hicache_operator.cachestats.status_block import cache_block

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-metrics"
T0 = (FIXTURES / "provisional-0.5.23-tp2-umbp-t0.txt").read_text()
T1 = (FIXTURES / "provisional-0.5.23-tp2-umbp-t1.txt").read_text()
FAILING = (FIXTURES / "provisional-0.5.23-tp2-umbp-l3-failing.txt").read_text()


def test_fixture_page_reduces_to_per_tier_figures() -> None:
    pod = parse_pod(T0)
    assert pod.prompt_tokens == 20000  # streaming and not, summed
    assert dict(pod.cached_tokens) == {"device": 6000, "host": 3000, "storage": 2000}
    # Two TP ranks report the same logical tokens: max, not sum.
    assert pod.l3_backup_tokens == 12288 and pod.l2_backup_tokens == 12288
    assert pod.prefetch_hit_tokens == 2048
    assert (pod.host_used_tokens, pod.host_total_tokens) == (24576, 65536)
    figures = aggregate([pod])
    assert figures.hit_ratio() == pytest.approx(0.55)
    assert [figures.hit_ratio(t) for t in ("device", "host", "storage")] == pytest.approx(
        [0.3, 0.15, 0.1])
    assert figures.host_used_ratio == pytest.approx(0.375)
    assert figures.l3_writes == "Ok"


def test_window_is_the_increase_between_two_scrapes_and_survives_restarts() -> None:
    window = increase(parse_pod(T1), parse_pod(T0))
    assert window.prompt_tokens == 20000 and window.cached_tokens["host"] == 3000
    assert window.host_used_tokens == parse_pod(T1).host_used_tokens  # gauges: latest
    restarted = increase(parse_pod(T0), parse_pod(T1))  # counters went down: a restart
    assert restarted == parse_pod(T0)


def test_failing_l3_writes_are_detected() -> None:
    figures = aggregate([parse_pod(FAILING)])
    assert figures.l3_backup_tokens == 0 and figures.l2_backup_tokens == 3 * 12288
    assert figures.l3_writes == "Failing"


def test_pods_are_summed_and_idle_windows_have_no_ratio() -> None:
    figures = figures_from_pages([T0, T1])
    assert figures.pods == 2 and figures.prompt_tokens == 60000
    idle = aggregate([increase(parse_pod(T0), parse_pod(T0))])
    assert idle.hit_ratio() is None and idle.l3_writes == "Idle"


def test_parser_is_tolerant_of_extra_labels_escapes_and_other_families() -> None:
    text = "\n".join([
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens.",
        "# TYPE sglang:cached_tokens_total counter",
        'sglang:cached_tokens_total{cache_source="host",model_name="a \\"b\\" \\\\c",'
        'priority="",my_label="x,y}"} 10.0 1700000000000',
        'sglang:cached_tokens_total_created{cache_source="host"} 1.7e9',
        'sglang:prompt_tokens_total{dp_rank="0"} 30',
        'sglang:prompt_tokens_total{dp_rank="1"} 70',  # DP ranks serve different requests
        'sglang:storage_prefetch_hit_tokens_total{dp_rank="0",tp_rank="0"} 5',
        'sglang:storage_prefetch_hit_tokens_total{dp_rank="0",tp_rank="1"} 5',
        'sglang:storage_prefetch_hit_tokens_total{dp_rank="1",tp_rank="0"} 7',
        "sglang:gen_throughput NaN",
        "some_other_metric 1",
        "",
    ])
    samples = parse_samples(text)
    assert samples[0].labels["model_name"] == 'a "b" \\c'
    assert samples[0].labels["my_label"] == "x,y}"
    pod = parse_pod(text)
    assert pod.prompt_tokens == 100 and pod.cached_tokens == {"host": 10}
    assert pod.prefetch_hit_tokens == 12  # max within a DP rank, summed over DP ranks
    assert pod.l2_backup_tokens is None and pod.host_used_tokens is None


def test_parser_refuses_broken_lines_of_its_families() -> None:
    with pytest.raises(MetricsFormatError):
        parse_samples('sglang:prompt_tokens_total{a="1} 3')
    with pytest.raises(MetricsFormatError):
        parse_samples("sglang:prompt_tokens_total{} many")


def _observation(pages: tuple[str, str] | None, read: int = 1,
                 failed: tuple[str, ...] = ()) -> CacheObservation:
    figures = None
    if pages is not None:
        figures = aggregate([increase(parse_pod(pages[1]), parse_pod(pages[0]))])
    return CacheObservation(figures, read, failed, 300)


TIERS = [{"tier": "Host", "capacityBytes": 2**30}]


def test_status_block_changes_only_when_a_figure_moves_enough() -> None:
    first = cache_block(TIERS, _observation((T0, T1)), None, 0.02)
    assert first is not None
    assert first["hitRatio"] == {"total": 0.55, "device": 0.3, "host": 0.15, "storage": 0.1}
    assert (first["hostUsedRatio"], first["l3Writes"], first["pods"]) == (0.562, "Ok", 1)
    # A tiny move keeps the old figures verbatim (no status write) ...
    nudged = {**first, "hitRatio": {**first["hitRatio"], "host": 0.16}}
    assert cache_block(TIERS, _observation((T0, T1)), nudged, 0.02) == nudged
    # ... a large one replaces them.
    moved = {**first, "hitRatio": {**first["hitRatio"], "host": 0.40}}
    assert cache_block(TIERS, _observation((T0, T1)), moved, 0.02) == first
    # Between scrapes and in idle windows the figures stay; with no ready pod they go.
    assert cache_block(TIERS, None, first, 0.02) == first
    assert cache_block(TIERS, _observation((T1, T1)), first, 0.02) == first
    gone = cache_block(TIERS, _observation(None, read=0), first, 0.02)
    assert gone == {"tiers": TIERS, "windowSeconds": 300, "pods": 0}


def test_status_block_names_pods_that_could_not_be_read() -> None:
    block = cache_block(TIERS, _observation(None, read=1, failed=("x-1",)), None, 0.02)
    assert block is not None and "x-1" in block["message"]


@pytest.fixture
def metrics_server() -> Iterator[dict[str, object]]:
    """SGLang's /metrics page on loopback (the page is swapped by the test)."""
    state: dict[str, object] = {"page": T0, "status": 200}
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner_box: list[web.AppRunner] = []

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=str(state["page"]), status=int(str(state["status"])))

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        runner_box.append(runner)
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    ready.wait(10)
    yield state
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_scrape_cache_figures_reads_real_http(metrics_server: dict[str, object]) -> None:
    base = str(metrics_server["url"])
    figures = scrape_cache_figures(base)
    assert figures.hit_ratio("host") == pytest.approx(0.15)
    assert scrape_cache_figures([base, metrics_url(base)]).prompt_tokens == 40000
    metrics_server["status"] = 503
    with pytest.raises(ScrapeError, match="HTTP 503"):
        scrape_cache_figures(base)


def test_scrape_refuses_oversized_pages_and_dead_ports(metrics_server: dict[str, object]) -> None:
    base = str(metrics_server["url"])

    async def fetch(limit: int) -> str:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await fetch_page(session, metrics_url(base), 2.0, max_bytes=limit)

    assert asyncio.run(fetch(1 << 20)) == T0
    with pytest.raises(ScrapeError, match="more than 100 bytes"):
        asyncio.run(fetch(100))
    with pytest.raises(ScrapeError):
        scrape_cache_figures("http://127.0.0.1:9", timeout_s=1.0)
    assert pod_url("fd00::1", 30000) == "http://[fd00::1]:30000/metrics"


def test_real_pages_captured_from_the_pod_tier_reduce_to_what_the_clients_were_told() -> None:
    """Real: /metrics pages of SGLang 0.5.23 serving the CPU example pods with our backend
    (captured by tests/pod with HICACHE_CAPTURE_METRICS_DIR). The embedded pod served a cold
    prompt of 1681 tokens, the same prompt from the device (1680 cached), four 2144-token fillers
    and the prompt again from the host pool (1680); the standalone pod, restarted, served it
    once from L3 (1680 of 1681)."""
    embedded = parse_pod((FIXTURES / "real-0.5.23-tp1-umbp-embedded.txt").read_text())
    figures = aggregate([embedded])
    assert figures.hit_ratio("device") == pytest.approx(1680 / 12259)
    assert figures.hit_ratio("host") == pytest.approx(1680 / 12259)
    assert figures.hit_ratio("storage") == 0
    assert figures.l3_writes == "Ok"  # every page backed up to the host reached L3 (7104)
    restarted = figures_from_pages(
        [(FIXTURES / "real-0.5.23-tp1-umbp-standalone-after-restart.txt").read_text()])
    assert restarted.hit_ratio("storage") == pytest.approx(1680 / 1681)
    assert restarted.hit_ratio("device") == restarted.hit_ratio("host") == 0
