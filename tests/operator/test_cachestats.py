"""SGLang cache metrics: parsing, per-pod reduction, windows, the status block, the HTTP scrape.

Real: every page is a real ``/metrics`` page of SGLang 0.5.23 serving a generated CPU pod,
captured by the pod tier with what SGLang told each request it counts
(``tests/support/sglang_pages.py``): each figure parsed from a page is checked against those
answers. An aiohttp server on loopback for the scrape. Nothing is faked.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import support.sglang_pages as P
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
    L2_BACKUP,
    L3_BACKUP,
    MIN_BACKUP_TOKENS,
    PREFETCH_HIT,
    MetricsFormatError,
    aggregate,
    figures_from_pages,
    increase,
    parse_pod,
    parse_samples,
)
from hicache_operator.cachestats.status_block import cache_block

pytestmark = pytest.mark.unit

T0, T1 = P.page(P.EMBEDDED_T0), P.page(P.EMBEDDED_T1)
FAILING = P.page(P.BUILTIN_SIDECAR_RESTARTED)


def _prompt(requests: list[dict[str, object]]) -> int:
    return sum(int(str(r["prompt_tokens"])) for r in requests)


@pytest.mark.parametrize("name", P.ALL)
def test_a_real_page_reduces_to_what_sglang_told_each_request(name: str) -> None:
    requests = P.told(name)
    figures = figures_from_pages([P.page(name)])
    assert figures.prompt_tokens == _prompt(requests)
    for tier, want in P.told_ratios(requests).items():
        assert figures.hit_ratio(tier) == pytest.approx(want, abs=1e-9), tier
    assert figures.host_used_ratio is not None and 0 <= figures.host_used_ratio <= 1


def test_window_is_the_increase_between_two_scrapes_and_survives_restarts() -> None:
    """T0 and T1 are one server, T1 later; the window counts the requests in between."""
    first, later = P.told(P.EMBEDDED_T0), P.told(P.EMBEDDED_T1)
    assert later[: len(first)] == first
    between = later[len(first):]
    window = increase(parse_pod(T1), parse_pod(T0))
    assert window.prompt_tokens == _prompt(between)
    figures = aggregate([window])
    for tier, want in P.told_ratios(between).items():
        assert figures.hit_ratio(tier) == pytest.approx(want, abs=1e-9), tier
    assert window.host_used_tokens == parse_pod(T1).host_used_tokens  # gauges: latest
    restarted = increase(parse_pod(T0), parse_pod(T1))  # counters went down: a restart
    assert restarted == parse_pod(T0)


def test_ranks_that_count_the_same_tokens_are_reduced_with_the_maximum() -> None:
    """Both TP ranks of the MLA pod report the same device -> host backups and the same L3
    prefetch hits (one logical stream of tokens), while only the storage writer (rank 0)
    reports L3 backups: the pod's figures are the maximum over the ranks, not the sum (a sum
    would count the host backups twice and halve the share that reached L3)."""
    text = P.page(P.MLA_TP2)
    samples = parse_samples(text)
    pod = parse_pod(text)
    for family, figure in ((L2_BACKUP, pod.l2_backup_tokens),
                           (PREFETCH_HIT, pod.prefetch_hit_tokens)):
        per_rank = {s.labels["tp_rank"]: s.value for s in samples if s.name == family}
        assert sorted(per_rank) == ["0", "1"], family
        assert figure == max(per_rank.values()) < sum(per_rank.values()), family
    writers = {s.labels["tp_rank"] for s in samples if s.name == L3_BACKUP}
    assert writers == {"0"}
    assert aggregate([pod]).l3_writes == "Ok"


def test_failing_l3_writes_are_detected() -> None:
    """The built-in backend's pod after its sidecar restarted: host backups, no L3 backup."""
    figures = aggregate([parse_pod(FAILING)])
    assert figures.l3_backup_tokens == 0
    assert (figures.l2_backup_tokens or 0) >= MIN_BACKUP_TOKENS
    assert figures.l3_writes == "Failing"
    assert figures_from_pages([T1]).l3_writes == "Ok"


def umbp_lines(refused: int, stalls: int, lost: int) -> str:
    """Our store's families as prometheus_client's multiprocess collector prints them (two
    ranks; hicache_umbp.store.metrics)."""
    out = []
    for name, value in (("ssd_refused_keys", refused), ("writeback_stalls", stalls),
                        ("writeback_failed_keys", lost)):
        out.append(f"# TYPE hicache_umbp_{name}_total counter")
        out += [f'hicache_umbp_{name}_total{{local_rank="{r}"}} {value if r else 0}.0'
                for r in (0, 1)]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("refused, stalls, lost", [(3, 0, 0), (0, 1, 0), (0, 0, 2)])
def test_the_stores_own_refusal_counters_make_l3_writes_failing(
        refused: int, stalls: int, lost: int) -> None:
    """SGLang's L2/L3 ratio looks healthy (T0 -> T1), but our store counted SSD writes it could
    not get through in the window: Failing. The same counters standing still: Ok."""
    before = parse_pod(T0 + umbp_lines(0, 0, 0))
    assert (before.l3_refused_keys, before.l3_writeback_stalls, before.l3_lost_keys) == (0, 0, 0)
    after = parse_pod(T1 + umbp_lines(refused, stalls, lost))
    window = aggregate([increase(after, before)])
    assert (window.l3_refused_keys, window.l3_writeback_stalls, window.l3_lost_keys) == (
        refused, stalls, lost)
    assert window.l3_writes == "Failing"
    assert aggregate([increase(parse_pod(T1 + umbp_lines(0, 0, 0)), before)]).l3_writes == "Ok"


def test_pods_are_summed_and_idle_windows_have_no_ratio() -> None:
    figures = figures_from_pages([T1, P.page(P.STANDALONE_RESTARTED)])
    assert figures.pods == 2
    assert figures.prompt_tokens == _prompt(P.told(P.EMBEDDED_T1)) + _prompt(
        P.told(P.STANDALONE_RESTARTED))
    idle = aggregate([increase(parse_pod(T1), parse_pod(T1))])
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
    between = P.told(P.EMBEDDED_T1)[len(P.told(P.EMBEDDED_T0)):]
    ratios = {t: round(r, 3) for t, r in P.told_ratios(between).items()}
    assert first["hitRatio"] == {"total": round(sum(P.told_ratios(between).values()), 3),
                                 **ratios}
    t1 = parse_pod(T1)
    assert t1.host_used_tokens is not None and t1.host_total_tokens
    assert first["hostUsedRatio"] == round(t1.host_used_tokens / t1.host_total_tokens, 3)
    assert first["pods"] == 1
    # A tiny move keeps the old figures verbatim (no status write) ...
    nudged = {**first, "hitRatio": {**first["hitRatio"], "host": first["hitRatio"]["host"] + 0.01}}
    assert cache_block(TIERS, _observation((T0, T1)), nudged, 0.02) == nudged
    # ... a large one replaces them.
    moved = {**first, "hitRatio": {**first["hitRatio"], "host": first["hitRatio"]["host"] + 0.2}}
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

    async def handler(request: web.Request) -> web.StreamResponse:
        if not state.get("chunked"):
            return web.Response(text=str(state["page"]), status=int(str(state["status"])))
        # As a busy server sends a large page: in parts, some time apart.
        response = web.StreamResponse()
        await response.prepare(request)
        body = str(state["page"]).encode()
        for start in range(0, len(body), 16 * 1024):
            await response.write(body[start:start + 16 * 1024])
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

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
    want = P.told_ratios(P.told(P.EMBEDDED_T0))["device"]
    assert figures.hit_ratio("device") == pytest.approx(want)
    assert scrape_cache_figures([base, metrics_url(base)]).prompt_tokens == 2 * _prompt(
        P.told(P.EMBEDDED_T0))
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


def test_a_page_that_arrives_in_parts_is_read_whole(metrics_server: dict[str, object]) -> None:
    """A real page (80-130 KiB) reaches the operator in several parts when the server or the
    network is busy; the scrape reads to the end of the response, not what came first."""
    metrics_server["page"], metrics_server["chunked"] = T1, True
    figures = scrape_cache_figures(str(metrics_server["url"]))
    assert figures.prompt_tokens == _prompt(P.told(P.EMBEDDED_T1))

