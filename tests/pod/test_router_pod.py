"""Two served replicas behind the real router, in a pod network, through the API emulator.

Real: the operator reconciling the CPU example with ``router.enabled`` in the API emulator; the
engine pods the emulator's StatefulSet controller creates, run by the strict pod tier (the
launcher, SGLang 0.5.23 over real mori 1.2.4, the pod's probes, uid 10001, seccomp
RuntimeDefault, no ambient capabilities, cpuset and memory cgroups), each in its own network
namespace with its own IP, all on port 30000; the router Deployment's pod, run by the same tier
from the router image's stand-in, as SGLang's real model gateway (smg 1.13.0) with exactly the
command, arguments, probes, user and memory limit the planner rendered, discovering the engine
pods through the emulator (list, watch) and reaching them by pod IP; requests sent to the router
as clients would; which pod served each one from the router's own header, worker list and
metrics; hits read from each response's ``meta_info``, from every pod's ``/metrics`` and from
the operator's ``status.cache``; a real Prometheus (Debian 2.42) with the chart's rules
scraping the engines and the router. Emulated or faked: see ``pod.cluster`` (the API server,
the scheduler, GPUs, the images' read-only root filesystems) and ``support.prometheus`` (pod
discovery through HTTP SD).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.prometheus import (
    PodDiscovery,
    PrometheusServer,
    chart_monitoring,
    monitoring_queries,
    scrape_configs,
    wait_for_series,
)
from support.smg import generate, healthy_worker_ips, wait_until, worker_series

from .cluster import served_cluster
from .harness import load_cr

pytestmark = pytest.mark.pod
NS = "hicache-test"
NAME = "tiny-llama"
MODEL = "/models/tiny-llama"
SYSTEM = " ".join(f"system{j} rule policy" for j in range(90))


def _cr() -> dict[str, Any]:
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    cr["metadata"]["namespace"] = NS
    cr["spec"]["replicas"] = 1
    # One router pod: this test is about the engines behind it (two routers and their mesh:
    # tests/e2e/test_router_mesh.py)
    cr["spec"]["router"] = {"enabled": True, "replicas": 1, "healthCheck": {
        "intervalSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 1, "successThreshold": 1}}
    return cr


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _ready(api: Any, pod: str) -> str:
    """The pod's Ready condition in the API (what the kubelet reported)."""
    got = api.request("GET", f"/api/v1/namespaces/{NS}/pods/{pod}") or {}
    return next((c["status"] for c in (got.get("status") or {}).get("conditions") or []
                 if c["type"] == "Ready"), "")


def _status(api: Any) -> dict[str, Any]:
    return dict(api.cr(NS, NAME).get("status") or {})


@pytest.mark.timeout(1800)
def test_two_replicas_behind_the_router_in_a_pod_network(
        node: Any, image: Any, workdir: Path, models_dir: Path) -> None:
    from hicache_operator.cachestats import scrape_cache_figures

    with served_cluster(workdir, node, image, models_dir, NS) as (api, kubelet, _net):
        api.create_cr(_cr())
        pod = wait_until(lambda: next(iter(api.list(
            f"/api/v1/namespaces/{NS}/pods", "app.kubernetes.io/name=sglang-hicache-router")),
            None), "the router pod", 60)
        router_pod, args = pod["metadata"]["name"], pod["spec"]["containers"][0]["args"]
        wait_until(lambda: f"{NAME}-0" in kubelet.running, "pod 0 started", 60)
        running = wait_until(lambda: kubelet.running.get(router_pod), "the router pod running")
        router = f"http://{running.iface.ip}:{args[args.index('--port') + 1]}"
        metrics = f"http://{running.iface.ip}:{args[args.index('--prometheus-port') + 1]}"
        ip0 = kubelet.ip(f"{NAME}-0")
        url0 = f"http://{ip0}:30000"
        wait_until(lambda: healthy_worker_ips(router) == {ip0}, "the router to route to pod 0", 900)

        # One pod: a session's second turn hits.
        first = generate(router, MODEL, SYSTEM + " user0 turn0")
        again = generate(router, MODEL, SYSTEM + " user0 turn0 more")
        assert again["meta_info"]["cached_tokens"] > 0, again["meta_info"]

        # 1 -> 2: the new pod gets its own IP on the same port and joins the router's workers.
        api.patch_cr(NS, NAME, {"replicas": 2})
        wait_until(lambda: f"{NAME}-1" in kubelet.running, "pod 1 started", 60)
        ip1 = kubelet.ip(f"{NAME}-1")
        assert ip1 != ip0
        url1 = f"http://{ip1}:30000"
        wait_until(lambda: healthy_worker_ips(router) == {ip0, ip1}, "both pods routed", 900)
        wait_until(lambda: worker_series(metrics, "smg_worker_health") == {url0: 1, url1: 1},
                   "both workers healthy in the router's metrics", 60)
        assert [m["id"] for m in _get(f"http://{ip0}:30000/v1/models")["data"]] == \
            [m["id"] for m in _get(f"http://{ip1}:30000/v1/models")["data"]] == [MODEL]

        # Sessions through the router: each one's turns stay on one pod (cache_aware, the
        # router's own routed-worker header) and hit.
        responses = [first, again]
        pods: dict[int, set[str]] = {}
        for turn in range(3):
            for user in range(4):
                responses.append(generate(router, MODEL, SYSTEM + "".join(
                    f" user{user} turn{t} question{t}" for t in range(turn + 1))))
                pods.setdefault(user, set()).add(responses[-1]["worker_ip"])
        assert all(len(p) == 1 and p <= {ip0, ip1} for p in pods.values()), pods
        later = responses[2 + 4:]
        assert sum(r["meta_info"]["cached_tokens"] for r in later) > 0.5 * sum(
            r["meta_info"]["prompt_tokens"] for r in later)

        # Hits: the responses, the pods' /metrics and the operator's status.cache agree.
        prompt = sum(r["meta_info"]["prompt_tokens"] for r in responses)
        want = {tier: sum((r["meta_info"].get("cached_tokens_details") or {}).get(tier, 0)
                          for r in responses) / prompt for tier in ("device", "host", "storage")}
        figures = scrape_cache_figures([f"http://{ip0}:30000", f"http://{ip1}:30000"])
        for tier, ratio in want.items():
            assert figures.hit_ratio(tier) == pytest.approx(ratio, abs=0.02), tier
        wait_until(lambda: (_status(api).get("cache") or {}).get("hitRatio"), "status.cache", 120)
        wait_until(lambda: abs(((_status(api).get("cache") or {}).get("hitRatio") or {}).get(
            "total", -1) - sum(want.values())) <= 0.05, "status.cache to agree", 120)
        wait_until(lambda: (_status(api).get("router") or {}).get("workers") == 2,
              "status.router.workers 2", 60)

        # Pages leave the device pools for the host pools and L3 (SGLang creates its backup
        # counters at the first backup): fillers push the sessions out, as in test_serving_pod.
        for i in range(4):
            generate(router, MODEL, " ".join(f"other{i} filler{j} text" for j in range(120)))

        # A real Prometheus with the chart's rules scrapes both engines and the router: every
        # rule and dashboard query returns series, except those over L3 reads, which SGLang
        # exports only after a storage prefetch (an L3 hit after a restart: the e2e tier
        # evaluates them on the real page captured after one, tests/fixtures/sglang-metrics).
        monitors, rules, dashboard = chart_monitoring(NS)
        needs_l3_read = ("l3_read", "prefetch", "L3 batch bandwidth' B")
        (workdir / "prometheus").mkdir()
        with PodDiscovery(api.url, [NS]) as sd, PrometheusServer(
                workdir / "prometheus", scrape_configs(monitors, sd.url, "5s"), rules) as prom:
            # 5 s: SGLang's multiprocess /metrics can take over a second on 2 busy cores, and a
            # scrape's timeout is its interval.
            queries = {k: q for k, q in monitoring_queries(rules, dashboard).items()
                       if not any(word in k or word in q for word in needs_l3_read)}
            wait_for_series(prom, queries, 180)
            up = {(t["labels"]["component"], t["labels"]["pod_ip"]) for t in prom.targets()
                  if t["health"] == "up"}
            assert {("engine", ip0), ("engine", ip1), ("router", running.iface.ip)} <= up

        # Pod 1 hangs (its processes stopped): its readiness probe fails, the kubelet reports
        # it not Ready, and the router stops routing to it: its own worker list, its health
        # gauge, and its per-worker request counter, which stays where it was for pod 1.
        kubelet.pause(f"{NAME}-1", True)
        wait_until(lambda: _ready(api, f"{NAME}-1") == "False", "pod 1 not Ready in the API",
                   300)
        wait_until(lambda: healthy_worker_ips(router) == {ip0}, "pod 1 out of the router's set",
                   300)
        wait_until(lambda: not worker_series(metrics, "smg_worker_health").get(url1),
                   "pod 1's worker unhealthy or gone in the router's metrics", 60)
        before = worker_series(metrics, "smg_worker_requests_total")
        for i in range(3):
            out = generate(router, MODEL, SYSTEM + f" after the hang {i}")
            assert out["text"] and out["worker_ip"] == ip0, out
        after = worker_series(metrics, "smg_worker_requests_total")
        assert after[url0] == before[url0] + 3, (before, after)
        assert after.get(url1, 0) == before.get(url1, 0), (before, after)
        kubelet.pause(f"{NAME}-1", False)

        # 2 -> 1: pod 1 goes, and with it the router's worker.
        api.patch_cr(NS, NAME, {"replicas": 1})
        wait_until(lambda: f"{NAME}-1" not in kubelet.running, "pod 1 stopped", 120)
        wait_until(lambda: healthy_worker_ips(router) == {ip0}, "the router back to pod 0 only",
                   120)
        wait_until(lambda: not worker_series(metrics, "smg_worker_health").get(url1),
                   "no healthy pod 1 in the router's metrics", 120)
        assert worker_series(metrics, "smg_worker_health").get(url0) == 1
        wait_until(lambda: (_status(api).get("router") or {}).get("workers") == 1,
              "status.router.workers 1", 60)
