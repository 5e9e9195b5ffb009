"""Shared helpers of the planner/API tests: examples, structural defaulting, CEL, k8s validation.

Everything here is real: the CRD schema the operator generates, cel-python evaluating its CEL
rules, kubernetes-validate's Kubernetes 1.33 schemas.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import celpy.adapter
import jsonschema
import kubernetes_validate
import pytest
import yaml
from hicache_operator.api.config import OperatorConfig
from hicache_operator.api.crd import openapi_schema
from hicache_operator.api.quantity import parse_bytes
from hicache_operator.plan import SpecError, plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
K8S_VERSION = "1.33"


Mutation = Callable[[dict[str, Any]], Any]
GI = 1024**3
#: The operator configuration with every default (chart values unset).
CONFIG = OperatorConfig()


def load_example(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "examples" / name).read_text())
    assert isinstance(data, dict)
    return data


def example_cr(example: str, *mutations: Mutation) -> dict[str, Any]:
    """A copy of ``examples/<example>`` with each mutation applied to its spec in turn."""
    cr = copy.deepcopy(load_example(example))
    for mutate in mutations:
        mutate(cr["spec"])
    return cr


def mori_ssd(spec: dict[str, Any]) -> None:
    """Mutation: the SSD tier on mori 1.2.4's SSD node (``spec.l3.ssd.engine: mori``), for tests
    of that engine's rendering (its umbp-ssd sidecar, its staging), which it keeps unchanged."""
    spec["l3"].setdefault("ssd", {})["engine"] = "mori"


def plan_problems(cr: dict[str, Any], config: OperatorConfig | None = None
                  ) -> list[tuple[str, str]]:
    """The (field path, message) problems the planner refuses ``cr`` with (it must refuse)."""
    with pytest.raises(SpecError) as err:
        plan(cr, config or OperatorConfig())
    assert isinstance(err.value, ValueError)
    return err.value.problems


def has_problem(problems: list[tuple[str, str]], path: str, *fragments: str) -> bool:
    return any(p == path and all(f in m for f in fragments) for p, m in problems)


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting as the API server does it (defaults fill absent fields, recursively,
    after which nested defaults of the filled object apply too)."""
    obj = copy.deepcopy(obj)
    if isinstance(obj, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in obj and "default" in prop:
                obj[name] = copy.deepcopy(prop["default"])
            if name in obj:
                obj[name] = apply_defaults(prop, obj[name])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        obj = [apply_defaults(schema["items"], item) for item in obj]
    return obj


_CEL_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def cel_failures(schema: dict[str, Any], obj: Any, path: str = "") -> list[tuple[str, str]]:
    """Every CEL rule of ``schema`` that ``obj`` violates, as ``(path, message)``."""
    out: list[tuple[str, str]] = []
    for rule in schema.get("x-kubernetes-validations", []):
        prog = _PROGRAMS.get(rule["rule"])
        if prog is None:
            prog = _CEL_ENV.program(_CEL_ENV.compile(rule["rule"]))
            _PROGRAMS[rule["rule"]] = prog
        try:
            result = prog.evaluate({"self": celpy.adapter.json_to_cel(obj)})
        except celpy.evaluation.CELEvalError as err:  # a type error fails the rule
            out.append((path or "<root>", f"{rule['message']} (evaluation error: {err.args[0]})"))
            continue
        # A rule passes only when it evaluates to a CEL true (an evaluation error fails it).
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            out.append((path or "<root>", rule["message"]))
    if isinstance(obj, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if name in obj:
                out += cel_failures(prop, obj[name], f"{path}.{name}" if path else name)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += cel_failures(schema["items"], item, f"{path}[{i}]")
    return out


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return openapi_schema()


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


def crd_cel_failures(cr: dict[str, Any]) -> list[tuple[str, str]]:
    """Default the CR with the generated schema, then evaluate every CEL rule on it."""
    schema = _schema()
    return cel_failures(schema, apply_defaults(schema, drop_nulls(cr)))


def drop_nulls(obj: Any) -> Any:
    """What the API server does first with a CR: ``null`` values of fields that are not
    ``nullable`` (none of ours is) are pruned before defaulting and validation."""
    if isinstance(obj, dict):
        return {k: drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_nulls(v) for v in obj]
    return obj


def crd_schema_errors(cr: dict[str, Any]) -> list[str]:
    """The CR checked against the CRD's openAPIV3Schema (as JSON Schema: types, enums, ranges,
    patterns, required; x-kubernetes-* keywords are not JSON Schema and are ignored), after
    the API server's pruning of nulls."""
    validator = jsonschema.Draft202012Validator(openapi_schema())
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(drop_nulls(cr))
    ]


def validate_k8s(obj: dict[str, Any]) -> None:
    """kubernetes-validate --strict for Kubernetes 1.33, plus the quantity syntax its JSON
    schemas do not check (resources and sizeLimits must parse as Kubernetes quantities)."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    for res in _all_resource_maps(obj):
        for name, value in res.items():
            if name != "cpu":
                parse_bytes(value, field=name)
            else:
                assert str(value).isdigit(), f"cpu {value!r} is not a whole number"


def _all_resource_maps(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("requests", "limits") and isinstance(value, dict):
                out.append(value)
            elif key == "sizeLimit":
                out.append({"sizeLimit": value})
            else:
                out += _all_resource_maps(value)
    elif isinstance(obj, list):
        for item in obj:
            out += _all_resource_maps(item)
    return out


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def engine_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = next(
        c for c in pod_spec(objects)["containers"] if c["name"] == "engine")
    return container


def configmap_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The rendered engine env (the ConfigMap's data)."""
    data: dict[str, str] = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    assert isinstance(data, dict)
    return data


def all_containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = pod_spec(objects)
    return list(spec.get("initContainers", [])) + list(spec["containers"])
