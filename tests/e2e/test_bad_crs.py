"""Every bad CR becomes a condition, never a loop: each adversarial case with its write count.

Real: the operator (kopf under KopfRunner; the log case as ``python -m hicache_operator run``),
the emulator validating CRs with the chart's CRD (schema + CEL) and built-in objects like an
API server (422). Faked, and said where: a CR "stored under an older CRD" is written past the
schema (``create_unvalidated``), an admission webhook's refusal is an injected 422 fault, a
planner bug is an injected exception.

Write counts: once the world settles, a bad CR costs kopf's finalizer patch, one status patch
and one Event, and no child write at all; after that, several resync periods write nothing.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from e2e_lib import CR_API, CRS, EXAMPLES, NAMESPACE, RESYNC_S, Cluster, OperatorProcess, example
from emulator import Fault

pytestmark = pytest.mark.e2e


def _cr(name: str, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    cr = example(next(p for p in EXAMPLES if "minimal" in p.stem), name)
    mutate(cr["spec"])
    return cr


def _affinity(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda s: s.setdefault("placement", {}).update(affinity=value)


def _terms(value: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": value}}


def _env(value_from: Any) -> Callable[[dict[str, Any]], None]:
    return lambda s: s.setdefault("engine", {}).update(
        env=[{"name": "TOKEN", "valueFrom": value_from}])


# (mutation, field the refusal names). The API server's CRD schema refuses these at apply.
SCHEMA_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "node-affinity-string": (_affinity({"nodeAffinity": "x"}), "spec.placement.affinity"),
    "node-selector-terms-string": (_affinity(_terms({"nodeSelectorTerms": "x"})),
                                   "spec.placement.affinity"),
    "match-expressions-string": (_affinity(_terms({"nodeSelectorTerms": [
        {"matchExpressions": "oops"}]})), "spec.placement.affinity"),
    "secret-key-ref-string": (_env({"secretKeyRef": "nope"}), "spec.engine.env"),
    "priority-class-name": (lambda s: s.setdefault("placement", {}).update(
        priorityClassName="Bad_Name!"), "spec.placement.priorityClassName"),
}
# Cases the schema lets through (quantity syntax, map keys, a valid path): the planner refuses.
PLANNER_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "host-pool-1e400": (lambda s: s["hiCache"].update(hostPoolPerRank="1e400"),
                        "spec.hiCache.hostPoolPerRank"),
    "node-selector-label-key": (lambda s: s.setdefault("placement", {}).update(
        nodeSelector={"bad key!": "x"}), "spec.placement.nodeSelector"),
    "model-mount-on-dev-shm": (lambda s: s["model"].update(
        mountPath="/dev/shm", volume={"persistentVolumeClaim": {"claimName": "weights"}}),
        "spec.model.mountPath"),
}


def _writes_for(cluster: Cluster, name: str, since: int = 0) -> Counter[str]:
    """Writes that concern one CR: to it, its status, its children (by name) and its Events."""
    out: Counter[str] = Counter()
    for r in cluster.emu.writes()[since:]:
        if r.plural == "events" or (r.name or "").startswith(name):
            out[f"{r.method} {r.plural}{'/' + r.subresource if r.subresource else ''}"] += 1
    return out


def _assert_refused_once(cluster: Cluster, name: str, field: str) -> None:
    cond = cluster.wait_condition(name, "SpecValid", "False")
    assert field in cond["message"], cond
    assert cond["reason"] == "InvalidSpec"
    cluster.wait(lambda: [e for e in cluster.events(name) if e["reason"] == "InvalidSpec"],
                 "an InvalidSpec Event")
    cluster.wait_settled(RESYNC_S)
    assert cluster.children(name) == {}
    writes = _writes_for(cluster, name)
    assert writes == Counter({"PATCH sglanghicaches": 1,  # kopf's finalizer
                              "PATCH sglanghicaches/status": 1, "POST events": 1}), writes
    assert cluster.writes_during(3 * RESYNC_S) == []  # several resyncs: nothing more


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_schema_refuses_pass_through_mistakes_at_apply(cluster: Cluster, operator: Any,
                                                       case: str) -> None:
    mutate, field = SCHEMA_CASES[case]
    error = cluster.create_raw(_cr("bad", mutate))
    assert error is not None and error.status == 422
    assert any(f.startswith(field) for f, _ in error.causes), error.causes
    assert cluster.cr("bad") is None


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_cr_stored_before_the_schema_is_refused_once(cluster: Cluster, operator: Any,
                                                     case: str) -> None:
    """The same CRs stored under an older, permissive CRD: the planner refuses them with the
    same field, once; no child is created (the StatefulSet would have been refused)."""
    mutate, field = SCHEMA_CASES[case]
    cluster.emu.create_unvalidated(CR_API, CRS, _cr("old", mutate))
    _assert_refused_once(cluster, "old", field)


@pytest.mark.parametrize("case", sorted(PLANNER_CASES))
def test_planner_refuses_what_the_schema_lets_through_once(cluster: Cluster, operator: Any,
                                                           case: str) -> None:
    mutate, field = PLANNER_CASES[case]
    cluster.apply(_cr("bad", mutate))
    _assert_refused_once(cluster, "bad", field)


def test_a_planner_bug_is_planning_failed_once_not_a_retry_loop(
        cluster: Cluster, operator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked: a bug in the planner (an exception it was never meant to raise)."""
    import hicache_operator.plan as planner

    real = planner.plan

    def buggy(cr: Any, config: Any, facts: Any = None, **kwargs: Any) -> Any:
        if cr["metadata"]["name"] == "crash":
            raise AttributeError("'str' object has no attribute 'get'")
        return real(cr, config, facts, **kwargs)

    monkeypatch.setattr(planner, "plan", buggy)
    cluster.apply(_cr("crash", lambda s: None))
    cond = cluster.wait_condition("crash", "SpecValid", "False", "PlanningFailed")
    assert "AttributeError: 'str' object has no attribute 'get'" in cond["message"]
    cluster.wait_settled(RESYNC_S)
    assert cluster.children("crash") == {}
    assert cluster.writes_during(3 * RESYNC_S) == []


def test_a_refused_child_is_degraded_with_the_servers_message_and_backs_off(
        cluster: Cluster, operator: Any) -> None:
    """Faked: an admission webhook refusing every StatefulSet (422, its message). Degraded
    quotes it; the StatefulSet is not re-sent on every resync; a spec change retries at once."""
    refuse = cluster.emu.add_fault(Fault(method="POST", plural="statefulsets", status=422,
                                         times=None))
    cr = _cr("refused", lambda s: None)
    cluster.apply(cr)
    cond = cluster.wait_condition("refused", "Degraded", "True", "ObjectRejected")
    assert "StatefulSet refused" in cond["message"] and "HTTP 422" in cond["message"]
    assert "injected fault" in cond["message"]  # the server's own words
    cluster.wait(lambda: [e for e in cluster.events("refused")
                          if e["reason"] == "ObjectRejected"], "an ObjectRejected Event")
    cluster.wait_settled(RESYNC_S)
    posts = refuse.fired
    assert posts == 1
    assert cluster.writes_during(4 * RESYNC_S) == []  # resyncs come and go: no re-send
    assert refuse.fired == posts
    refuse.times = refuse.fired  # the webhook is fixed; a spec change is tried at once
    cluster.patch_spec("refused", {"replicas": 2})
    cr["spec"]["replicas"] = 2
    cluster.wait_children(cr)
    cluster.wait_condition("refused", "Degraded", "False", "NoFailures")


def test_every_operator_log_line_about_a_cr_names_it(cluster: Cluster,
                                                     operator_process: OperatorProcess) -> None:
    """The operator as a process, with its own logging set-up: every line kopf or the operator
    writes about a CR starts with ``[namespace/name]``."""
    operator_process.start()
    cluster.wait_operator_watching()
    cluster.apply(_cr("logged", PLANNER_CASES["host-pool-1e400"][0]))
    good = _cr("fine", lambda s: None)
    cluster.apply(good)
    cluster.wait_condition("logged", "SpecValid", "False")
    cluster.wait_children(good)
    cluster.wait_settled(RESYNC_S)
    lines = [line for line in operator_process.log.splitlines()
             if re.search(r"kopf\.objects|hicache_operator", line)]
    assert lines, operator_process.log[-2000:]
    unnamed = [line for line in lines if f"[{NAMESPACE}/" not in line]
    assert not unnamed, unnamed[:5]


def test_bad_and_good_crs_together_converge_without_extra_writes(
        cluster: Cluster, operator: Any) -> None:
    """Every adversarial CR at once next to a good one: the good one gets its children, the
    bad ones one status each, then the cluster is quiet."""
    for i, case in enumerate(sorted(PLANNER_CASES)):
        cluster.apply(_cr(f"bad-{i}", PLANNER_CASES[case][0]))
    for i, case in enumerate(sorted(SCHEMA_CASES)):
        cluster.emu.create_unvalidated(CR_API, CRS, _cr(f"old-{i}", SCHEMA_CASES[case][0]))
    good = _cr("good", lambda s: None)
    cluster.apply(copy.deepcopy(good))
    cluster.wait_children(good)
    for i in range(len(PLANNER_CASES)):
        cluster.wait_condition(f"bad-{i}", "SpecValid", "False")
    for i in range(len(SCHEMA_CASES)):
        cluster.wait_condition(f"old-{i}", "SpecValid", "False")
    cluster.wait_settled(RESYNC_S)
    assert cluster.writes_during(3 * RESYNC_S) == []
    bad = [f"bad-{i}" for i in range(len(PLANNER_CASES))]
    bad += [f"old-{i}" for i in range(len(SCHEMA_CASES))]
    assert all(cluster.children(name) == {} for name in bad)
    assert all(_writes_for(cluster, name)["PATCH sglanghicaches/status"] == 1 for name in bad)
