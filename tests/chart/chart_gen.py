"""Generates the chart's values.schema.json and the values table of its README.

* ``values.schema.json``: the chart's own keys (below) plus, under ``operatorConfig``, the
  operator's configuration schema (``hicache_operator.api.config.operator_config_schema``) with
  its ``$ref``s inlined, because Helm 3 validates with a draft-07 validator. One source of truth:
  a value the operator would reject is rejected by ``helm install`` already.
* README: the table between ``<!-- values:start -->`` and ``<!-- values:end -->`` is built from the
  ``# --`` comments in values.yaml (helm-docs convention).

``python tests/chart/chart_gen.py --write`` regenerates both; ``test_chart_values.py`` fails when
the committed files differ from what this module generates.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sglang-hicache-operator"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
README = CHART / "README.md"
TABLE_START = "<!-- values:start -->"
TABLE_END = "<!-- values:end -->"

JsonObj = dict[str, Any]


def _obj(props: JsonObj, required: list[str] | None = None) -> JsonObj:
    out: JsonObj = {"type": "object", "additionalProperties": False, "properties": props}
    if required:
        out["required"] = required
    return out


_QTY: JsonObj = {"type": "string",
                 "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"}
_CPU: JsonObj = {"anyOf": [{"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?m?$"},
                           {"type": "number", "exclusiveMinimum": 0}]}
_DNS_LABEL: JsonObj = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                       "maxLength": 63}
_STR_MAP: JsonObj = {"type": "object", "additionalProperties": {"type": "string"}}
_PORT: JsonObj = {"type": "integer", "minimum": 1, "maximum": 65535}
_RES: JsonObj = _obj({"cpu": _CPU, "memory": _QTY})
_DURATION: JsonObj = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"}


def _inline_refs(node: Any, defs: JsonObj) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            merged = {**copy.deepcopy(defs[name]), **{k: v for k, v in node.items() if k != "$ref"}}
            return _inline_refs(merged, defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k not in ("$defs", "title")}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def operator_config_schema() -> JsonObj:
    """The operator's config schema, draft-07 compatible, with the chart's tightenings."""
    for sub in ("operator", "backend"):
        if str(ROOT / sub) not in sys.path:
            sys.path.insert(0, str(ROOT / sub))
    from hicache_operator.api.config import operator_config_schema as source

    raw = source()
    schema: JsonObj = _inline_refs(raw, raw.get("$defs", {}))
    schema.pop("$schema", None)
    props = schema["properties"]
    # Tightenings the file format allows but a chart user never means: absolute host paths,
    # DNS-label namespaces, no duplicates.
    prefixes = props["policy"]["properties"]["allowedHostPathPrefixes"]
    prefixes["items"] = {"type": "string", "pattern": "^/"}
    prefixes["uniqueItems"] = True
    props["watchNamespaces"]["items"] = _DNS_LABEL
    props["watchNamespaces"]["uniqueItems"] = True
    return schema


def values_schema() -> JsonObj:
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "sglang-hicache-operator chart values",
        **_obj({
            "nameOverride": {"type": "string"},
            "fullnameOverride": {"type": "string"},
            "image": _obj({
                "repository": {"type": "string", "minLength": 1},
                "tag": {"type": "string"},
                "digest": {"type": "string", "pattern": "^(sha256:[a-f0-9]{64})?$"},
                "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
            }, ["repository", "tag", "digest", "pullPolicy"]),
            "imagePullSecrets": {"type": "array", "items": _DNS_LABEL},
            "replicaCount": {"type": "integer", "minimum": 1, "maximum": 5},
            "serviceAccount": _obj({"create": {"type": "boolean"}, "name": {"type": "string"},
                                    "annotations": _STR_MAP}, ["create", "name"]),
            "rbac": _obj({"create": {"type": "boolean"}}, ["create"]),
            "peering": _obj({"enabled": {"type": "boolean"}, "name": {"type": "string"}},
                            ["enabled", "name"]),
            "operatorConfig": operator_config_schema(),
            "metrics": _obj({
                "port": _PORT,
                "service": _obj({"enabled": {"type": "boolean"}}, ["enabled"]),
                "serviceMonitor": _obj({
                    "enabled": {"type": "boolean"},
                    "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"},
                    "labels": _STR_MAP,
                }, ["enabled"]),
            }, ["port"]),
            "monitoring": _obj({
                "namespaces": {"type": "array", "items": _DNS_LABEL, "uniqueItems": True},
                "podMonitors": _obj({"enabled": {"type": "boolean"}, "interval": _DURATION,
                                     "labels": _STR_MAP}, ["enabled"]),
                "prometheusRule": _obj({
                    "enabled": {"type": "boolean"}, "interval": _DURATION, "labels": _STR_MAP,
                    "storageWritesFailingRatio": {"type": "number", "exclusiveMinimum": 0,
                                                  "maximum": 1},
                    "minL2TokensPerSecond": {"type": "number", "minimum": 0},
                    "storageWritesFailingFor": _DURATION,
                    "ssdTierErrorsFor": _DURATION,
                    "podOutOfRouterSetFor": _DURATION,
                    "hitRatioCollapseFactor": {"type": "number", "exclusiveMinimum": 0,
                                               "maximum": 1},
                    "hitRatioBaselineOffset": _DURATION,
                    "minPromptTokensPerSecond": {"type": "number", "minimum": 0},
                    "hitRatioCollapseFor": _DURATION,
                }, ["enabled"]),
                "dashboard": _obj({"enabled": {"type": "boolean"},
                                   "namespace": {"anyOf": [{"const": ""}, _DNS_LABEL]},
                                   "labels": _STR_MAP, "annotations": _STR_MAP}, ["enabled"]),
            }, ["podMonitors", "prometheusRule", "dashboard"]),
            "health": _obj({"port": _PORT}, ["port"]),
            "networkPolicy": _obj({
                "enabled": {"type": "boolean"},
                "metricsNamespaceSelector": _STR_MAP,
                "apiServerPorts": {"type": "array", "minItems": 1, "items": _PORT},
                "apiServerCIDRs": {"type": "array", "items": {
                    "type": "string", "pattern": "^[0-9a-fA-F:.]+/[0-9]{1,3}$"}},
            }, ["enabled"]),
            "resources": _obj({"requests": _RES, "limits": _RES}, ["requests", "limits"]),
            "podDisruptionBudget": _obj({"enabled": {"type": "boolean"}}, ["enabled"]),
            "priorityClassName": {"type": "string"},
            "nodeSelector": _STR_MAP,
            "tolerations": {"type": "array", "items": {"type": "object"}},
            "affinity": {"type": "object"},
            "podAnnotations": _STR_MAP,
            "podLabels": _STR_MAP,
        }, ["image", "replicaCount", "serviceAccount", "rbac", "peering", "operatorConfig",
            "metrics", "health", "resources"]),
    }


def render_schema() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


# --- values documentation -------------------------------------------------------------------

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")


def values_docs(text: str) -> dict[str, str]:
    """``# --`` comment text per dotted key path of values.yaml, in file order."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        match = _KEY_LINE.match(line)
        if not match:
            pending = None if not stripped.startswith("-") else pending
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        if pending is not None:
            docs[".".join(k for _, k in stack)] = " ".join(pending)
        pending = None
    return docs


def leaf_paths(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves (scalars, lists, empty maps) of a values tree."""
    if isinstance(data, dict) and data:
        out: list[str] = []
        for key, value in data.items():
            out += leaf_paths(value, f"{prefix}.{key}" if prefix else key)
        return out
    return [prefix]


def undocumented(values_text: str) -> list[str]:
    """Leaves with no ``# --`` comment on themselves or on an enclosing key."""
    docs = values_docs(values_text)
    data = yaml.safe_load(values_text)
    missing = []
    for path in leaf_paths(data):
        parts = path.split(".")
        if not any(".".join(parts[:i]) in docs for i in range(1, len(parts) + 1)):
            missing.append(path)
    return missing


def _lookup(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def values_table(values_text: str) -> str:
    docs = values_docs(values_text)
    data = yaml.safe_load(values_text)
    rows = ["| Key | Default | Description |", "|-----|---------|-------------|"]
    for path, doc in docs.items():
        default = json.dumps(_lookup(data, path), separators=(",", ":"))
        text = doc.replace("|", "\\|")
        rows.append(f"| `{path}` | `{default}` | {text} |")
    return "\n".join(rows) + "\n"


def render_readme(readme: str, values_text: str) -> str:
    start, end = readme.index(TABLE_START), readme.index(TABLE_END)
    return (readme[: start + len(TABLE_START)] + "\n" + values_table(values_text)
            + readme[end:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", action="store_true", help="rewrite the files")
    args = parser.parse_args()
    values_text = VALUES.read_text()
    outputs = {SCHEMA: render_schema(), README: render_readme(README.read_text(), values_text)}
    stale = [p for p, text in outputs.items() if p.read_text() != text]
    if args.write:
        for path in stale:
            path.write_text(outputs[path])
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    for path in stale:
        print(f"stale: {path.relative_to(ROOT)} (python tests/chart/chart_gen.py --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
