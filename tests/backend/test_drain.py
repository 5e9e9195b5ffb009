"""The preStop drain hook (hicache_umbp.drain) against a fake clock and canned /metrics pages
(the served pod runs it for real: tests/pod/test_strict_node_pod.py)."""

from __future__ import annotations

from hicache_umbp.drain import drain, in_flight

PAGE = """# HELP sglang:num_running_reqs The number of running requests.
sglang:num_running_reqs{{model_name="m",tp_rank="0"}} {running}
sglang:num_running_reqs{{model_name="m",tp_rank="1"}} {running}
sglang:num_queue_reqs{{model_name="m",tp_rank="0"}} {queued}
sglang:num_used_tokens{{model_name="m"}} 900
"""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_in_flight_sums_running_and_queued_over_ranks() -> None:
    assert in_flight(PAGE.format(running=2.0, queued=1.0)) == 5
    assert in_flight(PAGE.format(running=0.0, queued=0.0)) == 0


def test_waits_for_the_endpoints_then_for_requests_to_finish() -> None:
    clock = Clock()
    pages = iter([PAGE.format(running=1.0, queued=0.0)] * 3 + [PAGE.format(running=0.0,
                                                                            queued=0.0)])
    ok, msg = drain("http://x", 60, 5, fetch=lambda _: next(pages), clock=clock,
                    sleep=clock.sleep)
    assert ok and clock.t == 8.0 and msg == "drained: 0 requests in flight after 8.0 s"


def test_gives_up_at_the_timeout_and_says_how_many_are_left() -> None:
    clock = Clock()
    ok, msg = drain("http://x", 30, 5, fetch=lambda _: PAGE.format(running=3.0, queued=1.0),
                    clock=clock, sleep=clock.sleep)
    assert not ok and "7 request(s) still in flight after 30.0 s" in msg


def test_a_server_without_metrics_is_drained_after_the_endpoint_delay() -> None:
    clock = Clock()
    ok, msg = drain("http://x", 30, 5, fetch=lambda _: None, clock=clock, sleep=clock.sleep)
    assert ok and clock.t == 5.0 and "no metrics" in msg
