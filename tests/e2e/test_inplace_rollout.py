"""updateStrategy InPlaceIfPossible end to end: engines restarted in place, pod by pod.

Real: the operator (KopfRunner in-process, or ``python -m hicache_operator run`` as a process
that is killed), the emulator's API server (the Pod update rule: only images, labels and
annotations may change on a running pod) and its StatefulSet controller (revisions, partition,
``currentRevision`` as Kubernetes moves it). Emulated: the kubelet (``emulator/kubelet.py``):
a changed image restarts just that container; a new configuration revision restarts the
engine as the launcher's watcher makes it; a restarted engine passes its readiness probe
``READY_AFTER_S`` later; Ready needs the operator's readiness gate too. Every count below is
of requests the operator sent to the API server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_lib import (
    EXAMPLES,
    NAMESPACE,
    Cluster,
    OperatorProcess,
    example,
    write_operator_config,
)
from kopf.testing import KopfRunner

pytestmark = pytest.mark.e2e
READY_AFTER_S = 0.3
IMAGE, NEW_IMAGE = "ghcr.io/sglang-hicache/engine:0.1.0", "ghcr.io/sglang-hicache/engine:0.2.0"
REVISION = "controller-revision-hash"
CONFIG = "hicache.sglang.ai/config-hash"


def _cr(name: str, replicas: int = 3, **rolling: Any) -> dict[str, Any]:
    """DeepSeek-R1 on MI355X: standalone L3 sidecars, SSD tier on a per-pod PVC."""
    cr = example(next(p for p in EXAMPLES if "deepseek" in p.stem), name)
    spec = cr["spec"]
    spec["replicas"] = replicas
    spec["image"] = IMAGE
    spec["l3"]["image"] = IMAGE  # the sidecars keep their image when the engine's changes
    spec["updateStrategy"] = {"type": "InPlaceIfPossible",
                              **({"rollingUpdate": rolling} if rolling else {})}
    # No router (on by default from 2 replicas): the emulator runs no router process, so its
    # Deployment never gets a ready pod and the CR would be Degraded (RouterUnavailable). What
    # a rollout asks of a router is tested in tests/operator/test_rollout_router_check.py.
    spec["router"] = {"enabled": False}
    return cr


def _kubelet(cluster: Cluster, **settings: Any) -> Any:
    sim = cluster.emu.simulator
    assert sim is not None
    for key, value in settings.items():
        cluster.emu.call(lambda s, k=key, v=value: setattr(sim.kubelet, k, v))
    return sim.kubelet


def _pods(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.pods(name)}


def _engine(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "engine")


def _sts(cluster: Cluster, name: str) -> dict[str, Any]:
    sts = cluster.child(("apps/v1", "statefulsets"), name)
    assert sts is not None
    return sts


def _rolled_out(cluster: Cluster, name: str) -> bool:
    """Every pod on the StatefulSet's revision, which is its current one, and no rollout."""
    body = cluster.cr(name) or {}
    status = _sts(cluster, name).get("status") or {}
    return (not (body.get("status") or {}).get("rollout")
            and status.get("currentRevision") == status.get("updateRevision")
            and cluster.condition(name, "Ready").get("status") == "True"
            and all((p["metadata"]["labels"] or {}).get(REVISION) == status["updateRevision"]
                    for p in cluster.pods(name)))


def _ready(cluster: Cluster, name: str, replicas: int) -> None:
    cluster.mark_pods_ready(name, replicas)
    cluster.wait_condition(name, "Ready", "True")


def _max_down_at_once(timeline: list[tuple[float, str, str]]) -> int:
    down: set[str] = set()
    most = 0
    for _, pod, what in timeline:
        if what == "restart":
            down.add(pod)
        else:
            down.discard(pod)
        most = max(most, len(down))
    return most


def _pvc_state(cluster: Cluster, name: str) -> dict[str, tuple[str, str]]:
    from e2e_lib import selector

    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["metadata"]["resourceVersion"])
            for p in cluster.emu.list("v1", "persistentvolumeclaims", NAMESPACE, selector(name))}


def test_an_engine_only_change_restarts_each_engine_in_place_and_deletes_nothing(
        cluster: Cluster, operator: Any) -> None:
    cr = _cr("inplace")
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "inplace", 3)
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    uids = {n: p["metadata"]["uid"] for n, p in _pods(cluster, "inplace").items()}
    old_config = _pods(cluster, "inplace")["inplace-0"]["metadata"]["annotations"][CONFIG]
    sidecars = {n: {c: s.container_id for c, s in kubelet.snapshot(p["metadata"]["uid"]).items()
                    if c != "engine"} for n, p in _pods(cluster, "inplace").items()}
    pvcs = _pvc_state(cluster, "inplace")
    assert len(pvcs) == 3
    cluster.wait_settled(0.5)
    start = len(cluster.emu.writes())

    # A new image and a new engine flag together: both engine-only.
    engine = dict(cr["spec"]["engine"])
    engine["extraArgs"] = [*engine.get("extraArgs", []), "--log-level", "debug"]
    cluster.patch_spec("inplace", {"image": NEW_IMAGE, "engine": engine})
    cond = cluster.wait_condition("inplace", "Progressing", "True", "RollingOutInPlace")
    assert f"engine image {IMAGE} -> {NEW_IMAGE}" in cond["message"]
    cluster.wait(lambda: _rolled_out(cluster, "inplace"), "the in-place rollout to finish", 60)

    pods = _pods(cluster, "inplace")
    assert {n: p["metadata"]["uid"] for n, p in pods.items()} == uids  # the same pods
    new_config = {p["metadata"]["annotations"][CONFIG] for p in pods.values()}
    assert len(new_config) == 1 and new_config != {old_config}
    assert all(_engine(p)["image"] == NEW_IMAGE for p in pods.values())
    assert all(c["image"] == IMAGE for p in pods.values() for c in p["spec"]["initContainers"])
    # Each engine restarted exactly once, highest ordinal first, one pod down at a time; no
    # sidecar restarted.
    assert kubelet.restarts == [(f"inplace-{i}", "engine", "image changed") for i in (2, 1, 0)]
    assert _max_down_at_once(kubelet.timeline) == 1
    assert {n: {c: s.container_id for c, s in kubelet.snapshot(p["metadata"]["uid"]).items()
                if c != "engine"} for n, p in pods.items()} == sidecars
    assert _pvc_state(cluster, "inplace") == pvcs

    # The API writes: no pod deleted, no PVC touched, each pod patched once, and its readiness
    # gate closed before and opened after (pods/status).
    cluster.wait_settled(0.5)
    writes = cluster.emu.writes()[start:]
    by = [(w.method, w.plural) for w in writes]
    assert ("DELETE", "pods") not in by
    assert not [w for w in writes if w.plural == "persistentvolumeclaims"]
    pod_writes = [w for w in writes if w.plural == "pods"]
    assert sorted(w.name for w in pod_writes if w.subresource is None) == [
        "inplace-0", "inplace-1", "inplace-2"]
    assert sorted(w.name for w in pod_writes if w.subresource == "status") == [
        "inplace-0", "inplace-0", "inplace-1", "inplace-1", "inplace-2", "inplace-2"]
    assert all(w.method == "PATCH" for w in pod_writes)
    # The StatefulSet: its new template (partition held), OnDelete while pods are updated in
    # place (a pod it makes meanwhile comes from the new template), RollingUpdate once all
    # are (its controller moves currentRevision), then the partition held again.
    assert [w.method for w in writes if w.plural == "statefulsets"] == ["PATCH"] * 4
    cm = cluster.child(("v1", "configmaps"), "inplace-hicache")
    assert cm is not None and list(cm["data"]) == [f"HICACHE_CONFIG_{new_config.pop()}"]
    reasons = [e["reason"] for e in cluster.events("inplace")]
    assert reasons.count("RollingOutInPlace") == 1 and reasons.count("RolledOut") == 1
    assert reasons.count("RestartingEngine") == 3

    # The StatefulSet's bookkeeping holds for a pod it makes later: from the new template.
    sts = _sts(cluster, "inplace")
    assert sts["status"]["currentReplicas"] == sts["status"]["updatedReplicas"] == 3
    cluster.emu.delete("v1", "pods", NAMESPACE, "inplace-1")
    cluster.wait(lambda: _pods(cluster, "inplace").get("inplace-1", {}).get(
        "metadata", {}).get("uid") not in (None, uids["inplace-1"]), "inplace-1 recreated")
    again = _pods(cluster, "inplace")["inplace-1"]
    assert _engine(again)["image"] == NEW_IMAGE
    assert again["metadata"]["labels"][REVISION] == sts["status"]["updateRevision"]
    assert again["metadata"]["annotations"][CONFIG] == pods["inplace-1"]["metadata"][
        "annotations"][CONFIG]


def test_max_unavailable_and_partition_pace_the_restarts(cluster: Cluster, operator: Any) -> None:
    cr = _cr("paced", replicas=4, maxUnavailable=2, partition=1)
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "paced", 4)
    kubelet = _kubelet(cluster, ready_after_restart=1.0)
    cluster.patch_spec("paced", {"image": NEW_IMAGE})
    cluster.wait(lambda: len(kubelet.restarts) == 3 and cluster.condition(
        "paced", "Progressing").get("reason") == "UpdateHeld", "three pods restarted", 60)
    assert sorted(p for p, _, _ in kubelet.restarts) == ["paced-1", "paced-2", "paced-3"]
    assert _max_down_at_once(kubelet.timeline) == 2  # two at a time, never more
    held = _pods(cluster, "paced")["paced-0"]
    assert _engine(held)["image"] == IMAGE  # below the partition


def test_a_pod_level_change_falls_back_to_replacing_pods_and_says_why(
        cluster: Cluster, operator: Any) -> None:
    cr = _cr("fallback", replicas=2)
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "fallback", 2)
    uids = {n: p["metadata"]["uid"] for n, p in _pods(cluster, "fallback").items()}
    pvcs = _pvc_state(cluster, "fallback")
    start = len(cluster.emu.writes())
    l3 = dict(cr["spec"]["l3"])
    l3["dram"] = {**l3["dram"], "capacity": "400Gi"}  # the umbp-dram sidecar's size
    cluster.patch_spec("fallback", {"l3": l3, "image": NEW_IMAGE})
    cond = cluster.wait_condition("fallback", "Progressing", "True", "ReplacingPods")
    assert "initContainers[umbp-dram]" in cond["message"]
    rollout = (cluster.cr("fallback") or {})["status"]["rollout"]
    assert rollout["method"] == "Replace" and "initContainers[umbp-dram]" in rollout["reason"]
    assert _sts(cluster, "fallback")["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    cluster.ready_until("fallback", lambda: _rolled_out(cluster, "fallback"),
                        "the StatefulSet to replace both pods", 60)
    assert not set(uids.values()) & {p["metadata"]["uid"] for p in cluster.pods("fallback")}
    writes = cluster.emu.writes()[start:]
    assert not [w for w in writes if w.plural == "persistentvolumeclaims"]
    # Pods: only the readiness gate of each new pod, opened once (its engine is new already).
    pod_writes = [w for w in writes if w.plural == "pods"]
    assert all(w.subresource == "status" for w in pod_writes)
    assert sorted(w.name for w in pod_writes) == ["fallback-0", "fallback-1"]
    assert _pvc_state(cluster, "fallback") == pvcs  # the claims stay (the pods reuse them)
    assert "ReplacingPods" in {e["reason"] for e in cluster.events("fallback")}
    # Back to in place: the partition is held again.
    cluster.wait(lambda: _sts(cluster, "fallback")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 2}}, "the partition held")


def test_a_failed_in_place_update_stops_the_rollout_and_names_the_pod(
        cluster: Cluster, operator: Any) -> None:
    cr = _cr("broken")
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "broken", 3)
    kubelet = _kubelet(cluster, ready_after_restart=READY_AFTER_S,
                       bad_images={"registry.example/engine:missing"})
    cluster.patch_spec("broken", {"image": "registry.example/engine:missing"})
    cond = cluster.wait_condition("broken", "Degraded", "True", "InPlaceUpdateFailed")
    assert cond["message"].startswith("pod broken-2: the new engine container is ErrImagePull")
    assert "the in-place rollout is stopped" in cond["message"]
    rollout = (cluster.cr("broken") or {})["status"]["rollout"]
    assert (rollout["failedPod"], rollout["updatedPods"], rollout["pods"]) == ("broken-2", 1, 3)
    time.sleep(3)  # resyncs: nothing else is touched
    pods = _pods(cluster, "broken")
    assert [_engine(pods[f"broken-{i}"])["image"] for i in range(3)] == [
        IMAGE, IMAGE, "registry.example/engine:missing"]
    assert [p for p, _, _ in kubelet.restarts] == ["broken-2"]
    assert [e for e in cluster.events("broken") if e["reason"] == "InPlaceUpdateFailed"]
    # Reverting the image rolls the failed pod back in place, and nothing else restarts.
    cluster.patch_spec("broken", {"image": IMAGE})
    cluster.wait(lambda: _rolled_out(cluster, "broken"), "the revert to roll out", 60)
    assert cluster.condition("broken", "Degraded")["status"] == "False"
    assert [p for p, _, _ in kubelet.restarts] == ["broken-2", "broken-2"]


@pytest.fixture
def short_timeout_operator(cluster: Cluster, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    config = write_operator_config(tmp_path / "operator-short.yaml",
                                   rollout={"restartTimeoutSeconds": 10})
    monkeypatch.setenv("SGLANG_HICACHE_OPERATOR_CONFIG", str(config))
    args = ["run", "--standalone", "-n", NAMESPACE, "-m", "hicache_operator.controller.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        cluster.wait_operator_watching()
        yield runner


def test_an_engine_that_ignores_a_new_configuration_fails_after_the_timeout(
        cluster: Cluster, short_timeout_operator: Any) -> None:
    """A configuration-only change needs the launcher's watcher; an engine image without it
    keeps running the old configuration, and the rollout says so instead of waiting forever."""
    cr = _cr("deaf", replicas=2)
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "deaf", 2)
    _kubelet(cluster, launcher_restarts_on_config=False)
    engine = dict(cr["spec"]["engine"])
    engine["env"] = [{"name": "LOG_LEVEL", "value": "debug"}]
    cluster.patch_spec("deaf", {"engine": engine})
    cond = cluster.wait_condition("deaf", "Degraded", "True", "InPlaceUpdateFailed", timeout=40)
    assert "deaf-1: the engine container was not restarted within 10 s" in cond["message"]


def test_an_interrupted_rollout_resumes_after_an_operator_restart(
        cluster: Cluster, operator_process: OperatorProcess) -> None:
    operator_process.start()
    cluster.wait_operator_watching()
    cr = _cr("resumed")
    cluster.apply(cr)
    cluster.wait_children(cr)
    _ready(cluster, "resumed", 3)
    kubelet = _kubelet(cluster)  # restarted engines stay unready until the test says
    cluster.patch_spec("resumed", {"image": NEW_IMAGE})
    cluster.wait(lambda: kubelet.restarts == [("resumed-2", "engine", "image changed")],
                 "resumed-2 restarting")
    operator_process.kill()  # mid-rollout: resumed-2 restarting, two pods to go
    cluster.set_pod("pod_ready", "resumed-2")  # its containers; its gate waits for the operator
    time.sleep(1)
    assert [p for p, _, _ in kubelet.restarts] == ["resumed-2"]  # nobody goes on without it
    _kubelet(cluster, ready_after_restart=READY_AFTER_S)
    operator_process.start()
    cluster.wait(lambda: _rolled_out(cluster, "resumed"), "the rollout to finish", 60)
    assert kubelet.restarts == [(f"resumed-{i}", "engine", "image changed") for i in (2, 1, 0)]
    patched = [w.name for w in cluster.emu.writes()
               if w.plural == "pods" and w.subresource is None]
    assert sorted(patched) == ["resumed-0", "resumed-1", "resumed-2"]  # each pod once
    state = json.loads(_pods(cluster, "resumed")["resumed-2"]["metadata"]["annotations"][
        "hicache.sglang.ai/in-place-update"])
    assert state["image"] == NEW_IMAGE
