"""Asking SGLang's model gateway (smg 1.13.0) what it routes to, and waiting on it."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")


def healthy_workers(router: str) -> set[str]:
    """The healthy workers' URLs in the router's own list (``GET <router>/workers``); empty
    while the router does not answer."""
    try:
        with urllib.request.urlopen(f"{router}/workers", timeout=5) as r:
            data = json.loads(r.read())
    except OSError:
        return set()
    return {w["url"] for w in data["workers"] if w.get("is_healthy")}


def healthy_worker_ips(router: str) -> set[str]:
    return {str(urlsplit(url).hostname) for url in healthy_workers(router)}


def generate(base: str, model: str, text: str, max_new_tokens: int = 1) -> dict[str, Any]:
    """``POST <base>/generate`` (through the router it needs ``model``: smg's discovery mode
    routes by model); adds the client's latency as ``latency_s``."""
    body = json.dumps({"model": model, "text": text, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0}}).encode()
    req = urllib.request.Request(f"{base}/generate", body, {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out: dict[str, Any] = json.loads(r.read())
    out["latency_s"] = time.perf_counter() - t0
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
