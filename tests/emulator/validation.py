"""What the API server does to a custom resource before storing it: prune, default, validate.

Given one version's ``openAPIV3Schema`` from a CustomResourceDefinition:

1. **Pruning**: fields not declared in a structural schema are dropped silently (unless
   ``x-kubernetes-preserve-unknown-fields: true``), and so are ``null`` values of fields that
   are not ``nullable``. This is why kopf's default progress storage
   in ``status.kopf`` vanishes on a real cluster and the operator must use annotations.
2. **Defaulting**: ``default`` values are filled in for absent properties (recursively).
3. **Validation**: the OpenAPI keywords (type, enum, required, min/max, pattern, items, ...)
   with ``jsonschema``, then the CEL rules in ``x-kubernetes-validations`` with ``cel-python``
   (``self`` bound to the node's value; transition rules with ``oldSelf`` run on updates only).

Every failure is a ``(field_path, message)`` cause; the server turns them into a 422.
Gaps: Kubernetes' CEL extension libraries (quantity, url, ip, the ``strings`` extensions) are
not available in cel-python, nor ``messageExpression``; CEL cost limits are not enforced; formats
(``int32``, ``date-time``, ...) are not checked.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import celpy
import celpy.adapter
import jsonschema

Cause = tuple[str, str]
_K8S_ONLY_KEYS = ("default", "nullable", "example", "externalDocs")


def _to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Translate a Kubernetes structural schema into plain JSON Schema (draft 7)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in _K8S_ONLY_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = _to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _prune_and_default(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict) and not schema.get("x-kubernetes-embedded-resource", False):
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
        result: dict[str, Any] = {}
        for key, sub in value.items():
            if sub is None and not (props.get(key) or {}).get("nullable"):
                continue  # nulls of non-nullable fields are pruned before defaulting
            if key in props:
                result[key] = _prune_and_default(sub, props[key])
            elif isinstance(extra, dict):
                result[key] = _prune_and_default(sub, extra)
            elif keep_unknown or extra is True:
                result[key] = sub
        for key, sub_schema in props.items():
            if key not in result and "default" in sub_schema:
                result[key] = _prune_and_default(copy.deepcopy(sub_schema["default"]), sub_schema)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune_and_default(item, schema["items"]) for item in value]
    return value


@dataclass
class _CelRule:
    path: tuple[str, ...]  # schema path; "*" for list items / map values
    rule: str
    message: str
    field_path: str
    program: Any = field(repr=False)
    transition: bool


def _collect_rules(
    env: Any, schema: dict[str, Any], path: tuple[str, ...]
) -> Iterator[_CelRule]:
    for item in schema.get("x-kubernetes-validations", []):
        rule = item["rule"]
        try:
            program = env.program(env.compile(rule))
        except Exception as exc:  # cel-python raises its own parse error types
            raise ValueError(f"CEL rule at {'.'.join(path) or '<root>'} does not compile: "
                             f"{rule!r}: {exc}") from exc
        yield _CelRule(path, rule, item.get("message") or f"failed rule: {rule}",
                       item.get("fieldPath", ""), program, "oldSelf" in rule)
    for name, sub in schema.get("properties", {}).items():
        yield from _collect_rules(env, sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from _collect_rules(env, schema["items"], (*path, "*"))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _collect_rules(env, schema["additionalProperties"], (*path, "*"))


def _nodes(value: Any, path: tuple[str, ...], shown: str) -> Iterator[tuple[str, Any]]:
    """Yield (display path, value) for every node the schema path matches."""
    if not path:
        yield shown, value
        return
    head, rest = path[0], path[1:]
    if head == "*":
        items = (value.items() if isinstance(value, dict)
                 else enumerate(value) if isinstance(value, list) else ())
        for key, sub in items:
            label = f"{shown}[{key}]"
            yield from _nodes(sub, rest, label)
    elif isinstance(value, dict) and head in value:
        yield from _nodes(value[head], rest, f"{shown}.{head}" if shown else head)


def _cel_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {k: meta[k] for k in ("name", "generateName") if k in meta}


@dataclass
class SchemaValidator:
    """Prune, default and validate objects against one CRD version's openAPIV3Schema."""

    schema: dict[str, Any]
    _json_validator: Any = field(init=False, repr=False)
    _rules: list[_CelRule] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        body_schema = _to_json_schema(self.schema)
        self._json_validator = jsonschema.Draft7Validator(body_schema)
        self._rules = list(_collect_rules(celpy.Environment(), self.schema, ()))

    def prune_and_default(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The stored form of ``obj``: unknown fields dropped, defaults filled in."""
        metadata, api_version, kind = obj.get("metadata"), obj.get("apiVersion"), obj.get("kind")
        result = _prune_and_default(obj, self.schema)
        # apiVersion/kind/metadata are never pruned (the server owns their schema).
        for key, value in (("metadata", metadata), ("apiVersion", api_version), ("kind", kind)):
            if value is not None:
                result[key] = value
        return dict(result)

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
        body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
        causes: list[Cause] = []
        for error in self._json_validator.iter_errors(body):
            where = ".".join(str(p) for p in error.absolute_path) or "<root>"
            causes.append((where, error.message))
        if causes:  # CEL rules assume a schema-valid object, as on a real server
            return causes
        # CEL at the root may read metadata.name and metadata.generateName (nothing else).
        cel_body = {**body, "metadata": _cel_metadata(obj)}
        old_body = None if old is None else {
            **{k: v for k, v in old.items() if k not in ("metadata", "apiVersion", "kind")},
            "metadata": _cel_metadata(old)}
        for rule in self._rules:
            causes.extend(self._check_rule(rule, cel_body, old_body))
        return causes

    def _check_rule(self, rule: _CelRule, body: dict[str, Any],
                    old_body: dict[str, Any] | None) -> Iterator[Cause]:
        old_nodes = dict(_nodes(old_body, rule.path, "")) if old_body is not None else {}
        for shown, value in _nodes(body, rule.path, ""):
            activation = {"self": celpy.adapter.json_to_cel(value)}
            if rule.transition:
                if shown not in old_nodes:
                    continue  # transition rules only run when the old value exists
                activation["oldSelf"] = celpy.adapter.json_to_cel(old_nodes[shown])
            where = shown or "<root>"
            if rule.field_path:
                where = f"{shown}{rule.field_path}" if shown else rule.field_path.lstrip(".")
            try:
                ok = rule.program.evaluate(activation)
            except Exception as exc:  # evaluation errors reject the object, like the server
                yield where, f"{rule.message} (rule {rule.rule!r} failed to evaluate: {exc})"
                continue
            if not bool(ok):
                yield where, rule.message
