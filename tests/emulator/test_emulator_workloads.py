"""The emulated StatefulSet controller and kubelet against the rules of the real ones.

Real: the emulator's store, its StatefulSet controller, kubelet and Pod update rule (nothing is
faked here). What each assertion pins down comes from Kubernetes' own code:
``pkg/controller/statefulset`` (``getPodRevision`` compares the ``controller-revision-hash``
label only; ``newVersionedStatefulSetPod`` makes a pod below the partition from
``currentRevision``; ``completeRollingUpdate`` moves ``currentRevision`` for RollingUpdate only,
once every pod is updated and ready; the MaxUnavailableStatefulSet update loop), core/v1
``ValidatePodUpdate``, and the kubelet's container hash of name and image only.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from emulator.server import BUILTIN_TYPES
from emulator.store import ApiError, Store
from emulator.workloads import REVISION_LABEL, WorkloadSimulator

NS = "ns"


class Cluster:
    def __init__(self) -> None:
        self.store = Store()
        for rtype in BUILTIN_TYPES:
            self.store.register(rtype)
        self.loop = asyncio.new_event_loop()
        self.sim = WorkloadSimulator(self.store)
        self.sim.attach(self.loop)
        self.sts_type = self.store.find_type("apps", "v1", "statefulsets")
        self.pods_type = self.store.find_type("", "v1", "pods")

    def settle(self, seconds: float = 0.05) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def sts(self) -> dict[str, Any]:
        return self.store.get(self.sts_type, NS, "web")

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.store.list(self.pods_type, NS)}

    def ready(self, *names: str) -> None:
        for name in names or tuple(self.pods()):
            self.sim.pod_ready(NS, name)
        self.settle()

    def set_template(self, image: str, **strategy: Any) -> None:
        sts = self.sts()
        sts["spec"]["template"]["spec"]["containers"][0]["image"] = image
        if strategy:
            sts["spec"]["updateStrategy"] = strategy
        self.store.replace(self.sts_type, NS, "web", sts)
        self.settle()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.loop.close()


def _statefulset(replicas: int, strategy: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": "web"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"replicas": replicas, "serviceName": "web",
                     "selector": {"matchLabels": labels}, "updateStrategy": strategy,
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "engine", "image": "engine:1"}]}}}}


def _create(c: Cluster, replicas: int = 3, **strategy: Any) -> None:
    c.store.create(c.sts_type, NS, _statefulset(replicas, strategy or {"type": "RollingUpdate"}))
    c.settle()
    c.ready()


def _revision(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"][REVISION_LABEL])


def test_revisions_are_controller_revisions_and_a_rolling_update_goes_pod_by_pod(
        cluster: Cluster) -> None:
    _create(cluster)
    first = cluster.sts()["status"]
    assert first["currentRevision"] == first["updateRevision"]
    revisions = cluster.store.list(cluster.store.find_type("apps", "v1", "controllerrevisions"))
    assert [r["metadata"]["name"] for r in revisions] == [first["updateRevision"]]
    cluster.set_template("engine:2")
    status = cluster.sts()["status"]
    assert status["currentRevision"] == first["updateRevision"] != status["updateRevision"]
    # One pod at a time, highest ordinal first, each after the previous is ready.
    order = ["web-2", "web-1", "web-0"]
    for i, name in enumerate(order):
        updated = {n for n, p in cluster.pods().items() if _revision(p) == status["updateRevision"]}
        assert updated == set(order[:i + 1])
        cluster.ready(name)
    status = cluster.sts()["status"]
    assert status["currentRevision"] == status["updateRevision"]
    assert status["currentReplicas"] == status["updatedReplicas"] == 3


def test_a_relabelled_pod_counts_as_updated_and_is_never_replaced(cluster: Cluster) -> None:
    """An in-place update: the pod's image changed and its label set to updateRevision."""
    _create(cluster, type="RollingUpdate", rollingUpdate={"partition": 3})
    cluster.set_template("engine:2", type="RollingUpdate", rollingUpdate={"partition": 3})
    update = cluster.sts()["status"]["updateRevision"]
    uids = {n: p["metadata"]["uid"] for n, p in cluster.pods().items()}
    for name in ("web-2", "web-1", "web-0"):
        pod = cluster.pods()[name]
        pod["spec"]["containers"][0]["image"] = "engine:2"
        pod["metadata"]["labels"][REVISION_LABEL] = update
        cluster.store.replace(cluster.pods_type, NS, name, pod)
        cluster.settle()
        cluster.ready(name)
    status = cluster.sts()["status"]
    assert {n: p["metadata"]["uid"] for n, p in cluster.pods().items()} == uids
    assert status["currentRevision"] == status["updateRevision"] == update  # partition or not
    # The kubelet restarted exactly the engine of each pod, once.
    assert [(p, c) for p, c, _ in cluster.sim.kubelet.restarts] == [
        ("web-2", "engine"), ("web-1", "engine"), ("web-0", "engine")]


def test_a_pod_below_the_partition_comes_back_on_the_current_revision(cluster: Cluster) -> None:
    _create(cluster)
    old = cluster.sts()["status"]["updateRevision"]
    cluster.set_template("engine:2", type="RollingUpdate", rollingUpdate={"partition": 3})
    cluster.store.delete(cluster.pods_type, NS, "web-1")
    cluster.settle()
    pod = cluster.pods()["web-1"]
    assert _revision(pod) == old and pod["spec"]["containers"][0]["image"] == "engine:1"
    cluster.set_template("engine:2", type="RollingUpdate", rollingUpdate={"partition": 1})
    cluster.store.delete(cluster.pods_type, NS, "web-1")
    cluster.settle()
    assert cluster.pods()["web-1"]["spec"]["containers"][0]["image"] == "engine:2"


def test_on_delete_never_moves_the_current_revision(cluster: Cluster) -> None:
    _create(cluster, replicas=1, type="OnDelete")
    old = cluster.sts()["status"]["currentRevision"]
    cluster.set_template("engine:2", type="OnDelete")
    cluster.store.delete(cluster.pods_type, NS, "web-0")
    cluster.settle()
    cluster.ready()
    status = cluster.sts()["status"]
    assert status["updatedReplicas"] == 1 and status["currentRevision"] == old


def test_max_unavailable_replaces_that_many_and_waits(cluster: Cluster) -> None:
    _create(cluster, replicas=4)
    cluster.set_template("engine:2", type="RollingUpdate", rollingUpdate={"maxUnavailable": 2})
    update = cluster.sts()["status"]["updateRevision"]
    assert sorted(n for n, p in cluster.pods().items() if _revision(p) == update) == [
        "web-2", "web-3"]
    cluster.ready("web-3")
    assert sorted(n for n, p in cluster.pods().items() if _revision(p) == update) == [
        "web-1", "web-2", "web-3"]


@pytest.mark.parametrize(("change", "allowed"), [
    (lambda p: p["spec"]["containers"][0].update(image="engine:9"), True),
    (lambda p: p["metadata"].setdefault("annotations", {}).update(a="b"), True),
    (lambda p: p["spec"]["containers"][0].update(env=[{"name": "A", "value": "1"}]), False),
    (lambda p: p["spec"]["containers"][0].update(resources={"limits": {"cpu": "2"}}), False),
    (lambda p: p["spec"].update(volumes=[{"name": "v", "emptyDir": {}}]), False),
])
def test_a_running_pod_changes_only_what_the_api_server_lets_it(
        cluster: Cluster, change: Any, allowed: bool) -> None:
    _create(cluster, replicas=1)
    pod = copy.deepcopy(cluster.pods()["web-0"])
    change(pod)
    if allowed:
        cluster.store.replace(cluster.pods_type, NS, "web-0", pod)
        return
    with pytest.raises(ApiError) as err:
        cluster.store.replace(cluster.pods_type, NS, "web-0", pod)
    assert err.value.status == 422
    assert "pod updates may not change fields other than" in err.value.message
