"""What the API server checks on built-in kinds before storing them (answered with HTTP 422).

1. The OpenAPI schema of the kind (``kubernetes-validate``, Kubernetes 1.33, strict: unknown
   fields are refused where a real server would drop them with a warning).
2. The rules of the server's Go validation that the schemas do not state, for the kinds and
   fields the operator writes (apimachinery ``validation`` and core/v1 ``ValidatePodSpec``):
   label keys and values, object names in references (PriorityClass), unique container,
   volume and port names, every volume mount naming a volume, unique mount paths, selector
   operators and values, toleration operators, env sources with exactly one member.
3. Update rules: a PersistentVolumeClaim's spec is immutable except
   ``resources.requests.storage`` of a bound claim, which may only grow, and only when its
   StorageClass has ``allowVolumeExpansion: true`` (else 403, as the PersistentVolumeClaimResize
   admission plugin answers).

Written from the Kubernetes validation code, independently of the operator's own checks
(``hicache_operator.planner.object_checks``), so the two can disagree and a test then fails.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from .apps_rbac import workload_causes

K8S_VERSION = "1.33"
KINDS = frozenset({"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget",
                   "PersistentVolumeClaim", "StorageClass", "Deployment", "ServiceAccount",
                   "Role", "RoleBinding"})
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
Cause = tuple[str, str]


def _key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


def _labels(labels: Any, path: str) -> Iterator[Cause]:
    for key, value in (labels or {}).items():
        if not _key_ok(key):
            yield path, f"Invalid value: {key!r}: name part must consist of alphanumeric " \
                        "characters, '-', '_' or '.', and must start and end with an " \
                        "alphanumeric character"
        if not isinstance(value, str) or len(value) > 63 or not _VALUE.match(value):
            yield f"{path}[{key}]", f"Invalid value: {value!r}: a valid label must be an empty " \
                                    "string or consist of alphanumeric characters, '-', '_' " \
                                    "or '.'"


def _requirements(reqs: Any, path: str, fields: bool = False) -> Iterator[Cause]:
    for i, req in enumerate(reqs or []):
        op, values, key = req.get("operator"), req.get("values") or [], req.get("key", "")
        if not fields and not _key_ok(key):
            yield f"{path}[{i}].key", f"Invalid value: {key!r}"
        if op in ("In", "NotIn") and not values:
            yield f"{path}[{i}].values", "Required value: must be specified when `operator` " \
                                         "is 'In' or 'NotIn'"
        if op in ("Exists", "DoesNotExist") and values:
            yield f"{path}[{i}].values", "Forbidden: may not be specified when `operator` is " \
                                         "'Exists' or 'DoesNotExist'"
        if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?\d+", values[0])):
            yield f"{path}[{i}].values", "Required value: must be specified single value " \
                                         "when `operator` is 'Lt' or 'Gt'"


def _dupes(values: list[Any]) -> list[Any]:
    return [v for v, n in Counter(values).items() if n > 1]


def _pod_spec(pod: Mapping[str, Any], path: str, claims: list[str | None]
              ) -> Iterator[Cause]:
    volumes = [v.get("name") for v in pod.get("volumes") or []]
    for name in _dupes(volumes + claims):
        yield f"{path}.volumes", f"Duplicate value: {name!r}"
    containers = list(pod.get("initContainers") or []) + list(pod.get("containers") or [])
    for name in _dupes([c.get("name") for c in containers]):
        yield f"{path}.containers", f"Duplicate value: {name!r}"
    for c in containers:
        where = f"{path}.containers[{c.get('name')}]"
        mounts = c.get("volumeMounts") or []
        for m in mounts:
            if m.get("name") not in set(volumes) | set(claims):
                yield f"{where}.volumeMounts.name", f"Not found: {m.get('name')!r}"
        for mount_path in _dupes([m.get("mountPath") for m in mounts]):
            yield f"{where}.volumeMounts.mountPath", "Invalid value: " \
                                                      f"{mount_path!r}: must be unique"
        for name in _dupes([p.get("name") for p in c.get("ports") or [] if p.get("name")]):
            yield f"{where}.ports", f"Duplicate value: {name!r}"
        for i, env in enumerate(c.get("env") or []):
            source = env.get("valueFrom")
            if source is not None and len(source) != 1:
                yield f"{where}.env[{i}].valueFrom", "Invalid value: may not have more than " \
                                                     "one field specified at a time"
    yield from _labels(pod.get("nodeSelector"), f"{path}.nodeSelector")
    priority = pod.get("priorityClassName")
    if priority is not None and (len(priority) > 253 or not _SUBDOMAIN.match(priority)):
        yield f"{path}.priorityClassName", f"Invalid value: {priority!r}: a lowercase RFC " \
                                           "1123 subdomain must consist of lower case " \
                                           "alphanumeric characters, '-' or '.'"
    node = ((pod.get("affinity") or {}).get("nodeAffinity") or {})
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for t, term in enumerate(required.get("nodeSelectorTerms") or []):
        where = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring" \
                f"Execution.nodeSelectorTerms[{t}]"
        yield from _requirements(term.get("matchExpressions"), f"{where}.matchExpressions")
        yield from _requirements(term.get("matchFields"), f"{where}.matchFields", fields=True)
    for i, tol in enumerate(pod.get("tolerations") or []):
        if tol.get("operator") == "Exists" and tol.get("value"):
            yield f"{path}.tolerations[{i}].value", "Invalid value: value must be empty " \
                                                    "when `operator` is 'Exists'"


def semantic_causes(obj: Mapping[str, Any]) -> list[Cause]:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    causes = list(_labels(meta.get("labels"), "metadata.labels"))
    if obj.get("kind") in ("StatefulSet", "Deployment"):
        template = spec.get("template") or {}
        causes += _labels((template.get("metadata") or {}).get("labels"),
                          "spec.template.metadata.labels")
        claims = [(c.get("metadata") or {}).get("name") for c in
                  spec.get("volumeClaimTemplates") or []]
        causes += _pod_spec(template.get("spec") or {}, "spec.template.spec", claims)
    if obj.get("kind") in ("Service",):
        causes += _labels(spec.get("selector"), "spec.selector")
    causes += workload_causes(obj)
    return causes


@functools.cache
def _schema_validator(kind: str, api_version: str) -> Any:
    """kubernetes-validate's own schema files and registry, built once per kind (its
    ``validate()`` re-reads the multi-megabyte definitions file on every call)."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    directory = f"kubernetes-json-schema/v{K8S_VERSION}.0-local-strict"
    schema = schema_contents(f"{directory}/{kind.lower()}-{group_version}.json", K8S_VERSION)
    definitions = schema_contents(f"{directory}/_definitions.json", K8S_VERSION)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate_builtin(obj: Mapping[str, Any]) -> list[Cause]:
    """Why the API server would refuse ``obj`` (empty: it would store it)."""
    if obj.get("kind") not in KINDS:
        return []
    body = {k: v for k, v in obj.items() if k != "status"}
    validator = _schema_validator(str(obj["kind"]), str(obj.get("apiVersion")))
    error = jsonschema.exceptions.best_match(validator.iter_errors(body))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "<root>"
        return [(where, f"Invalid value: {error.message}")]
    return semantic_causes(obj)


def _storage(pvc: Mapping[str, Any]) -> str | None:
    return (((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "": 1}


def quantity(value: Any) -> float:
    """A storage quantity's value (resource.Quantity, enough for sizes: no milli, no exponent)."""
    match = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?", str(value))
    if match is None:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


def pvc_update_causes(new: Mapping[str, Any], old: Mapping[str, Any],
                      storage_class: Mapping[str, Any] | None) -> tuple[int, list[Cause]]:
    """(HTTP status, causes) for a PVC update the server refuses ((0, []) when it accepts)."""
    new_spec, old_spec = dict(new.get("spec") or {}), dict(old.get("spec") or {})
    if not old_spec.get("volumeName"):  # binding: the volume controller sets it once
        old_spec["volumeName"] = new_spec.get("volumeName")
        if old_spec["volumeName"] is None:
            old_spec.pop("volumeName")
    size_new, size_old = _storage(new), _storage(old)
    for spec in (new_spec, old_spec):
        spec["resources"] = {**(spec.get("resources") or {}), "requests": {}}
    if new_spec != old_spec:
        return 422, [("spec", "Forbidden: spec is immutable after creation except "
                      "resources.requests and volumeAttributesClassName for bound claims")]
    if size_new == size_old:
        return 0, []
    if (old.get("status") or {}).get("phase") != "Bound":
        return 422, [("spec", "Forbidden: spec is immutable after creation except "
                      "resources.requests for bound claims")]
    if quantity(size_new) < quantity(size_old):
        return 422, [("spec.resources.requests.storage",
                      "Forbidden: field can not be less than status.capacity")]
    if storage_class is None or storage_class.get("allowVolumeExpansion") is not True:
        return 403, [("spec.resources.requests.storage",
                      "Forbidden: only dynamically provisioned pvc can be resized and the "
                      "storageclass that provisions the pvc must support resize")]
    return 0, []
