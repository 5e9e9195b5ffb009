"""An engine-only rollout in place vs by replacing the pod, on a served pod with a warm L3.

Runs the standalone CPU example (examples/cpu/tiny-llama-standalone.yaml, updateStrategy
InPlaceIfPossible, the sidecars' image pinned with spec.l3.image) as the pod tier does
(tests/pod: the planner's pod, the launcher, real SGLang 0.5.23 over real mori 1.2.4, the pod's
own probes, real hugepages and memory cgroups), then, in one run:

* cold: three ~3.5k-token prompts, one generated token each (the latency is the TTFT);
* before: the same prompts again on the running pod (they push each other out of the 4096-token
  device pool, so the hits come from the host pool and L3): the hit ratio a rollout should keep;
* in place: the engine-only change (a new engine image and one more engine flag) rolled out as
  the operator does it (``controller.rollout``'s JSON patch of the pod, the ConfigMap's new
  configuration revision; the kubelet imitation restarts the engine container only), then the
  same prompts;
* replace: the same change by replacing the pod (what the StatefulSet does for any other
  change, and for every change under RollingUpdate): the pod is deleted and a new one started
  from the new plan, then the same prompts.

Reported: the hit ratio of the prompts after each rollout relative to before
(``in_place_hit_ratio_vs_before``, ``replace_hit_ratio_vs_before``), the TTFT after each
relative to cold (medians), and the seconds until the pod was Ready again (from the patch, and
from the pod's deletion). Last line: one JSON object. Needs root (like the pod tier).
Run: ``make bench-rollout``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from pod.harness import Client, admin_config, load_cr, plan_pod, start_pod  # noqa: E402
from pod.image import served_files  # noqa: E402
from pod.node import Node  # noqa: E402
from pod.rollout import roll_in_place  # noqa: E402

PROMPTS = 3
WORDS = 250  # ~3.5k tokens with the tiny model's tokenizer, under its 4096-token context
IMAGE = "ghcr.io/sglang-hicache/engine:0.1.0"


def prompt(i: int) -> str:
    return " ".join(f"rollout{i} word{j} cache" for j in range(WORDS))


def round_of(c: Client, texts: list[str]) -> dict[str, Any]:
    """One 1-token request per prompt: TTFTs, and the share of prompt tokens served from cache."""
    ttfts, cached, total, storage = [], 0, 0, 0
    for text in texts:
        out = c.generate(text, max_new_tokens=1)
        meta = out["meta_info"]
        ttfts.append(out["client_latency_s"])
        cached += int(meta.get("cached_tokens") or 0)
        total += int(meta["prompt_tokens"])
        storage += int((meta.get("cached_tokens_details") or {}).get("storage", 0))
    return {"ttft_s": statistics.median(ttfts), "hit_ratio": cached / total,
            "storage_tokens": storage}


def crs() -> tuple[dict[str, Any], dict[str, Any]]:
    old = load_cr("cpu/tiny-llama-standalone.yaml", **{
        "spec.updateStrategy": {"type": "InPlaceIfPossible"}, "spec.image": IMAGE,
        "spec.l3.image": IMAGE})
    new = json.loads(json.dumps(old))
    new["spec"]["image"] = "ghcr.io/sglang-hicache/engine:0.1.1"
    new["spec"]["engine"]["extraArgs"] = [*old["spec"]["engine"]["extraArgs"],
                                          "--log-level", "info"]
    return old, new


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench/rollout.py runs a pod like the pod tier: it needs root")
    # A SIGTERM (a timeout, an interrupted run) unwinds like an exception, so the pods are closed
    # and the node gives its hugepages back.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="hicache-bench-rollout-", dir="/var/tmp"))
    models, image = served_files(root)
    old_cr, new_cr = crs()
    texts = [prompt(i) for i in range(PROMPTS)]
    c = Client(old_cr["spec"]["engine"]["port"])
    (root / "node").mkdir()
    with Node(root / "node") as node:
        old, new = plan_pod(old_cr, admin_config(node)), plan_pod(new_cr, admin_config(node))
        pod = start_pod(old, node, image, root / "pods", {"tiny-models": models})
        try:
            pod.wait_ready(600)
            cold = round_of(c, texts)
            before = round_of(c, texts)
            engine = pod.container("engine")
            generation = engine.generation
            sidecars = {s.name: s.proc.pid for s in pod.containers if s.role == "sidecar"}
            started = time.monotonic()
            roll_in_place(pod, old, new)
            pod.wait(lambda: engine.generation > generation, 300, "the engine restarted")
            pod.wait_ready(600)
            in_place_ready = time.monotonic() - started
            kept = {s.name: s.proc.pid for s in pod.containers if s.role == "sidecar"} == sidecars
            in_place = round_of(c, texts)
            started = time.monotonic()
        finally:
            pod.close()
        pod = start_pod(new, node, image, root / "pods-replaced", {"tiny-models": models})
        try:
            pod.wait_ready(600)
            replace_ready = time.monotonic() - started
            replaced = round_of(c, texts)
        finally:
            pod.close()

    def vs(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("nan")

    print(f"cold: TTFT {cold['ttft_s']:.3f} s, hit ratio {cold['hit_ratio']:.3f}")
    print(f"before the rollout: TTFT {before['ttft_s']:.3f} s, hit ratio "
          f"{before['hit_ratio']:.3f}")
    print(f"in place: Ready after {in_place_ready:.1f} s; TTFT {in_place['ttft_s']:.3f} s, hit "
          f"ratio {in_place['hit_ratio']:.3f} ({in_place['storage_tokens']} tokens from "
          f"storage); sidecars the same processes: {kept}")
    print(f"replaced: Ready after {replace_ready:.1f} s; TTFT {replaced['ttft_s']:.3f} s, hit "
          f"ratio {replaced['hit_ratio']:.3f}")
    result = {
        "in_place_hit_ratio_vs_before": vs(in_place["hit_ratio"], before["hit_ratio"]),
        "replace_hit_ratio_vs_before": vs(replaced["hit_ratio"], before["hit_ratio"]),
        "in_place_ttft_vs_cold": vs(in_place["ttft_s"], cold["ttft_s"]),
        "replace_ttft_vs_cold": vs(replaced["ttft_s"], cold["ttft_s"]),
        "in_place_ready_s": round(in_place_ready, 1),
        "replace_ready_s": round(replace_ready, 1),
        "hit_ratio_before": round(before["hit_ratio"], 3),
        "hit_ratio_in_place": round(in_place["hit_ratio"], 3),
        "hit_ratio_replace": round(replaced["hit_ratio"], 3),
        "storage_tokens_in_place": in_place["storage_tokens"],
        "ttft_cold_s": round(cold["ttft_s"], 4),
        "ttft_in_place_s": round(in_place["ttft_s"], 4),
        "ttft_replace_s": round(replaced["ttft_s"], 4),
        "sidecars_kept": kept,
    }
    print(json.dumps(result))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
