"""The generated CRD: committed copy in sync, structural, defaults valid, CEL rules right.

Real parts: the generator, cel-python evaluating the CEL rules, jsonschema checking defaults.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest
import yaml
from hicache_operator.api.config import OperatorConfig, operator_config_schema
from hicache_operator.api.crd import crd_manifest, crd_yaml, openapi_schema
from hicache_operator.api.docs import render_api_doc
from hicache_operator.plan import SpecError, plan
from shc_testlib import EXAMPLES, ROOT, apply_defaults, crd_cel_failures, load_example

CRD_PATH = ROOT / "charts/sglang-hicache-operator/crds/sglanghicaches.yaml"
ALLOWED_IN_JUNCTORS = {
    "type",
    "pattern",
    "minimum",
    "maximum",
    "enum",
    "format",
    "minLength",
    "maxLength",
    "items",
    "properties",
    "required",
}


def test_committed_crd_matches_models() -> None:
    assert CRD_PATH.read_text() == crd_yaml(), "run `make crd` and commit the result"


def test_committed_api_doc_matches_models() -> None:
    assert (ROOT / "docs/api.md").read_text() == render_api_doc(), (
        "run `python -m hicache_operator api-docs -o docs/api.md`"
    )


def _walk(node: dict[str, Any], path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    out.append((path, node))
    for name, child in (node.get("properties") or {}).items():
        _walk(child, f"{path}.{name}", out)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", out)


def _nodes() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    _walk(openapi_schema(), "", out)
    return out


# apiextensions.k8s.io/v1 JSONSchemaProps: any other key (e.g. JSON Schema's `const`) makes the
# API server reject the whole CRD.
JSON_SCHEMA_PROPS = {
    "description", "type", "format", "title", "default", "maximum", "exclusiveMaximum",
    "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "multipleOf", "enum", "maxProperties", "minProperties", "required", "items",
    "allOf", "oneOf", "anyOf", "not", "properties", "additionalProperties", "patternProperties",
    "dependencies", "additionalItems", "externalDocs", "example", "nullable",
}


def test_schema_keys_are_json_schema_props() -> None:
    for path, node in _nodes():
        unknown = {
            k for k in node if k not in JSON_SCHEMA_PROPS and not k.startswith("x-kubernetes-")
        }
        assert not unknown, f"{path}: {sorted(unknown)} are not JSONSchemaProps fields"


def test_schema_is_structural() -> None:
    """What the API server rejects as non-structural: missing types, $ref, free-form anyOf,
    additionalProperties next to properties, null defaults, titles are harmless but dropped."""
    for path, node in _nodes():
        assert "$ref" not in node and "$defs" not in node, path
        assert "title" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
        else:
            assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, path
            assert node.get("type") in {
                "object",
                "array",
                "string",
                "integer",
                "number",
                "boolean",
            }, f"{path}: no type"
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), path
        assert node.get("default", 0) is not None, path
        for junctor in ("anyOf", "oneOf", "allOf"):
            for branch in node.get(junctor, []):
                assert set(branch) <= ALLOWED_IN_JUNCTORS, f"{path}: {branch}"


def test_every_field_has_a_description() -> None:
    missing = [
        p
        for p, n in _nodes()
        if p.count(".") >= 2
        and not n.get("description")
        and not p.endswith("[]")
        and not p.endswith("{}")
        and p != ".metadata"
    ]
    assert not missing, missing


def test_defaults_are_valid_against_their_own_schema() -> None:
    checked = 0
    for _path, node in _nodes():
        if "default" not in node:
            continue
        schema = {k: v for k, v in node.items() if not k.startswith("x-kubernetes")}
        if node.get("x-kubernetes-int-or-string"):
            schema.pop("anyOf")
        jsonschema.validate(node["default"], schema)
        checked += 1
    assert checked > 30


def test_defaulted_empty_objects_pass_their_cel_rules() -> None:
    """``default: {}`` objects are defaulted recursively; the result must satisfy every rule."""
    cr = {
        "metadata": {"name": "x"},
        "spec": {"model": {"path": "m"}, "hiCache": {"hostPoolPerRank": "1Gi"}},
    }
    assert crd_cel_failures(cr) == []
    defaulted = apply_defaults(openapi_schema(), cr)
    assert defaulted["spec"]["l3"]["dram"]["capacity"] == "0"
    assert defaulted["spec"]["engine"]["pageSize"] == 64


def test_crd_metadata_printer_columns_and_subresources() -> None:
    crd = crd_manifest()
    assert crd["spec"]["names"]["shortNames"] == ["shc"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")] == [
        "Ready", "Replicas", "Hit", "Host-Hit", "L3-Hit", "SSD-Hit", "Model", "Age"]
    assert {"Device-Hit", "DRAM-Hit", "SSD-Read", "L3-Writes", "Hugepages", "L3 DRAM", "SSD",
            "Phase"} <= set(names)
    # Every printer column path exists in the schema.
    schema = openapi_schema()
    for col in version["additionalPrinterColumns"]:
        parts = col["jsonPath"].split("[")[0].strip(".").split(".")
        if parts[0] == "metadata":
            continue
        node = schema
        for part in parts:
            node = node["properties"][part]


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(crd_yaml()) == crd_manifest()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_cel_rules(example: Any) -> None:
    assert crd_cel_failures(yaml.safe_load(example.read_text())) == []


def _bad(mutate: Any) -> dict[str, Any]:
    cr = copy.deepcopy(load_example("deepseek-r1-mi355x.yaml"))
    mutate(cr["spec"])
    return cr


BAD_CRS = {
    "dp_attention_indivisible": (
        lambda s: s["engine"].update(dataParallelSize=3, enableDpAttention=True),
        "spec.engine",
        "enableDpAttention needs dataParallelSize >= 2",
    ),
    "gpus_per_pod_mismatch": (
        lambda s: s["engine"].update(gpusPerPod=4),
        "spec.engine",
        "gpusPerPod must equal",
    ),
    "model_volume_two_sources": (
        lambda s: s["model"]["volume"].update(nfs={"server": "x", "path": "/"}),
        "spec.model",
        "exactly one volume source",
    ),
    "kv_bytes_with_auto_attention": (
        lambda s: s["model"].update(attention="auto", kvBytesPerToken=70272),
        "spec.model",
        "kvBytesPerToken needs attention mha or mla",
    ),
    "kv_heads_with_mla": (
        lambda s: s["model"].update(kvBytesPerToken=70272, kvHeads=8),
        "spec.model",
        "kvHeads applies to attention mha with kvBytesPerToken only",
    ),
    "kv_heads_without_kv_bytes": (
        lambda s: (
            s["model"].update(attention="mha", kvHeads=8), s["model"].pop("kvBytesPerToken", 0)
        ),
        "spec.model",
        "kvHeads applies to attention mha with kvBytesPerToken only",
    ),
    "layer_first": (
        lambda s: s["hiCache"].update(memLayout="layer_first"),
        "spec.hiCache",
        "layer_first is not allowed",
    ),
    "write_through": (
        lambda s: s["hiCache"].update(writePolicy="write_through"),
        "spec.hiCache",
        "needs allowWriteThrough",
    ),
    "pool_and_ratio": (
        lambda s: s["hiCache"].update(hostPoolRatio=2.0),
        "spec.hiCache",
        "exactly one of hostPoolPerRank or hostPoolRatio",
    ),
    "no_pool": (
        lambda s: s["hiCache"].pop("hostPoolPerRank"),
        "spec.hiCache",
        "exactly one of hostPoolPerRank or hostPoolRatio",
    ),
    "two_ssd_volumes": (
        lambda s: s["l3"]["ssd"]["volume"].update(emptyDir={"sizeLimit": "1Ti"}),
        "spec.l3.ssd.volume",
        "exactly one of claimTemplate, emptyDir or hostPath",
    ),
    "no_ssd_volume_kind": (
        lambda s: s["l3"]["ssd"].update(volume={}),
        "spec.l3.ssd.volume",
        "exactly one of claimTemplate",
    ),
    "ssd_without_capacity": (
        lambda s: s["l3"]["ssd"].pop("capacity"),
        "spec.l3.ssd",
        "needs capacity and volume",
    ),
    "standalone_posix_ssd": (
        lambda s: (
            s["l3"].update(mode="standalone", dram={"capacity": "64Gi"}),
            s["l3"]["ssd"].update(ioBackend="posix", engine="mori"),
        ),
        "spec.l3",
        "posix cannot be honoured in standalone mode with engine mori",
    ),
    "mori_several_drives": (
        lambda s: (
            s["l3"]["ssd"].pop("volume"),
            s["l3"]["ssd"].update(engine="mori", volumes=[
                {"claimTemplate": {"size": "1000Gi"}}, {"claimTemplate": {"size": "1000Gi"}}]),
        ),
        "spec.l3.ssd",
        "engine mori stores in one directory",
    ),
    "volume_and_volumes": (
        lambda s: s["l3"]["ssd"].update(volumes=[{"claimTemplate": {"size": "1000Gi"}}]),
        "spec.l3.ssd",
        "set exactly one of volume or volumes",
    ),
    "builtin_backend_ssd": (
        lambda s: s["l3"].update(backend="sglang-mori"),
        "spec.l3",
        "the SSD tier needs backend umbp on mori 1.2.4",
    ),
    "builtin_backend_prefault_threads": (
        lambda s: (
            s["l3"].update(backend="sglang-mori", ssd={"enabled": False}),
            s["hiCache"].setdefault("hostAllocator", {}).update(prefaultThreads=8),
        ),
        "spec",
        "prefaultThreads cannot be honoured with l3.backend sglang-mori",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CRS))
def test_cel_rules_reject_bad_crs(case: str) -> None:
    mutate, path, message = BAD_CRS[case]
    failures = crd_cel_failures(_bad(mutate))
    assert any(p == path and message in m for p, m in failures), failures


def test_cel_allows_write_through_when_explicitly_allowed() -> None:
    cr = _bad(lambda s: s["hiCache"].update(writePolicy="write_through", allowWriteThrough=True))
    assert crd_cel_failures(cr) == []


def test_cel_ratio_needs_no_hugepages() -> None:
    def ratio(s: dict[str, Any]) -> None:
        s["hiCache"].pop("hostPoolPerRank")
        s["hiCache"]["hostPoolRatio"] = 2.0

    failures = crd_cel_failures(_bad(ratio))
    assert any("hostPoolRatio sizes the pool" in m for _, m in failures), failures

    def ratio_4k(s: dict[str, Any]) -> None:
        ratio(s)
        s["hiCache"]["hostAllocator"]["hugePageSize"] = "none"

    assert crd_cel_failures(_bad(ratio_4k)) == []


def test_cel_name_length_rule() -> None:
    cr = load_example("minimal-dram-only.yaml")
    cr["metadata"]["name"] = "a" * 53
    assert any("at most 52" in m for _, m in crd_cel_failures(cr))


def test_operator_config_schema_accepts_defaults_and_rejects_typos() -> None:
    schema = operator_config_schema()
    jsonschema.validate({"policy": {"allowedHostPathPrefixes": ["/mnt"]}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"polcy": {}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"logLevel": "LOUD"}, schema)


@pytest.mark.parametrize("case", sorted(BAD_CRS))
def test_planner_rejects_what_cel_rejects(case: str) -> None:
    """The planner re-checks every CEL rule (for `plan -f` and CRs stored before a rule)."""
    mutate, path, _ = BAD_CRS[case]
    with pytest.raises(SpecError) as err:
        plan(_bad(mutate), OperatorConfig())
    assert any(p == path or p.startswith(path + ".") for p, _ in err.value.problems), (
        err.value.problems
    )


_SELF_PATH = re.compile(r"\bself((?:\.[A-Za-z_][A-Za-z0-9_]*)*)")
_SIZE_ARG = re.compile(r"\bsize\(self((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\)")


def _cel_type_of(node: dict[str, Any], fields: list[str], at_root: bool) -> dict[str, Any]:
    """The schema node a CEL field path selects, as the API server types it: only declared
    properties are fields (a preserve-unknown-fields object exposes none); at the resource root
    metadata.name is always declared (apiextensions' WithTypeAndObjectMeta)."""
    for i, name in enumerate(fields):
        if at_root and i == 0 and name == "metadata":
            assert fields[1:2] in ([], ["name"]), fields
            return {"type": "string"} if fields[1:] else {"type": "object"}
        props = node.get("properties") or {}
        assert name in props, f"CEL selects .{name}, not a declared field (API server: no such key)"
        node = props[name]
    return node


def test_cel_rules_only_touch_declared_fields_and_size_takes_sized_types() -> None:
    """What the API server's CEL type check rejects at CRD creation (a CRD with one such rule is
    refused whole): selecting a field the structural schema does not declare, and ``size()`` on
    an object (only strings, lists and maps - additionalProperties - have a size)."""
    checked = 0
    for path, node in _nodes():
        for rule in node.get("x-kubernetes-validations", []):
            text = rule["rule"]
            for match in _SELF_PATH.finditer(text):
                fields = [f for f in match.group(1).split(".") if f]
                _cel_type_of(node, fields, at_root=path == "")
            for match in _SIZE_ARG.finditer(text):
                fields = [f for f in match.group(1).split(".") if f]
                target = _cel_type_of(node, fields, at_root=path == "")
                sized = target.get("type") in ("string", "array") or (
                    target.get("type") == "object"
                    and isinstance(target.get("additionalProperties"), dict)
                )
                assert sized, f"{path}: size() of {match.group(0)} ({target}) does not compile"
                checked += 1
    assert checked >= 1  # size(self.metadata.name); the model volume counts has() now


def test_the_cel_type_check_catches_size_of_an_object() -> None:
    """Guard: the old model-volume schema (a bare preserve-unknown-fields object) fails it."""
    node = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    with pytest.raises(AssertionError):
        target = _cel_type_of({"properties": {"volume": node}}, ["volume"], at_root=False)
        assert target.get("type") == "object" and isinstance(
            target.get("additionalProperties"), dict
        )
    with pytest.raises(AssertionError, match="not a declared field"):
        _cel_type_of({"properties": {"volume": node}}, ["volume", "hostPath"], at_root=False)
