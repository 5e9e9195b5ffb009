"""The preStop drain hook (hicache_umbp.drain) against a fake clock and canned /metrics pages
(the served pod runs it for real: tests/pod/test_strict_node_pod.py)."""

from __future__ import annotations

from hicache_umbp.drain import drain, in_flight, l3_behind, rank_reduced, wait_l3_caught_up

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


# An MLA pod's two ranks each export the same L3 count (the pages they share); the L2 count is
# per rank and equal too.
L3_PAGE = """sglang:hicache_backup_tokens_total{{pool="kv",tp_rank="0"}} {l2}
sglang:hicache_backup_tokens_total{{pool="kv",tp_rank="1"}} {l2}
sglang:backuped_tokens_total{{storage_backend="dynamic",tp_rank="0"}} {l3}
sglang:backuped_tokens_total{{storage_backend="dynamic",tp_rank="1"}} {l3}
sglang:hicache_backup_dropped_tokens_total{{storage_backend="dynamic",tp_rank="0"}} {dropped}
"""


def test_l3_counts_take_one_copy_per_rank_and_count_dropped_backups_as_settled() -> None:
    assert l3_behind(L3_PAGE.format(l2=1024.0, l3=512.0, dropped=64.0)) == (1024.0, 576.0)
    assert rank_reduced(L3_PAGE.format(l2=1.0, l3=2.0, dropped=0.0),
                        "sglang:backuped_tokens_total") == 2.0
    assert l3_behind(PAGE.format(running=0.0, queued=0.0)) is None  # no storage backend


def test_the_l3_wait_ends_when_l3_holds_what_the_host_pool_got() -> None:
    clock = Clock()
    pages = iter([L3_PAGE.format(l2=1024.0, l3=256.0 * i, dropped=0.0) for i in range(5)])
    ok, msg = wait_l3_caught_up("http://x", fetch=lambda _: next(pages), clock=clock,
                                sleep=clock.sleep)
    assert ok and clock.t == 2.0
    assert msg == "L3 caught up: 1024 of 1024 host-pool tokens after 2.0 s"


def test_the_l3_wait_stops_when_l3_stands_still_and_says_what_is_missing() -> None:
    clock = Clock()
    ok, msg = wait_l3_caught_up("http://x", timeout_s=60, stall_s=5,
                                fetch=lambda _: L3_PAGE.format(l2=1024.0, l3=512.0, dropped=0.0),
                                clock=clock, sleep=clock.sleep)
    assert not ok and clock.t == 5.0
    assert "L3 behind: 512 of 1024 host-pool tokens after 5.0 s (no progress for 5 s)" in msg


def test_the_l3_wait_is_bounded_while_l3_keeps_moving() -> None:
    clock = Clock()
    counter = iter(range(10**6))
    ok, msg = wait_l3_caught_up(
        "http://x", timeout_s=10, stall_s=5,
        fetch=lambda _: L3_PAGE.format(l2=10.0**9, l3=float(next(counter)), dropped=0.0),
        clock=clock, sleep=clock.sleep)
    assert not ok and clock.t == 10.0 and "(timeout)" in msg


def test_an_engine_without_l3_or_metrics_is_not_waited_for() -> None:
    pages: tuple[str | None, ...] = (PAGE.format(running=0.0, queued=0.0), None)
    for page in pages:
        clock = Clock()

        def fetch(_: str, p: str | None = page) -> str | None:
            return p

        ok, msg = wait_l3_caught_up("http://x", fetch=fetch, clock=clock, sleep=clock.sleep)
        assert ok and clock.t == 0.0 and "nothing to wait for" in msg


def test_data_parallel_ranks_are_parts_not_copies() -> None:
    """dp ranks hold their own pages: one rank's lag is not hidden by another's lead."""
    page = """sglang:hicache_backup_tokens_total{pool="kv",tp_rank="0",dp_rank="0"} 100
sglang:hicache_backup_tokens_total{pool="kv",tp_rank="0",dp_rank="1"} 50
sglang:backuped_tokens_total{storage_backend="dynamic",tp_rank="0",dp_rank="0"} 100
sglang:backuped_tokens_total{storage_backend="dynamic",tp_rank="0",dp_rank="1"} 10
"""
    assert l3_behind(page) == (150.0, 110.0)


def test_the_drain_reads_the_page_as_the_operator_does() -> None:
    """One parser (prometheus_client's, ``contract.exposition``) for the drain and the
    operator's cache status: escaped label values and exponents read alike; a page whose
    wanted lines are broken reads as "not exported", so the drain never waits on it."""
    from hicache_operator.cachestats.sglang_metrics import parse_samples

    page = ('sglang:num_running_reqs{model_name="a \\"b\\"",tp_rank="0"} 2e0\n'
            'sglang:num_queue_reqs{model_name="a \\"b\\"",tp_rank="0"} 1\n')
    assert in_flight(page) == 3
    assert [(s.labels["model_name"], s.value) for s in parse_samples(
        page, ("sglang:num_running_reqs",))] == [('a "b"', 2.0)]
    assert in_flight("sglang:num_running_reqs{tp_rank=0} 4\n") == 0
    assert rank_reduced("sglang:hicache_backup_tokens_total 1,5\n",
                        "sglang:hicache_backup_tokens_total") is None
