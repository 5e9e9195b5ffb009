"""updateStrategy InPlaceIfPossible in the plan: what changes in place and what cannot.

Real: the planner and builders, kubernetes-validate's 1.33 schemas for the rendered objects.
The rule under test: two plans whose StatefulSets carry the same ``pod-hash`` differ only in the
engine image and the configuration revision (a pod annotation), i.e. in what a running Pod may
change; everything else (resources, volumes, sidecars and their image, env the kubelet resolves)
changes the pod-hash, so the controller replaces those pods instead.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.builders.context import CONFIG_HASH_ANNOTATION, POD_HASH_ANNOTATION
from hicache_operator.controller.rollout import template_changes
from hicache_operator.plan import plan, render_summary
from hicache_umbp.launch.revision import (
    CONFIG_REVISION_ENV,
    POD_INFO_DIR,
    config_key,
    select_revision,
)
from shc_testlib import load_example, validate_k8s

pytestmark = pytest.mark.unit
CONFIG = OperatorConfig()
EXAMPLE = "cpu/tiny-llama-standalone.yaml"


def _cr(mutate: Callable[[dict[str, Any]], Any] | None = None,
        example: str = EXAMPLE) -> dict[str, Any]:
    cr = copy.deepcopy(load_example(example))
    spec = cr["spec"]
    spec["updateStrategy"] = {"type": "InPlaceIfPossible"}
    spec["l3"]["image"] = "ghcr.io/sglang-hicache/engine:0.1.0"
    spec.setdefault("engine", {})["env"] = [
        {"name": "SGLANG_USE_CPU_ENGINE", "value": "1"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "HOME_DIR", "value": "/home/$(NODE)"}]
    if mutate is not None:
        mutate(spec)
    return cr


def _objects(cr: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    p = plan(cr, CONFIG)
    cm = next(o for o in p.objects if o["kind"] == "ConfigMap")
    sts = next(o for o in p.objects if o["kind"] == "StatefulSet")
    return cm, sts


def _annotations(sts: dict[str, Any]) -> dict[str, str]:
    return dict(sts["spec"]["template"]["metadata"]["annotations"])


def _engine(sts: dict[str, Any]) -> dict[str, Any]:
    return dict(sts["spec"]["template"]["spec"]["containers"][0])


def test_in_place_renders_configuration_revisions_the_pod_selects() -> None:
    cm, sts = _objects(_cr())
    validate_k8s(cm)
    validate_k8s(sts)
    revision = _annotations(sts)[CONFIG_HASH_ANNOTATION]
    assert list(cm["data"]) == [config_key(revision)]
    config = json.loads(cm["data"][config_key(revision)])
    # The launcher's settings and the user's literal env are in the revision ...
    assert config["HICACHE_PORT"] == "30001" and config["SGLANG_USE_CPU_ENGINE"] == "1"
    # ... env the kubelet resolves stays in the pod: valueFrom, and $(VAR) references.
    env = {e["name"]: e for e in _engine(sts)["env"]}
    assert "SGLANG_USE_CPU_ENGINE" not in env and {"NODE", "HOME_DIR"} <= set(env)
    assert env[CONFIG_REVISION_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == \
        f"metadata.annotations['{CONFIG_HASH_ANNOTATION}']"
    mounts = {m["mountPath"]: m for m in _engine(sts)["volumeMounts"]}
    assert mounts[POD_INFO_DIR]["readOnly"] is True
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mounts[POD_INFO_DIR]["name"])
    assert volume["downwardAPI"]["items"] == [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
    # The StatefulSet controller is held off every pod: the operator rolls them.
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                             "rollingUpdate": {"partition": 1}}
    # The launcher gets exactly the plain environment back from the pod's variables.
    pod_env = {**cm["data"], CONFIG_REVISION_ENV: revision}
    plain, selected = select_revision(pod_env)
    assert selected == revision and plain == config


ENGINE_ONLY = {
    "image": lambda s: s.update(image="ghcr.io/sglang-hicache/engine:0.2.0"),
    "extra-args": lambda s: s["engine"].update(extraArgs=[*s["engine"]["extraArgs"],
                                                          "--log-level", "debug"]),
    "literal-env": lambda s: s["engine"]["env"].append({"name": "LOG_LEVEL", "value": "debug"}),
    "page-size": lambda s: s["engine"].update(pageSize=32),
}
POD_LEVEL = {
    "cpu": (lambda s: s["resources"].update(cpu=4), "containers[engine].resources"),
    "env-value-from": (lambda s: s["engine"]["env"][1]["valueFrom"]["fieldRef"].update(
        fieldPath="spec.serviceAccountName"), "containers[engine].env"),
    "sidecar-image": (lambda s: s["l3"].update(image="ghcr.io/sglang-hicache/engine:0.2.0"),
                      "initContainers[umbp-dram].image"),
    "dram-capacity": (lambda s: s["l3"]["dram"].update(capacity="2Gi"),
                      "initContainers[umbp-dram].env"),
}


@pytest.mark.parametrize("change", ENGINE_ONLY.values(), ids=ENGINE_ONLY.keys())
def test_an_engine_only_change_keeps_the_pod_hash(change: Callable[[dict[str, Any]], Any]) -> None:
    _, before = _objects(_cr())
    _, after = _objects(_cr(change))
    assert _annotations(after)[POD_HASH_ANNOTATION] == _annotations(before)[POD_HASH_ANNOTATION]
    assert (_annotations(after)[CONFIG_HASH_ANNOTATION], _engine(after)["image"]) != (
        _annotations(before)[CONFIG_HASH_ANNOTATION], _engine(before)["image"])
    assert template_changes(before["spec"]["template"], after["spec"]["template"]) == []


@pytest.mark.parametrize(("change", "field"), POD_LEVEL.values(), ids=POD_LEVEL.keys())
def test_a_pod_level_change_changes_the_pod_hash_and_names_the_field(
        change: Callable[[dict[str, Any]], Any], field: str) -> None:
    _, before = _objects(_cr())
    _, after = _objects(_cr(change))
    assert _annotations(after)[POD_HASH_ANNOTATION] != _annotations(before)[POD_HASH_ANNOTATION]
    assert field in template_changes(before["spec"]["template"], after["spec"]["template"])


def test_without_l3_image_a_new_engine_image_moves_the_sidecars_too_and_the_plan_says_so(
        ) -> None:
    def unpinned(s: dict[str, Any]) -> None:
        s["l3"].pop("image")

    p = plan(_cr(unpinned), CONFIG)
    assert any("l3.image is empty" in w for w in p.warnings)
    _, before = _objects(_cr(unpinned))
    def new_image(s: dict[str, Any]) -> None:
        unpinned(s)
        s.update(image="x/engine:2")

    _, after = _objects(_cr(new_image))
    assert _annotations(after)[POD_HASH_ANNOTATION] != _annotations(before)[POD_HASH_ANNOTATION]


def test_other_strategies_render_the_pod_as_before() -> None:
    """RollingUpdate and OnDelete keep the plain HICACHE_* ConfigMap and no revision wiring, so
    an operator upgrade restarts nothing (the snapshot tests pin the bytes)."""
    cr = _cr(lambda s: s.update(updateStrategy={"type": "RollingUpdate"}))
    cm, sts = _objects(cr)
    assert "HICACHE_PORT" in cm["data"]
    assert POD_HASH_ANNOTATION not in _annotations(sts)
    assert CONFIG_REVISION_ENV not in {e["name"] for e in _engine(sts)["env"]}


@pytest.mark.parametrize(("mode", "says"), [
    ("standalone", "the L3 stays warm"),
    ("embedded", "use l3.mode standalone for rollouts that keep the cache"),
])
def test_the_summary_says_what_an_in_place_rollout_keeps(mode: str, says: str) -> None:
    example = EXAMPLE if mode == "standalone" else "cpu/tiny-llama-embedded.yaml"

    def mutate(s: dict[str, Any]) -> None:
        if mode == "embedded":
            s["l3"].pop("image")

    summary = render_summary(plan(_cr(mutate, example), CONFIG))
    line = next(x for x in summary.splitlines() if x.startswith("Rollouts:"))
    assert "InPlaceIfPossible" in line and says in line
