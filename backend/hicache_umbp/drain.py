"""``python -m hicache_umbp.drain``: the engine container's ``preStop`` hook.

When a pod is deleted (rollout, scale-in, node drain) the kubelet runs ``preStop`` before it
sends SIGTERM, within ``terminationGracePeriodSeconds``. Without a hook SGLang gets SIGTERM at
once and every request in flight (a long generation of a large model can take minutes) fails.

What the hook does, in order:

1. readiness off: the pod is terminating, so the endpoints controller already marks it not
   ready in its EndpointSlices (``ready: false, terminating: true``) and Services and the
   router stop sending new requests; the hook waits ``--endpoint-delay`` seconds for that to
   reach every kube-proxy and client;
2. in-flight requests finish: it polls SGLang's ``/metrics`` (``sglang:num_running_reqs`` and
   ``sglang:num_queue_reqs``) until both are 0 or ``--timeout`` seconds passed;
3. with ``--l3-timeout`` (standalone pods): L3 takes what is still queued from the host pool
   (:func:`wait_l3_caught_up`), since the kubelet runs this hook also before an in-place image
   change restarts the engine, and the sidecars keep L3 for the new one;
4. returns; the kubelet then sends SIGTERM and SGLang exits, releasing its pinned host pool
   (the rest of the grace period, sized by the operator from the pool size).

The launcher's configuration watcher (``launch.revision``) drains the same way before it stops
the engine for a new configuration, and in standalone mode waits for L3 (at most
:data:`L3_CATCH_UP_TIMEOUT_S`): a page still queued between the host pool and L3 when the engine
stops is a page the restarted engine misses.

Prints one line; exits 1 when requests were still in flight at the timeout, which the kubelet
reports as a ``FailedPreStopHook`` event with that line (it sends SIGTERM either way).
The page is read with prometheus_client's parser (``contract.exposition``), as the operator
reads it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from .contract import exposition
from .contract.names import (
    SGLANG_L2_BACKUP_METRIC,
    SGLANG_L3_BACKUP_METRIC,
    SGLANG_L3_DROPPED_METRIC,
    SGLANG_RANK_LABELS,
)

IN_FLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
#: The longest an in-place restart waits for L3, and how long L3 may stand still before it
#: stops waiting (a tier refusing writes, or a write policy that backs up only some pages).
L3_CATCH_UP_TIMEOUT_S = 60.0
L3_STALL_S = 5.0


def _samples(metrics_text: str, names: tuple[str, ...]) -> list[exposition.Sample]:
    """The page's samples of ``names``; none when a line of them is not valid exposition text
    (read as "not exported": the drain never waits on a page it cannot read)."""
    try:
        return exposition.samples(metrics_text, names)
    except exposition.ExpositionError:
        return []


def in_flight(metrics_text: str) -> int:
    """Requests running or queued, summed over every rank's sample."""
    return int(sum(s.value for s in _samples(metrics_text, IN_FLIGHT_METRICS)))


def rank_reduced(metrics_text: str, name: str) -> float | None:
    """``name``'s value: the largest of the ranks' copies, summed over the other label sets;
    None when no sample of it is exported."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for s in _samples(metrics_text, (name, name.removesuffix("_total"))):
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in SGLANG_RANK_LABELS))
        groups[labels] = max(groups.get(labels, 0.0), s.value)
    return sum(groups.values()) if groups else None


def l3_behind(metrics_text: str) -> tuple[float, float] | None:
    """(tokens backed up to the host pool, of them in L3 or given up), or None when the engine
    exports no L3 backups (no storage backend, or metrics off)."""
    l2 = rank_reduced(metrics_text, SGLANG_L2_BACKUP_METRIC)
    l3 = rank_reduced(metrics_text, SGLANG_L3_BACKUP_METRIC)
    if l2 is None or l3 is None:
        return None
    return l2, l3 + (rank_reduced(metrics_text, SGLANG_L3_DROPPED_METRIC) or 0.0)


def read_metrics(base_url: str, timeout_s: float = 5.0) -> str | None:
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as r:
            return str(r.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def drain(
    base_url: str,
    timeout_s: float,
    endpoint_delay_s: float,
    *,
    poll_s: float = 1.0,
    fetch: Callable[[str], str | None] = read_metrics,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, str]:
    """Wait for the endpoints to drop the pod, then for in-flight requests to finish."""
    start = clock()
    sleep(endpoint_delay_s)
    last: int | None = None
    while True:
        text = fetch(base_url)
        waited = clock() - start
        if text is None:
            return True, (f"drained: no metrics at {base_url}/metrics (server gone or "
                          f"--enable-metrics off) after {waited:.1f} s")
        last = in_flight(text)
        if last == 0:
            return True, f"drained: 0 requests in flight after {waited:.1f} s"
        if waited >= timeout_s:
            return False, (f"not drained: {last} request(s) still in flight after "
                           f"{waited:.1f} s (--timeout {timeout_s:g})")
        sleep(poll_s)


def wait_l3_caught_up(
    base_url: str,
    timeout_s: float = L3_CATCH_UP_TIMEOUT_S,
    stall_s: float = L3_STALL_S,
    *,
    poll_s: float = 0.5,
    fetch: Callable[[str], str | None] = read_metrics,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, str]:
    """Wait until L3 holds every page SGLang backed up to the host pool, while it keeps moving:
    at most ``timeout_s``, and no longer than ``stall_s`` without progress."""
    start = clock()
    moved_at, last = start, -1.0
    while True:
        text = fetch(base_url)
        now = clock()
        counts = l3_behind(text) if text is not None else None
        if counts is None:
            return True, "no L3 backups exported: nothing to wait for"
        l2, l3 = counts
        if l3 >= l2:
            return True, (f"L3 caught up: {l3:.0f} of {l2:.0f} host-pool tokens after "
                          f"{now - start:.1f} s")
        if l3 > last:
            moved_at, last = now, l3
        if now - start >= timeout_s or now - moved_at >= stall_s:
            why = "timeout" if now - start >= timeout_s else f"no progress for {stall_s:g} s"
            return False, (f"L3 behind: {l3:.0f} of {l2:.0f} host-pool tokens after "
                           f"{now - start:.1f} s ({why}); the restarted engine misses the rest")
        sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hicache_umbp.drain", description=__doc__)
    p.add_argument("--timeout", type=float, required=True,
                   help="seconds to wait for in-flight requests")
    p.add_argument("--endpoint-delay", type=float, default=5.0,
                   help="seconds for the endpoints to drop the terminating pod")
    p.add_argument("--l3-timeout", type=float, default=0.0,
                   help="then at most this many seconds for L3 to take what is still queued "
                   "from the host pool (0: do not wait; standalone pods, whose sidecars keep L3 "
                   "for an engine restarted in place)")
    p.add_argument("--port", type=int, default=int(os.environ.get("HICACHE_PORT", "30000")))
    args = p.parse_args(argv)
    base = f"http://127.0.0.1:{args.port}"
    ok, message = drain(base, args.timeout, args.endpoint_delay)
    if args.l3_timeout > 0:
        caught_up, l3_message = wait_l3_caught_up(base, args.l3_timeout)
        ok, message = ok and caught_up, f"{message}; {l3_message}"
    print(f"hicache-drain: {message}", file=sys.stdout if ok else sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
