"""Cache affinity under load through the real router: which worker each follow-up turn reaches.

Real: SGLang's model gateway ``smg`` 1.13.0 (the binary images/router installs) with the
routing arguments the planner renders for a CR (policy, thresholds, tree size, health checks and
the load rules of ``spec.router``), its load polling of ``/v1/loads``, its cache-aware tree and
its worker API. Faked: the engines (``sglang_standin``: SGLang 0.5.23's captured answers, the
load each reports set by the workload, every request's text recorded); workers are given by
``--worker-urls`` and ``POST /workers`` instead of Kubernetes discovery (``test_router_discovery``
covers that), and the load is polled every second instead of smg's 10 s so a case takes seconds.

The workload: ``sessions`` conversations, each turn the previous prompt plus new text. Turn 0
of every session is sent while the workers are idle (cache_aware spreads them). Then the worker
holding the most sessions reports a long queue and a nearly full KV pool (``busy_waiting``,
``busy_token_usage``: long-context load on the pod that holds their prefixes) and a new, empty
worker joins (a scale-up), and ``turns`` follow-up turns per session are sent one at a time.
A follow-up is *affine* when it reaches a worker that served the session's previous turn (that
worker holds the whole prompt but the new text); ``prefix_chars`` sums, per follow-up, the
longest prompt of the session the chosen worker was sent before (its prefix hit, with an
unbounded cache), over the follow-ups' characters. Counts only: no timing decides anything.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_standin import SGLangStandIn

MODEL = "/models/tiny-llama"  # the captured stand-in's model
#: Rendered flags that belong to the pod, not to routing: dropped (value count).
_POD_FLAGS = {"--host": 1, "--port": 1, "--prometheus-host": 1, "--prometheus-port": 1,
              "--service-discovery": 0, "--service-discovery-namespace": 1,
              "--service-discovery-port": 1, "--enable-mesh": 0, "--mesh-server-name": 1,
              "--mesh-host": 1, "--mesh-advertise-host": 1, "--mesh-port": 1}
#: Flags followed by any number of values (up to the next flag).
_LISTS = ("--selector", "--router-selector")
#: The load rules the planner pins; without them smg runs its defaults.
LOAD_RULE_FLAGS = {"--disable-worker-overload-protection": 0, "--worker-overload-protection": 0,
                   "--worker-overload-waiting-requests": 1, "--worker-overload-token-usage": 1,
                   "--worker-warmup-divert-every": 1}


@dataclass(frozen=True)
class LoadResult:
    case: str
    followups: int
    affine: int  # follow-ups that reached the worker holding the previous turn
    sessions_on_busy: int  # sessions whose turn 0 went to the worker made busy
    to_new_worker: int  # follow-ups the joining (empty) worker received
    prefix_chars: int
    prompt_chars: int

    @property
    def affinity(self) -> float:
        return self.affine / self.followups if self.followups else 0.0

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_chars / self.prompt_chars if self.prompt_chars else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case, "followups": self.followups, "affine": self.affine,
                "affinity": round(self.affinity, 4), "sessions_on_busy": self.sessions_on_busy,
                "to_new_worker": self.to_new_worker,
                "prefix_hit_ratio": round(self.prefix_hit_ratio, 4)}


def drop_flags(args: list[str], flags: dict[str, int]) -> list[str]:
    """``args`` without ``flags`` (each with its value count) and the label selectors
    (``_LISTS``: every value up to the next flag)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _LISTS:
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                i += 1
            continue
        if a in flags:
            i += 1 + flags[a]
            continue
        out.append(a)
        i += 1
    return out


def routing_args(deployment: dict[str, Any]) -> list[str]:
    """The router Deployment's arguments without what only the pod needs (its ports,
    Kubernetes discovery and the mesh between router pods): ``launch`` and every routing
    flag."""
    args = list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    return drop_flags(args, _POD_FLAGS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(base: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"{base}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def _wait(what: Callable[[], Any], label: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {label}")
        time.sleep(0.2)


def _healthy(base: str) -> set[str]:
    try:
        with urllib.request.urlopen(f"{base}/workers", timeout=5) as r:
            return {w["url"] for w in json.loads(r.read())["workers"] if w.get("is_healthy")}
    except OSError:
        return set()


@contextmanager
def started_router(smg: Path, args: list[str], urls: list[str], log: Path,
                   *extra: str) -> Iterator[str]:
    """A fresh smg started with ``args`` (``launch`` and routing flags) and ``extra`` in front
    of ``urls``, once it lists all of them as healthy; yields its base URL."""
    router_port, metrics_port = free_port(), free_port()
    base = f"http://127.0.0.1:{router_port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(smg), *args, "--host", "127.0.0.1", "--port", str(router_port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
             *extra, "--worker-urls", *urls],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait(lambda: _healthy(base) == set(urls), "the router's workers")
            yield base
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def run_case(smg: Path, case: str, args: list[str], ips: tuple[str, str, str], log: Path, *,
             sessions: int = 16, turns: int = 3, busy_waiting: int = 16,
             busy_token_usage: float = 0.9) -> LoadResult:
    """One run of the workload (module docstring) through a fresh smg started with ``args``
    (``launch`` and routing flags) in front of workers at ``ips`` (the third joins later)."""
    port = free_port()
    urls = [f"http://{ip}:{port}" for ip in ips]
    with ExitStack() as stack:
        workers = [stack.enter_context(SGLangStandIn(ip, port)) for ip in ips]
        base = stack.enter_context(started_router(smg, args, urls[:2], log,
                                                  "--load-monitor-interval", "1"))

        def send(text: str) -> None:
            post(base, "/generate", {"model": MODEL, "text": text,
                                      "sampling_params": {"max_new_tokens": 1}})

        def owner(text: str) -> int:
            found = [i for i, w in enumerate(workers) if text in w.texts]
            assert len(found) == 1, f"a request reached {len(found)} workers"
            return found[0]

        prompts = {s: f"conversation {s:03d}: " + f"a long shared context, part {s}. " * 60
                   for s in range(sessions)}
        served: dict[int, list[tuple[str, int]]] = {s: [] for s in range(sessions)}
        for s, text in prompts.items():
            send(text)
            served[s].append((text, owner(text)))
        counts = [sum(1 for s in served if served[s][0][1] == w) for w in (0, 1)]
        busy = 0 if counts[0] >= counts[1] else 1
        # The holder of the most sessions turns busy; the router must have seen it (two of
        # its load polls after the change) before the follow-ups.
        polls = workers[busy].load_polls()
        workers[busy].waiting, workers[busy].token_usage = busy_waiting, busy_token_usage
        _wait(lambda: workers[busy].load_polls() >= polls + 2, "the busy worker's load polls")
        post(base, "/workers", {"url": urls[2]})
        _wait(lambda: _healthy(base) == set(urls), "the joining worker")
        joined = workers[2].load_polls()
        _wait(lambda: workers[2].load_polls() >= joined + 2, "the joining worker's load polls")

        followups = affine = to_new = prefix = chars = 0
        for turn in range(1, turns + 1):
            for s in range(sessions):
                text = served[s][-1][0] + f" turn {turn}: " + f"new words of turn {turn}. " * 20
                send(text)
                w = owner(text)
                followups += 1
                affine += w == served[s][-1][1]
                to_new += w == 2
                prefix += max((len(t) for t, holder in served[s] if holder == w), default=0)
                chars += len(text)
                served[s].append((text, w))
        return LoadResult(case=case, followups=followups, affine=affine,
                          sessions_on_busy=counts[busy], to_new_worker=to_new,
                          prefix_chars=prefix, prompt_chars=chars)
