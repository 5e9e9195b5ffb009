"""Replicas behind the router: prompt-token hit ratio and TTFT, cache_aware vs round_robin vs
one replica, and the effect of the router's tree size, on the same two served pods in one run.

Runs the embedded CPU example (examples/cpu/tiny-llama-embedded.yaml, with its model's KV
geometry so the planner sizes the router's tree from the pods' cache) with ``replicas: 2`` the
way the pod tier's router test does (``tests/pod/cluster``): the real operator in the API
emulator, the two engine pods run for real (launcher, SGLang 0.5.23 over real mori 1.2.4), each
in its own network namespace on port 30000, and SGLang's real model gateway (smg 1.13.0) as
the router pod with the arguments the planner renders, discovering the pods through the API.

Workload: 8 system prompts, 3 users each, 5 turns per user (each turn's prompt is the system
prompt, the session's earlier turns and replies, and a new question), the 24 sessions
interleaved in a shuffled order, 1 generated token per request (its latency is the time to the
first token). The same workload runs in each phase, on the same servers:

1. ``single``: every request to pod 0 directly;
2. ``cache_aware``: through the router, its tree sized by the planner;
3. ``round_robin``: through the router (``router.policy: round_robin``);
4. ``small_tree``: cache_aware with the tree cut to what the engines' GPU KV pools hold
   (``router.tree.maxSize``: 4096 tokens x 4 characters x 2 pods), the router's default view.

Each phase's texts carry the phase's own tag at the start, so no phase hits another's cache;
before each phase the engines' radix caches are flushed (``/flush_cache``). A router change is
a change of the CR (``spec.router``), which the operator rolls out (a new router pod, the same
engine pods). Hit ratio = cached prompt tokens / prompt tokens, from each response's
``meta_info`` (all tiers and per tier: device, host, storage). Last line: one JSON object.
Needs root (like the pod tier) and ``make router-env``. Run: ``make bench-router``.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pod.cluster import served_cluster  # noqa: E402
from pod.harness import load_cr  # noqa: E402
from pod.image import make_image  # noqa: E402
from pod.node import Node  # noqa: E402
from support.smg import generate, healthy_worker_ips, wait_until  # noqa: E402

NS, NAME, MODEL, PORT = "hicache-bench", "tiny-llama", "/models/tiny-llama", 30000
SYSTEMS, USERS, TURNS = 8, 3, 5
SMALL_TREE = 4096 * 4 * 2  # the engines' device KV pools (4096 tokens each) in characters


def workload(tag: str) -> list[tuple[int, int]]:
    """The request order: (session, turn) pairs, sessions interleaved, the same every phase."""
    rng = random.Random(7)
    order: list[tuple[int, int]] = []
    for turn in range(TURNS):
        sessions = list(range(SYSTEMS * USERS))
        rng.shuffle(sessions)
        order += [(s, turn) for s in sessions]
    return order


def system_prompt(tag: str, i: int) -> str:
    return f"{tag} " + " ".join(f"system{i} rule{j} policy" for j in range(60))


def question(session: int, turn: int) -> str:
    return " ".join(f"user{session} turn{turn} ask{j}" for j in range(25))


def run_phase(tag: str, base: str) -> dict[str, Any]:
    history: dict[int, str] = {}
    responses = []
    for session, turn in workload(tag):
        if turn == 0:
            history[session] = system_prompt(tag, session // USERS)
        text = history[session] + " " + question(session, turn)
        out = generate(base, MODEL, text)
        history[session] = text + out["text"]
        responses.append(out)
    prompt = sum(r["meta_info"]["prompt_tokens"] for r in responses)
    tiers = {t: round(sum((r["meta_info"].get("cached_tokens_details") or {}).get(t, 0)
                          for r in responses) / prompt, 4) for t in ("device", "host", "storage")}
    return {"hit_ratio": round(sum(r["meta_info"]["cached_tokens"] for r in responses) / prompt,
                               4),
            "hit_ratio_by_tier": tiers, "requests": len(responses), "prompt_tokens": prompt,
            "ttft_p50_s": round(statistics.median(r["latency_s"] for r in responses), 4)}


def flush(ips: list[str]) -> None:
    for ip in ips:
        urllib.request.urlopen(urllib.request.Request(f"http://{ip}:{PORT}/flush_cache",
                                                      method="POST"), timeout=60).read()


def router_for(api: Any, kubelet: Any, spec: dict[str, Any], ips: set[str]) -> tuple[str, int]:
    """Apply ``spec.router``, wait for the router pod running it to route to both pods."""
    api.patch_cr(NS, NAME, {"router": spec})

    def current() -> tuple[str, int] | None:
        dep = api.request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}-router")
        if dep is None:
            return None
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        if args[args.index("--policy") + 1] != spec.get("policy", "cache_aware"):
            return None
        pods = [p for p in api.list(f"/api/v1/namespaces/{NS}/pods",
                                    "app.kubernetes.io/name=sglang-hicache-router")
                if p["spec"]["containers"][0]["args"] == args and p["metadata"]["name"]
                in kubelet.running]
        if not pods:
            return None
        base = f"http://{kubelet.ip(pods[0]['metadata']['name'])}:{PORT}"
        if healthy_worker_ips(base) != ips:
            return None
        return base, int(args[args.index("--max-tree-size") + 1])
    return wait_until(current, f"a router with {spec} routing to both pods", 900)


def main() -> None:
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    cr["metadata"]["namespace"] = NS
    cr["spec"]["replicas"] = 2
    # 2 layers x 2 KV heads x head dim 32 x 2 B (bf16) x 2 (K and V): the tiny Llama.
    cr["spec"]["model"].update(attention="mha", kvBytesPerToken=512)
    fast = {"intervalSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 1,
            "successThreshold": 1}
    cr["spec"]["router"] = {"enabled": True, "healthCheck": fast,
                            "tree": {"evictionIntervalSeconds": 2}}
    from hicache_cpu_engine.tiny_model import make_model

    with tempfile.TemporaryDirectory(prefix="bench-router-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        models = root / "models"
        make_model(models / "tiny-llama", "llama")
        image = make_image(root / "image")
        (root / "pods").mkdir()
        (root / "pods").chmod(0o755)
        with Node(root / "node") as node, served_cluster(root / "pods", node, image, models,
                                                         NS) as (api, kubelet, _net):
            api.create_cr(cr)
            wait_until(lambda: all(f"{NAME}-{i}" in kubelet.running for i in range(2)),
                       "two pods")
            ips = [kubelet.ip(f"{NAME}-{i}") for i in range(2)]
            base, planner_tree = router_for(api, kubelet, cr["spec"]["router"], set(ips))
            for ip in ips:
                generate(f"http://{ip}:{PORT}", MODEL, "warm up")
            results: dict[str, Any] = {}
            flush(ips)
            results["single"] = run_phase("single", f"http://{ips[0]}:{PORT}")
            flush(ips)
            results["cache_aware"] = run_phase("aware", base)
            base, _ = router_for(api, kubelet, {**cr["spec"]["router"], "policy":
                                                "round_robin"}, set(ips))
            flush(ips)
            results["round_robin"] = run_phase("robin", base)
            # spec.router is merge-patched: say the policy again (round_robin stays otherwise).
            base, small = router_for(api, kubelet, {**cr["spec"]["router"], "policy":
                                                    "cache_aware", "tree": {
                "evictionIntervalSeconds": 2, "maxSize": SMALL_TREE}}, set(ips))
            flush(ips)
            results["small_tree"] = run_phase("small", base)
    for name, r in results.items():
        print(f"{name:12s} hit {r['hit_ratio']:.3f} {r['hit_ratio_by_tier']} "
              f"TTFT p50 {r['ttft_p50_s'] * 1000:.0f} ms over {r['requests']} requests")
    aware, robin, single = results["cache_aware"], results["round_robin"], results["single"]
    summary = {
        "router_hit_ratio": aware["hit_ratio"],
        "round_robin_hit_ratio": robin["hit_ratio"],
        "single_replica_hit_ratio": single["hit_ratio"],
        "router_vs_round_robin_hit": round(aware["hit_ratio"] / robin["hit_ratio"], 3)
        if robin["hit_ratio"] else None,
        "router_vs_single_replica_hit": round(aware["hit_ratio"] / single["hit_ratio"], 3)
        if single["hit_ratio"] else None,
        "router_vs_round_robin_ttft": round(aware["ttft_p50_s"] / robin["ttft_p50_s"], 3),
        "hit_ratio_by_tier": {k: v["hit_ratio_by_tier"] for k, v in results.items()},
        "ttft_p50_s": {k: v["ttft_p50_s"] for k, v in results.items()},
        "tree_size_effect": {
            "planner_tree_chars": planner_tree, "small_tree_chars": small,
            "planner_tree_hit_ratio": aware["hit_ratio"],
            "small_tree_hit_ratio": results["small_tree"]["hit_ratio"],
            "planner_vs_small_tree_hit": round(aware["hit_ratio"]
                                               / results["small_tree"]["hit_ratio"], 3)
            if results["small_tree"]["hit_ratio"] else None},
        "requests_per_phase": aware["requests"],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
