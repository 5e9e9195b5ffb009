"""API-server validation rules for what a CR passes into the pod, stated with spec field paths.

The CRD schema types these fields (``api.k8s``), but a structural schema cannot cheaply state
label-key syntax on map keys or which operators need values; the API server's own validation
would then refuse the StatefulSet (HTTP 422) after the ConfigMap and Services exist. These checks
make the planner refuse such a spec first, naming the CR field, so nothing is applied. The
rules follow apimachinery's ``validation`` package (qualified names, label values, DNS names)
and core/v1's affinity and toleration validation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hicache_umbp.contract.paths import POD_INFO_DIR, REPORT_DIR, SOCKET_DIR, SSD_MOUNT

from ..api.k8s import Affinity, LabelSelector, NodeSelectorTerm, PodAffinity
from ..api.spec import SGLangHiCacheSpec
from ..api.types import DNS1123_SUBDOMAIN
from .errors import Problems

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

SHM_PATH = "/dev/shm"
#: Paths the operator mounts into the engine container itself (builders.statefulset); a model
#: volume on, inside or above one of them would collide with it or hide it.
OPERATOR_MOUNT_PATHS = (SHM_PATH, REPORT_DIR, SOCKET_DIR, SSD_MOUNT, POD_INFO_DIR)


def qualified_name(value: str) -> str | None:
    """Why ``value`` is not a qualified name (a label or annotation key), or None."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' must not be empty"
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"the prefix {prefix!r} must be a DNS-1123 subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            "the name part must be at most 63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit (an optional DNS prefix and '/' before "
            "it), e.g. example.com/my-key"
        )
    return None


def label_value(value: str) -> str | None:
    """Why ``value`` is not a valid label value, or None."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            "must be empty or at most 63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def dns1123_subdomain(value: str) -> str | None:
    if not value or len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        return (
            "must be a DNS-1123 subdomain: at most 253 lower-case letters, digits, '-' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def dns1123_label(value: str) -> str | None:
    if not value or len(value) > 63 or not _DNS1123_LABEL.match(value):
        return (
            "must be a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting "
            "and ending with a letter or digit"
        )
    return None


def env_name(value: str) -> str | None:
    if not value or not _ENV_NAME.match(value):
        return "must consist of letters, digits, '-', '.' or '_' and not start with a digit"
    return None


def check_labels(labels: Mapping[str, str], path: str, problems: Problems) -> None:
    """Label keys and values (a nodeSelector, matchLabels, metadata.labels)."""
    for key, value in labels.items():
        why = qualified_name(key)
        if why:
            problems.add(path, f"key {key!r} is not a valid label key: {why}")
        why = label_value(value) if isinstance(value, str) else "must be a string"
        if why:
            problems.add(f"{path}[{key}]", f"value {value!r} is not a valid label value: {why}")


def check_requirement(
    key: str, operator: str, values: Sequence[str] | None, path: str, problems: Problems,
    *, field: bool = False,
) -> None:
    """One node/label selector requirement (core/v1 ``validateNodeSelectorRequirement``)."""
    if field:
        if key != "metadata.name":
            problems.add(f"{path}.key", f"{key!r}: matchFields supports only metadata.name")
    else:
        why = qualified_name(key)
        if why:
            problems.add(f"{path}.key", f"{key!r} is not a valid label key: {why}")
    count = len(values or [])
    if operator in ("In", "NotIn") and count == 0:
        problems.add(f"{path}.values", f"must be non-empty for operator {operator}")
    elif operator in ("Exists", "DoesNotExist") and count:
        problems.add(f"{path}.values", f"must be empty for operator {operator}")
    elif operator in ("Gt", "Lt") and (
        count != 1 or not re.fullmatch(r"-?[0-9]+", (values or [""])[0])
    ):
        problems.add(f"{path}.values", f"operator {operator} needs exactly one integer value")
    if not field:
        for i, value in enumerate(values or []):
            if operator in ("In", "NotIn") and label_value(value):
                problems.add(f"{path}.values[{i}]", f"{value!r}: {label_value(value)}")


def _node_term(term: NodeSelectorTerm, path: str, problems: Problems) -> None:
    for i, req in enumerate(term.match_expressions or []):
        check_requirement(req.key, req.operator, req.values, f"{path}.matchExpressions[{i}]",
                          problems)
    for i, req in enumerate(term.match_fields or []):
        check_requirement(req.key, req.operator, req.values, f"{path}.matchFields[{i}]",
                          problems, field=True)
        if req.key == "metadata.name" and req.operator not in ("In", "NotIn"):
            problems.add(f"{path}.matchFields[{i}].operator", "metadata.name allows In/NotIn")


def check_label_selector(selector: LabelSelector, path: str, problems: Problems) -> None:
    check_labels(selector.match_labels or {}, f"{path}.matchLabels", problems)
    for i, req in enumerate(selector.match_expressions or []):
        check_requirement(req.key, req.operator, req.values, f"{path}.matchExpressions[{i}]",
                          problems)


def _pod_terms(aff: PodAffinity, path: str, problems: Problems) -> None:
    required = aff.required_during_scheduling_ignored_during_execution or []
    preferred = aff.preferred_during_scheduling_ignored_during_execution or []
    terms = [(f"{path}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", t)
             for i, t in enumerate(required)]
    terms += [(f"{path}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm",
               w.pod_affinity_term) for i, w in enumerate(preferred)]
    for where, term in terms:
        why = qualified_name(term.topology_key)
        if why:
            problems.add(f"{where}.topologyKey", f"{term.topology_key!r}: {why}")
        for name, selector in (("labelSelector", term.label_selector),
                               ("namespaceSelector", term.namespace_selector)):
            if selector is not None:
                check_label_selector(selector, f"{where}.{name}", problems)
        for i, ns in enumerate(term.namespaces or []):
            why = dns1123_label(ns)
            if why:
                problems.add(f"{where}.namespaces[{i}]", f"{ns!r} {why}")


def check_affinity(affinity: Affinity, path: str, problems: Problems) -> None:
    node = affinity.node_affinity
    if node is not None:
        required = node.required_during_scheduling_ignored_during_execution
        if required is not None:
            where = f"{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            if not required.node_selector_terms:
                problems.add(f"{where}.nodeSelectorTerms", "must have at least one term")
            for i, term in enumerate(required.node_selector_terms):
                _node_term(term, f"{where}.nodeSelectorTerms[{i}]", problems)
        for i, pref in enumerate(node.preferred_during_scheduling_ignored_during_execution or []):
            _node_term(pref.preference, f"{path}.nodeAffinity."
                       f"preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", problems)
    for name, pod in (("podAffinity", affinity.pod_affinity),
                      ("podAntiAffinity", affinity.pod_anti_affinity)):
        if pod is not None:
            _pod_terms(pod, f"{path}.{name}", problems)


def _mount_overlap(a: str, b: str) -> bool:
    """Equal, or one path inside the other (``/var/run`` hides ``/var/run/umbp``)."""
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b + "/") or b.startswith(a + "/") or "/" in (a, b)


def check_pod_inputs(spec: SGLangHiCacheSpec, problems: Problems) -> None:
    """Every CR field that ends up in the pod template, checked as the API server would."""
    placement = spec.placement
    check_labels(placement.node_selector, "spec.placement.nodeSelector", problems)
    if placement.affinity is not None:
        check_affinity(placement.affinity, "spec.placement.affinity", problems)
    if placement.priority_class_name is not None:
        why = dns1123_subdomain(placement.priority_class_name)
        if why:
            problems.add("spec.placement.priorityClassName",
                         f"{placement.priority_class_name!r} {why}")
    for i, tol in enumerate(placement.tolerations):
        where = f"spec.placement.tolerations[{i}]"
        if tol.key:
            why = qualified_name(tol.key)
            if why:
                problems.add(f"{where}.key", f"{tol.key!r}: {why}")
        elif tol.operator != "Exists":
            problems.add(f"{where}.operator", "an empty key needs operator Exists")
        if tol.operator == "Exists" and tol.value:
            problems.add(f"{where}.value", "must be empty for operator Exists")
        if tol.toleration_seconds is not None and tol.effect != "NoExecute":
            problems.add(f"{where}.tolerationSeconds", "only applies to effect NoExecute")
    for i, var in enumerate(spec.engine.env):
        why = env_name(var.name)
        if why:
            problems.add(f"spec.engine.env[{i}].name", f"{var.name!r} {why}")
        source = var.value_from
        if source is not None:
            members = [m for m in (source.field_ref, source.resource_field_ref,
                                   source.config_map_key_ref, source.secret_key_ref)
                       if m is not None]
            if len(members) != 1:
                problems.add(f"spec.engine.env[{i}].valueFrom",
                             "must set exactly one of fieldRef, resourceFieldRef, "
                             "configMapKeyRef or secretKeyRef")
            for name, ref in (("configMapKeyRef", source.config_map_key_ref),
                              ("secretKeyRef", source.secret_key_ref)):
                if ref is not None and dns1123_subdomain(ref.name):
                    problems.add(f"spec.engine.env[{i}].valueFrom.{name}.name",
                                 f"{ref.name!r} {dns1123_subdomain(ref.name)}")
    model = spec.model
    if model.volume is not None:
        for reserved in OPERATOR_MOUNT_PATHS:
            if _mount_overlap(model.mount_path, reserved):
                problems.add(
                    "spec.model.mountPath",
                    f"{model.mount_path} collides with {reserved}, which the operator mounts "
                    f"in the engine container (reserved: {', '.join(OPERATOR_MOUNT_PATHS)}); "
                    f"choose another path, e.g. /models",
                )
                break
        pvc = model.volume.persistent_volume_claim
        if pvc is not None and dns1123_subdomain(pvc.claim_name):
            problems.add("spec.model.volume.persistentVolumeClaim.claimName",
                         f"{pvc.claim_name!r} {dns1123_subdomain(pvc.claim_name)}")


def model_path_warnings(spec: SGLangHiCacheSpec) -> list[str]:
    """A model volume SGLang would never read: the path lies outside its mount."""
    model = spec.model
    if model.volume is None:
        if model.path.startswith("/"):
            return []  # weights baked into the image
        return [
            f"model.path {model.path!r} is a Hugging Face id and there is no model volume: "
            f"SGLang downloads the weights into the container's writable layer at every engine "
            f"start (a kubelet gives a restarted container a new layer), the bytes are in no "
            f"resource request, and a gated model needs a token; put them on a volume "
            f"(model.volume, e.g. a PVC filled once) and use a path under its mountPath"
        ]
    mount = model.mount_path.rstrip("/") or "/"
    path = model.path
    if path.startswith("/"):
        if path.rstrip("/") != mount and not path.startswith(mount + "/"):
            return [
                f"model.path {path} is outside the model volume's mountPath {mount}: SGLang "
                f"will not load the weights from the volume (use a path under {mount}/)"
            ]
        return []
    return [
        f"model.path {path!r} is not an absolute path, so SGLang treats it as a Hugging Face "
        f"model id and downloads it; the model volume mounted at {mount} is not used (use a "
        f"path under {mount}/ to serve the weights on the volume)"
    ]


def duplicates(values: Iterable[Any]) -> list[Any]:
    seen: set[Any] = set()
    out: list[Any] = []
    for value in values:
        if value in seen and value not in out:
            out.append(value)
        seen.add(value)
    return out
