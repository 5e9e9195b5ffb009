"""An engine-only rollout in place, in the generated pod: the L3 stays warm.

Real: the planner's pods before and after the change (updateStrategy InPlaceIfPossible, the
standalone CPU example), the operator's own rollout decision and its JSON patch of the pod
(``controller.rollout``, applied to the pod as the API server would store it), the kubelet
imitation's reaction (``Pod.update``: a changed image restarts that container only; changed
annotations rewrite the downward API volume, and the launcher's watcher restarts the engine on
its new configuration revision), the launcher selecting the revision from the ConfigMap,
real SGLang 0.5.23 over real mori 1.2.4 in the standalone sidecars. See test_serving_pod.py for
the rest of what is real and faked (GPUs, the CPU device).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .harness import Client, admin_config, load_cr, plan_pod, start_pod
from .rollout import roll_in_place
from .test_serving_pod import PROMPT, fillers

pytestmark = pytest.mark.pod
IMAGE = "ghcr.io/sglang-hicache/engine:0.1.0"


def pid_of(container: Any) -> int:
    assert container.proc is not None, f"{container.name} is not running"
    return int(container.proc.pid)


def _cr(**spec: Any) -> dict[str, Any]:
    cr = load_cr("cpu/tiny-llama-standalone.yaml",
                 **{"spec.updateStrategy": {"type": "InPlaceIfPossible"}, "spec.l3.image": IMAGE,
                    "spec.image": IMAGE})
    cr["spec"].update(spec)
    return cr


def _engine_only_change(cr: dict[str, Any], change: str) -> dict[str, Any]:
    new = json.loads(json.dumps(cr))
    if change == "image":
        new["spec"]["image"] = "ghcr.io/sglang-hicache/engine:0.1.1"
    else:  # a configuration revision only: one more engine flag (SGLang's default level)
        new["spec"]["engine"]["extraArgs"] = [*cr["spec"]["engine"]["extraArgs"],
                                              "--log-level", "info"]
    return new


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("change", ["image", "config"])
def test_an_engine_only_rollout_in_place_serves_the_next_requests_from_storage(
        node, image, workdir: Path, models_dir: Path, change: str) -> None:
    old = plan_pod(_cr(), admin_config(node))
    new = plan_pod(_engine_only_change(old.cr, change), admin_config(node))
    old_sts, new_sts = old.statefulset, new.statefulset
    annotations = "hicache.sglang.ai/config-hash", "hicache.sglang.ai/pod-hash"
    assert new_sts["spec"]["template"]["metadata"]["annotations"][annotations[1]] == \
        old_sts["spec"]["template"]["metadata"]["annotations"][annotations[1]]  # engine-only
    pod = start_pod(old, node, image, workdir, {"tiny-models": models_dir})
    try:
        pod.wait_ready(600)
        c = Client(old.cr["spec"]["engine"]["port"])
        cold = c.generate(PROMPT)
        for text in fillers(4):
            c.generate(text)
        host = c.generate(PROMPT)
        assert host["meta_info"]["cached_tokens_details"]["host"] > 0, host["meta_info"]
        sidecars = {s.name: pid_of(s) for s in pod.containers if s.role == "sidecar"}
        engine = pod.container("engine")
        restarts, generation = engine.restarts, engine.generation

        status = roll_in_place(pod, old, new)
        assert status["method"] == "InPlace" and status["restarting"] == [pod.meta.name]
        pod.wait(lambda: engine.generation > generation, 300, "the engine restarted")
        pod.wait_ready(600)

        # Only the engine restarted, once; the sidecars are the same processes.
        assert engine.generation == generation + 1
        assert {s.name: pid_of(s) for s in pod.containers if s.role == "sidecar"} == sidecars
        assert all(s.restarts == 0 for s in pod.containers if s.role == "sidecar")
        assert engine.restarts == restarts + 1  # the kubelet counts every restart
        was = old_sts["spec"]["template"]["metadata"]["annotations"][annotations[0]]
        want = new_sts["spec"]["template"]["metadata"]["annotations"][annotations[0]]
        report = json.loads((pod.volume_host_path("hicache-run") /
                             "launch-report.json").read_text())
        assert report["config_revision"] == want  # the new revision, from the ConfigMap
        # Before the stop, L3 took every page the host pool had (the kubelet's preStop drain
        # for a new image, the launcher's watcher for a new configuration).
        if change == "image":
            assert any(e.message == "Container engine definition changed, will be restarted"
                       for e in pod.events_of("engine", "Killing"))
            stops = [e.message for e in pod.events_of("engine")
                     if e.reason in ("PreStop", "FailedPreStopHook")]
            assert any("L3 caught up" in m for m in stops), stops
        else:
            assert "--log-level" in report["argv"]
            log = engine.log_text(400000)
            assert f"configuration revision changed from {was} to {want}" in log
            assert "L3 caught up" in log, log[-3000:]

        warm = c.generate(PROMPT)
        details = warm["meta_info"]["cached_tokens_details"]
        assert details["storage"] > 0 and details["device"] == details["host"] == 0, details
        assert warm["text"] == cold["text"]  # greedy output unchanged
    finally:
        pod.close()
