"""Generate the ``SGLangHiCache`` CustomResourceDefinition from the pydantic models.

pydantic writes JSON Schema (``$defs``/``$ref``, ``anyOf`` with ``null`` for optional fields,
titles); an API server wants a *structural* OpenAPI v3 schema: everything inlined, a ``type`` on
every node (except int-or-string and preserve-unknown-fields nodes), no ``additionalProperties:
false``, no ``null`` defaults. :func:`structural_schema` converts one into the other, and nested
objects whose fields all have defaults get ``default: {}`` so the API server fills them in.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from .spec import SGLangHiCacheSpec
from .status import SGLangHiCacheStatus
from .types import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

MAX_NAME_LENGTH = 52  # StatefulSet pods carry "<name>-<10-char hash>" in a 63-char label value

_DROP_KEYS = frozenset({"title"})
Schema = dict[str, Any]


def _resolve_ref(ref: str, defs: dict[str, Schema]) -> Schema:
    name = ref.rsplit("/", 1)[-1]
    return defs[name]


def structural_schema(node: Schema, defs: dict[str, Schema]) -> Schema:
    """One JSON Schema node of pydantic's output as a structural OpenAPI v3 node."""
    node = dict(node)
    if "$ref" in node:
        target = structural_schema(_resolve_ref(node.pop("$ref"), defs), defs)
        # Sibling keys (the field's description/default) win over the model's own.
        node = {**target, **{k: v for k, v in node.items() if k not in _DROP_KEYS}}
        return _clean(node, defs)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {branches!r}")
        inner = structural_schema(branches[0], defs)
        outer = {k: v for k, v in node.items() if k not in _DROP_KEYS}
        if outer.get("default", 0) is None:
            outer.pop("default")
        return _clean({**inner, **outer}, defs)
    return _clean(node, defs)


def _clean(node: Schema, defs: dict[str, Schema]) -> Schema:
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP_KEYS or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and value is False:
            continue  # the API server prunes unknown fields; false is not structural
        if key == "const":
            out["enum"] = [value]  # a one-value Literal; CRD schemas have no `const`
            continue
        out[key] = value
    if "properties" in out:
        required = set(out.get("required", ()))
        props: Schema = {}
        for name, prop in out["properties"].items():
            converted = structural_schema(prop, defs)
            if _defaults_to_empty_object(prop, converted, name in required, defs):
                converted["default"] = {}
            props[name] = converted
        out["properties"] = props
    if isinstance(out.get("items"), dict):
        out["items"] = structural_schema(out["items"], defs)
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = structural_schema(out["additionalProperties"], defs)
    return out


def _defaults_to_empty_object(
    raw: Schema, converted: Schema, required: bool, defs: dict[str, Schema]
) -> bool:
    """A non-optional nested model with a default factory: default ``{}`` (fields default)."""
    if required or "$ref" not in raw or "default" in converted:
        return False
    return converted.get("type") == "object" and not converted.get("required")


def _top_level(model: type[Any]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return structural_schema(raw, defs)


def openapi_schema() -> Schema:
    """The ``openAPIV3Schema`` of the v1alpha1 version."""
    return {
        "type": "object",
        "description": "SGLangHiCache runs SGLang on AMD Instinct GPUs with a hugepage-backed, "
        "NUMA-aware HiCache L2 host pool and an AMD MORI UMBP L3 (DRAM + SSD); the operator "
        "computes and validates every Kubernetes object it needs.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": _top_level(SGLangHiCacheSpec),
            "status": _top_level(SGLangHiCacheStatus),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
                "(StatefulSet pod labels carry the name plus a revision hash)",
            }
        ],
    }


def _ratio_column(name: str, tier: str, description: str, priority: int = 0) -> Schema:
    column: Schema = {
        "name": name,
        "type": "number",
        "description": description,
        "jsonPath": f".status.cache.hitRatio.{tier}",
    }
    if priority:
        column["priority"] = priority
    return column


# The cache first: hit ratios by tier are what no other serving operator shows in its resource.
PRINTER_COLUMNS: list[Schema] = [
    {
        "name": "Ready",
        "type": "string",
        "description": "Ready condition.",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Replicas",
        "type": "integer",
        "description": "Desired pods.",
        "jsonPath": ".spec.replicas",
    },
    _ratio_column("Hit", "total", "Prompt tokens served from any cache tier (last window)."),
    _ratio_column("Host-Hit", "host", "Prompt tokens served from the L2 host pool."),
    _ratio_column("L3-Hit", "storage", "Prompt tokens served from L3 (UMBP DRAM + SSD)."),
    _ratio_column("SSD-Hit", "l3Ssd", "Prompt tokens served from L3's SSD tier."),
    {
        "name": "Model",
        "type": "string",
        "description": "Served model.",
        "jsonPath": ".spec.model.path",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    _ratio_column("Device-Hit", "device", "Prompt tokens served from the GPU KV cache.", 1),
    _ratio_column("DRAM-Hit", "l3Dram", "Prompt tokens served from L3's UMBP DRAM tier.", 1),
    {
        "name": "SSD-Read",
        "type": "integer",
        "description": "SSD tier read bandwidth, bytes per second (last window).",
        "priority": 1,
        "jsonPath": ".status.cache.ssd.readBytesPerSecond",
    },
    {
        "name": "L3-Writes",
        "type": "string",
        "description": "Failing when L3 refuses the pages SGLang backs up.",
        "priority": 1,
        "jsonPath": ".status.cache.l3Writes",
    },
    {
        "name": "Hugepages",
        "type": "string",
        "description": "Hugepages per pod.",
        "priority": 1,
        "jsonPath": ".status.plan.hugepagesPerPod",
    },
    {
        "name": "L3 DRAM",
        "type": "string",
        "description": "UMBP DRAM per pod.",
        "priority": 1,
        "jsonPath": ".spec.l3.dram.capacity",
    },
    {
        "name": "SSD",
        "type": "string",
        "description": "UMBP SSD per pod.",
        "priority": 1,
        "jsonPath": ".spec.l3.ssd.capacity",
    },
    {
        "name": "Phase",
        "type": "string",
        "description": "Lifecycle phase.",
        "priority": 1,
        "jsonPath": ".status.phase",
    },
]


def crd_manifest() -> Schema:
    """The full CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {
                "app.kubernetes.io/name": "sglang-hicache-operator",
                "app.kubernetes.io/component": "crd",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "sglang"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = (
        "# Generated by `python -m hicache_operator crd` (make crd) from the pydantic models in\n"
        "# operator/hicache_operator/api/. Do not edit: tests fail when this file drifts.\n"
    )
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)
