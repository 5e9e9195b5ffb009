"""The router's memory on multi-turn chat: smg 1.13.0's RSS against the characters its prefix
tree holds, for short and long turns (issue 25 item 13: the planner sizes the router from
bytes per character of tree, and short turns make more tree nodes per character).

Real: smg 1.13.0 (``make router-env``), ``smg launch --policy cache_aware`` with a tree large
enough never to evict, routing ``/generate`` requests to two SGLang stand-ins
(``tests/e2e/sglang_standin.py``: SGLang's captured answers; the router's tree does not depend
on the answer). Each conversation resends its whole history each turn (a 2,000-character system
prompt shared by all, then user and assistant turns), as chat clients do; the characters a
request adds to the tree are its length minus the previous turn's. RSS is the process's
``VmRSS`` after each batch; the bytes per tree character and per request are a least-squares
fit over both workloads, measured in one run.

Usage: ``.venv/bin/python bench/router_memory.py`` (``make bench-router-memory``). Last line:
one JSON object.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "tests"))

from sglang_standin import SGLangStandIn  # noqa: E402

SMG = ROOT / ".cache" / "bin" / "smg"
IPS = ("127.0.0.10", "127.0.0.11")
SYSTEM_CHARS = 2000
BATCH = 100
#: (name, new user characters per turn, assistant characters per turn, conversations, turns)
WORKLOADS = (("short turns", 80, 160, 60, 20), ("long turns", 1600, 600, 40, 10))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _words(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _post(url: str, text: str) -> None:
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode()
    req = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def _wait(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/workers", timeout=2) as r:
                data = json.loads(r.read())
            if sum(w.get("is_healthy") is True for w in data["workers"]) == len(IPS):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the router never listed both workers healthy")


def run_workload(name: str, user: int, answer: int, convs: int, turns: int,
                 engine_port: int) -> dict[str, Any]:
    port = _port()
    proc = subprocess.Popen(
        [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
         "--worker-urls", *(f"http://{ip}:{engine_port}" for ip in IPS),
         "--max-tree-size", str(10**10), "--eviction-interval-secs", "100000",
         "--prometheus-port", str(_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url)
        rng = random.Random(7)
        system = _words(rng, SYSTEM_CHARS)
        histories = [system] * convs
        _post(url, system)  # the shared prefix, once
        time.sleep(1)
        base = _rss(proc.pid)
        points = [(0, 0, base)]
        chars = requests = 0
        for turn in range(turns):
            for c in range(convs):
                before = len(histories[c])
                if turn:
                    histories[c] += " A: " + _words(rng, answer)
                histories[c] += " U: " + _words(rng, user)
                _post(url, histories[c])
                chars += len(histories[c]) - before
                requests += 1
                if requests % BATCH == 0:
                    points.append((chars, requests, _rss(proc.pid)))
        time.sleep(1)
        points.append((chars, requests, _rss(proc.pid)))
        grown = points[-1][2] - base
        return {"workload": name, "requests": requests, "tree_chars": chars,
                "chars_per_request": round(chars / requests), "rss_base": base,
                "rss_grown": grown, "bytes_per_char": round(grown / chars, 2),
                "bytes_per_request": round(grown / requests), "points": points}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def fit(results: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares of rss - base = a x chars + b x requests over every point."""
    sxx = sxy = syy = sxz = syz = 0.0
    for r in results:
        for chars, reqs, rss in r["points"]:
            z = rss - r["rss_base"]
            sxx += chars * chars
            sxy += chars * reqs
            syy += reqs * reqs
            sxz += chars * z
            syz += reqs * z
    det = sxx * syy - sxy * sxy
    return (sxz * syy - syz * sxy) / det, (syz * sxx - sxz * sxy) / det


def main() -> int:
    if not SMG.exists():
        print(f"{SMG} is missing: run `make router-env`", file=sys.stderr)
        return 2
    engine_port = _port()
    with SGLangStandIn(IPS[0], engine_port), SGLangStandIn(IPS[1], engine_port):
        results = [run_workload(*w, engine_port=engine_port) for w in WORKLOADS]
    per_char, per_request = fit(results)
    for r in results:
        print(f"{r['workload']:<12} {r['requests']:>5} requests, {r['tree_chars']:>9,} tree chars "
              f"({r['chars_per_request']:,}/request): RSS +{r['rss_grown'] / 2**20:.1f} MiB = "
              f"{r['bytes_per_char']} B/char, {r['bytes_per_request']:,} B/request")
    print(f"fit: {per_char:.2f} B per tree character + {per_request:,.0f} B per request")
    print(json.dumps({"bytes_per_char_fit": round(per_char, 3),
                      "bytes_per_request_fit": round(per_request),
                      "workloads": [{k: v for k, v in r.items() if k != "points"}
                                    for r in results]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
