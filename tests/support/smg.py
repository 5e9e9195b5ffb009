"""Asking SGLang's model gateway (smg 1.13.0) what it routes to, and waiting on it."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")


def _workers(router: str) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{router}/workers", timeout=5) as r:
            return list(json.loads(r.read())["workers"])
    except OSError:
        return []


def healthy_workers(router: str) -> set[str]:
    """The healthy workers' URLs in the router's own list (``GET <router>/workers``); empty
    while the router does not answer."""
    return {w["url"] for w in _workers(router) if w.get("is_healthy")}


def listed_workers(router: str) -> dict[str, str]:
    """Every worker in the router's own list by URL, healthy or not, with smg's status for it
    (``ready``, ``draining``: removed, and let go 5 s later); empty while the router does not
    answer."""
    return {w["url"]: str(w.get("status", "")) for w in _workers(router)}


def healthy_worker_ips(router: str) -> set[str]:
    return {str(urlsplit(url).hostname) for url in healthy_workers(router)}


#: The response header in which smg 1.13.0 names the worker (its URL) a request was routed to.
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"


def worker_series(metrics_url: str, name: str) -> dict[str, float]:
    """One of the router's per-worker series (``smg_worker_health``,
    ``smg_worker_requests_total``, ...) from its Prometheus page: {worker URL: value}, summed
    over the other labels; a worker the router has removed is absent."""
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'worker="' in line:
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            out[worker] = out.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def generate(base: str, model: str, text: str, max_new_tokens: int = 1) -> dict[str, Any]:
    """``POST <base>/generate`` (through the router it needs ``model``: smg's discovery mode
    routes by model); adds the client's latency as ``latency_s`` and the routed worker's IP
    (the router's header; ``""`` without a router) as ``worker_ip``."""
    body = json.dumps({"model": model, "text": text, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0}}).encode()
    req = urllib.request.Request(f"{base}/generate", body, {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out: dict[str, Any] = json.loads(r.read())
        worker = r.headers.get(ROUTED_WORKER_HEADER, "")
    out["latency_s"] = time.perf_counter() - t0
    out["worker_ip"] = urlsplit(worker).hostname or ""
    return out


def generate_stream(base: str, model: str, text: str, max_new_tokens: int) -> dict[str, Any]:
    """``POST <base>/generate`` with ``stream: true`` and ``ignore_eos`` (an answer of exactly
    ``max_new_tokens`` tokens): returns the last chunk (its ``text`` is the whole answer, its
    ``meta_info`` the hits) plus ``ttft_s`` (the client's time to the first chunk carrying a
    token), ``latency_s`` and ``worker``, the router's routed-worker header (``""`` without
    a router)."""
    body = json.dumps({"model": model, "text": text, "stream": True, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}).encode()
    req = urllib.request.Request(f"{base}/generate", body, {"content-type": "application/json"})
    t0 = time.perf_counter()
    ttft, last = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        worker = r.headers.get(ROUTED_WORKER_HEADER, "")
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            last = json.loads(line[len("data:"):])
            if ttft is None and last["meta_info"].get("completion_tokens", 0) > 0:
                ttft = time.perf_counter() - t0
    if last is None or ttft is None:
        raise AssertionError(f"{base}/generate streamed no token: {last}")
    out: dict[str, Any] = dict(last)
    out.update(ttft_s=ttft, latency_s=time.perf_counter() - t0, worker=worker)
    return out


def wait_until(what: Callable[[], T], label: str, timeout: float = 300) -> T:
    """Poll ``what`` every second until it returns something truthy; fail naming ``label``."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {label}")
        time.sleep(1)
