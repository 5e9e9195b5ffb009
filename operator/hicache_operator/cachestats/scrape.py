"""Fetch SGLang's ``/metrics`` over HTTP: short timeout, bounded size, bounded concurrency.

The operator scrapes each ready engine pod on the resync timer (``controller.cache_observer``);
tests of a real server call :func:`scrape_cache_figures`. Parsing lives in ``sglang_metrics``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from .sglang_metrics import CacheFigures, PodCounters, aggregate, parse_pod

DEFAULT_TIMEOUT_S = 2.0
#: A /metrics page of SGLang 0.5.23 is about 80-130 KiB (histograms included; the real pages in
#: tests/fixtures/sglang-metrics); more than 4 MiB is not SGLang.
MAX_PAGE_BYTES = 4 * 1024 * 1024
METRICS_PATH = "/metrics"


class ScrapeError(Exception):
    """A pod's metrics could not be read (connection, HTTP status, size, format)."""


def metrics_url(base: str) -> str:
    """``http://host:port`` (or a URL already ending in /metrics) -> the metrics URL."""
    base = base.rstrip("/")
    return base if base.endswith(METRICS_PATH) else base + METRICS_PATH


def pod_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip  # IPv6 pod IPs
    return f"http://{host}:{port}{METRICS_PATH}"


async def fetch_page(session: aiohttp.ClientSession, url: str,
                     timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_bytes: int = MAX_PAGE_BYTES) -> str:
    """The text of one metrics page; raises ``ScrapeError`` with the reason."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s),
                               headers={"Accept": "text/plain"}) as response:
            if response.status != 200:
                raise ScrapeError(f"{url}: HTTP {response.status}")
            # StreamReader.read(n) returns what has arrived, up to n bytes: a real page (80-130
            # KiB from SGLang 0.5.23) often arrives in several chunks, so read to the end.
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > max_bytes:
                    break
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
    if len(body) > max_bytes:
        raise ScrapeError(f"{url}: more than {max_bytes} bytes")
    return body.decode("utf-8", errors="replace")


async def fetch_pod(session: aiohttp.ClientSession, url: str,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> PodCounters:
    text = await fetch_page(session, url, timeout_s)
    try:
        return parse_pod(text)
    except ValueError as exc:
        raise ScrapeError(f"{url}: {exc}") from exc


@dataclass(frozen=True)
class ScrapeResult:
    figures: CacheFigures  # cumulative since each server started, summed over the pods read
    errors: dict[str, str]  # url -> why it was not read


async def scrape_urls(urls: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> ScrapeResult:
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(fetch_pod(session, metrics_url(u), timeout_s)
                                         for u in urls), return_exceptions=True)
    pods, errors = [], {}
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, PodCounters):
            pods.append(result)
        elif isinstance(result, ScrapeError):
            errors[url] = str(result)
        else:
            raise result
    return ScrapeResult(aggregate(pods), errors)


def scrape_cache_figures(urls: str | Sequence[str],
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> CacheFigures:
    """Per-tier cache figures of one or more SGLang servers, cumulative since they started.

    ``urls``: a server's base URL (``http://127.0.0.1:30000``) or its metrics URL, or a list of
    them (one per pod of a CR, summed as the operator sums them). Blocking; raises
    ``ScrapeError`` if any server cannot be read. ``figures.hit_ratio("host")`` etc. give the
    ratios the operator writes into ``status.cache``.
    """
    targets = [urls] if isinstance(urls, str) else list(urls)
    result = asyncio.run(scrape_urls(targets, timeout_s))
    if result.errors:
        raise ScrapeError("; ".join(result.errors.values()))
    return result.figures
