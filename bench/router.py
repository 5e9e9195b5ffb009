"""Replicas behind the router: prompt-token hit ratio and TTFT, cache_aware vs round_robin vs
one replica, and the effect of the router's tree size, on the same two served pods in one run.

Runs the embedded CPU example (examples/cpu/tiny-llama-embedded.yaml, with its model's KV
geometry so the planner sizes the router's tree from the pods' cache) with ``replicas: 2`` the
way the pod tier's router test does (``tests/pod/cluster``): the real operator in the API
emulator, the two engine pods run for real (launcher, SGLang 0.5.23 over real mori 1.2.4), each
in its own network namespace on port 30000, and SGLang's real model gateway (smg 1.13.0) as
the router pod with the arguments the planner renders, discovering the pods through the API.

Workload (``bench/router_workload.py``, its parameters printed in the output): 8 system prompts
(an agent's instructions and tool definitions, ~530 tokens), 3 users each, 6 turns per user; each
turn pastes a document or tool output beside a question (~310 tokens) and the server's real
32-token answer joins the history, so a session's last prompt (~2,500 tokens) is several times
its system prompt; the 24 sessions interleaved uniformly at random; TTFT from the stream's first
token. The same workload runs in each phase, on the same servers:

1. ``single``: every request to pod 0 directly;
2. ``cache_aware``: through the router, its tree sized by the planner;
3. ``round_robin``: through the router (``router.policy: round_robin``);
4. ``small_tree``: cache_aware with the tree cut to what the engines' GPU KV pools hold
   (``router.tree.maxSize``: 4096 tokens x 4 characters x 2 pods): a tree sized to the GPU alone.

Each phase's texts carry the phase's own tag at the start, so no phase hits another's cache;
before each phase the engines' radix caches are flushed (``/flush_cache``). A router change is
a change of the CR (``spec.router``), which the operator rolls out (a new router pod, the same
engine pods). Hit ratio = cached prompt tokens / prompt tokens, from each response's
``meta_info`` (all tiers and per tier: device, host, storage), also by turn. Where each request
went is the router's own answer (its ``x-smg-routed-worker-id`` header): per phase the requests
per pod, how often a turn lands on the pod of the session's previous turn, and how often a
request lands on another pod than the request before it (1.0: round-robin alternates per
request). What routing alone can change: per phase, the hit ratio an unbounded prefix cache on
each pod would give for the requests as routed (``router_workload.ideal_hits``, characters), the
system prompts' share of the prompts, and the workload modelled over 2 and 4 pods
(``model_routing``). Last line: one JSON object.
Needs root (like the pod tier) and ``make router-env``. Run: ``make bench-router``.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pod.cluster import served_cluster  # noqa: E402
from pod.harness import load_cr  # noqa: E402
from pod.image import served_files  # noqa: E402
from pod.node import Node  # noqa: E402
from router_workload import Workload, ideal_hits, model_routing  # noqa: E402
from support.smg import generate, generate_stream, healthy_worker_ips, wait_until  # noqa: E402

NS, NAME, MODEL, PORT = "hicache-bench", "tiny-llama", "/models/tiny-llama", 30000
WORKLOAD = Workload()
SMALL_TREE = 4096 * 4 * 2  # the engines' device KV pools (4096 tokens each) in characters
TIERS = ("device", "host", "storage")


def run_phase(tag: str, base: str, direct_pod: str = "") -> dict[str, Any]:
    """The workload through ``base``; ``direct_pod``: the pod IP when ``base`` is a pod."""
    w = WORKLOAD
    history: dict[int, str] = {}
    records = []
    routed: list[tuple[str, str, str]] = []  # (pod, prompt, prompt + answer) for ideal_hits
    for session, turn in w.order():
        if turn == 0:
            history[session] = w.system_prompt(tag, session // w.users_per_system)
        text = history[session] + w.user_turn(session, turn)
        out = generate_stream(base, MODEL, text, w.answer_tokens)
        history[session] = text + out["text"]
        pod = direct_pod or str(urlsplit(out["worker"]).hostname)
        routed.append((pod, text, history[session]))
        records.append({"session": session, "turn": turn, "pod": pod, "chars": len(text),
                        "system_chars": len(w.system_prompt(tag, session // w.users_per_system)),
                        "ttft_s": out["ttft_s"], **out["meta_info"]})
    systems = sum(len(w.system_prompt(tag, i)) for i in range(w.systems))
    return {**summarize(records, sum(map(len, history.values()))
                        - (w.users_per_system - 1) * systems),
            "ideal_hit_ratio_chars": ideal_hits(routed)}


def _ratio(records: list[dict[str, Any]], key: str = "cached_tokens", tier: str = "") -> float:
    prompt = sum(r["prompt_tokens"] for r in records)
    if tier:
        hits = sum((r.get("cached_tokens_details") or {}).get(tier, 0) for r in records)
    else:
        hits = sum(r[key] for r in records)
    return round(hits / prompt, 4) if prompt else 0.0


def summarize(records: list[dict[str, Any]], distinct_chars: int) -> dict[str, Any]:
    """Hit ratios (all, per tier, per turn), TTFT p50 and where the requests went."""
    last_pod: dict[int, str] = {}
    stayed = turns_after_first = 0
    for r in records:
        if r["turn"] > 0:
            turns_after_first += 1
            stayed += last_pod[r["session"]] == r["pod"]
        last_pod[r["session"]] = r["pod"]
    switches = sum(a["pod"] != b["pod"] for a, b in itertools.pairwise(records))
    return {
        "hit_ratio": _ratio(records),
        "hit_ratio_by_tier": {t: _ratio(records, tier=t) for t in TIERS},
        "hit_ratio_by_turn": [_ratio([r for r in records if r["turn"] == t])
                              for t in range(WORKLOAD.turns)],
        "ttft_p50_s": round(statistics.median(r["ttft_s"] for r in records), 4),
        "requests": len(records),
        "requests_by_pod": dict(sorted(Counter(r["pod"] for r in records).items())),
        "turn_on_previous_turns_pod": round(stayed / turns_after_first, 3),
        "request_on_other_pod_than_previous_request": round(switches / (len(records) - 1), 3),
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "chars_per_token": round(sum(r["chars"] for r in records)
                                 / sum(r["prompt_tokens"] for r in records), 2),
        "distinct_chars": distinct_chars,
        "system_prompt_share_chars": round(sum(r["system_chars"] for r in records)
                                           / sum(r["chars"] for r in records), 4),
    }


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


def report(name: str, r: dict[str, Any]) -> None:
    print(f"{name:12s} hit {r['hit_ratio']:.3f} {r['hit_ratio_by_tier']} by turn "
          f"{r['hit_ratio_by_turn']} TTFT p50 {r['ttft_p50_s'] * 1000:.0f} ms; "
          f"{r['requests']} requests {r['requests_by_pod']}, turn on its previous turn's "
          f"pod {r['turn_on_previous_turns_pod']}, request on another pod than the one "
          f"before {r['request_on_other_pod_than_previous_request']}; unbounded-cache "
          f"hit for this routing {r['ideal_hit_ratio_chars']:.3f} (chars)", flush=True)


def phase(t0: float, name: str, tag: str, base: str, direct_pod: str = "") -> dict[str, Any]:
    """One phase, its line printed as soon as it ends (with the time since the start)."""
    start = time.monotonic()
    r = run_phase(tag, base, direct_pod)
    report(name, r)
    print(f"{name:12s} took {time.monotonic() - start:.0f} s (at {time.monotonic() - t0:.0f} s)",
          flush=True)
    return r


def measure() -> tuple[dict[str, dict[str, Any]], int, int]:
    """The four phases on one pair of served pods: (results by phase, the planner's tree, the
    small tree), in characters."""
    cr = load_cr("cpu/tiny-llama-embedded.yaml")
    cr["metadata"]["namespace"] = NS
    cr["spec"]["replicas"] = 2
    # 2 layers x 2 KV heads x head dim 32 x 2 B (bf16) x 2 (K and V): the tiny Llama.
    cr["spec"]["model"].update(attention="mha", kvBytesPerToken=512)
    fast = {"intervalSeconds": 2, "timeoutSeconds": 5, "failureThreshold": 1,
            "successThreshold": 1}
    cr["spec"]["router"] = {"enabled": True, "healthCheck": fast,
                            "tree": {"evictionIntervalSeconds": 2}}
    results: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-router-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        models, image = served_files(root)
        (root / "pods").mkdir()
        (root / "pods").chmod(0o755)
        with Node(root / "node") as node, served_cluster(root / "pods", node, image, models,
                                                         NS) as (api, kubelet, _net):
            api.create_cr(cr)
            wait_until(lambda: all(f"{NAME}-{i}" in kubelet.running for i in range(2)),
                       "two pods")
            ips = [kubelet.ip(f"{NAME}-{i}") for i in range(2)]
            base, planner_tree = router_for(api, kubelet, cr["spec"]["router"], set(ips))
            print(f"two pods behind the router at {time.monotonic() - t0:.0f} s", flush=True)
            for ip in ips:
                generate(f"http://{ip}:{PORT}", MODEL, "warm up")
            flush(ips)
            results["single"] = phase(t0, "single", "single", f"http://{ips[0]}:{PORT}",
                                      ips[0])
            flush(ips)
            results["cache_aware"] = phase(t0, "cache_aware", "aware", base)
            base, _ = router_for(api, kubelet, {**cr["spec"]["router"], "policy":
                                                "round_robin"}, set(ips))
            flush(ips)
            results["round_robin"] = phase(t0, "round_robin", "robin", base)
            # spec.router is merge-patched: say the policy again (round_robin stays otherwise).
            base, small = router_for(api, kubelet, {**cr["spec"]["router"], "policy":
                                                    "cache_aware", "tree": {
                "evictionIntervalSeconds": 2, "maxSize": SMALL_TREE}}, set(ips))
            flush(ips)
            results["small_tree"] = phase(t0, "small_tree", "small", base)
    return results, planner_tree, small


def _over(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def main() -> None:
    print("workload: " + json.dumps(WORKLOAD.describe()), flush=True)
    results, planner_tree, small = measure()
    aware, robin, single = results["cache_aware"], results["round_robin"], results["single"]
    model = {f"{policy}_{pods}_pods": model_routing(WORKLOAD, pods, policy)
             for pods in (2, 4) for policy in ("sticky", "round_robin")}
    small_tree = results["small_tree"]
    summary = {
        "router_hit_ratio": aware["hit_ratio"],
        "round_robin_hit_ratio": robin["hit_ratio"],
        "single_replica_hit_ratio": single["hit_ratio"],
        "router_vs_round_robin_hit": _over(aware["hit_ratio"], robin["hit_ratio"]),
        "router_vs_single_replica_hit": _over(aware["hit_ratio"], single["hit_ratio"]),
        "router_vs_round_robin_ttft": _over(aware["ttft_p50_s"], robin["ttft_p50_s"]),
        "goals_met": {
            "router >= 0.9x single replica": aware["hit_ratio"] >= 0.9 * single["hit_ratio"],
            "router >= 1.5x round_robin": aware["hit_ratio"] >= 1.5 * robin["hit_ratio"]},
        "hit_ratio_by_tier": {k: v["hit_ratio_by_tier"] for k, v in results.items()},
        "hit_ratio_by_turn": {k: v["hit_ratio_by_turn"] for k, v in results.items()},
        "ttft_p50_s": {k: v["ttft_p50_s"] for k, v in results.items()},
        "requests_by_pod": {k: v["requests_by_pod"] for k, v in results.items()},
        "turn_on_previous_turns_pod": {k: v["turn_on_previous_turns_pod"]
                                       for k, v in results.items()},
        "request_on_other_pod_than_previous_request": {
            k: v["request_on_other_pod_than_previous_request"] for k, v in results.items()},
        "tree_size_effect": {
            "planner_tree_chars": planner_tree, "small_tree_chars": small,
            "workload_distinct_chars": aware["distinct_chars"],
            "chars_per_token": aware["chars_per_token"],
            "planner_tree_hit_ratio": aware["hit_ratio"],
            "small_tree_hit_ratio": small_tree["hit_ratio"],
            "planner_vs_small_tree_hit": _over(aware["hit_ratio"], small_tree["hit_ratio"]),
            "small_tree_turn_on_previous_turns_pod": small_tree["turn_on_previous_turns_pod"]},
        # What routing alone can change, with no cache evicting: each phase's requests as
        # routed, against an unbounded prefix cache per pod (characters), and the workload
        # modelled over 2 and 4 pods, round-robin vs the best sticky prefix router.
        "ideal_hit_ratio_chars": {k: v["ideal_hit_ratio_chars"] for k, v in results.items()},
        "system_prompt_share_chars": aware["system_prompt_share_chars"],
        "model_unbounded_cache": model,
        "prompt_tokens_per_phase": aware["prompt_tokens"],
        "workload": WORKLOAD.describe(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
