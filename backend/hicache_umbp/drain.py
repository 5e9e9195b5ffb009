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
3. returns; the kubelet then sends SIGTERM and SGLang exits, releasing its pinned host pool
   (the rest of the grace period, sized by the operator from the pool size).

Prints one line; exits 1 when requests were still in flight at the timeout, which the kubelet
reports as a ``FailedPreStopHook`` event with that line (it sends SIGTERM either way).
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

IN_FLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def in_flight(metrics_text: str) -> int:
    """Requests running or queued, summed over every rank's sample."""
    total = 0.0
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in IN_FLIGHT_METRICS:
            total += float(m.group(3))
    return int(total)


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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hicache_umbp.drain", description=__doc__)
    p.add_argument("--timeout", type=float, required=True,
                   help="seconds to wait for in-flight requests")
    p.add_argument("--endpoint-delay", type=float, default=5.0,
                   help="seconds for the endpoints to drop the terminating pod")
    p.add_argument("--port", type=int, default=int(os.environ.get("HICACHE_PORT", "30000")))
    args = p.parse_args(argv)
    ok, message = drain(f"http://127.0.0.1:{args.port}", args.timeout, args.endpoint_delay)
    print(f"hicache-drain: {message}", file=sys.stdout if ok else sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
