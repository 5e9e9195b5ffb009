"""The last gate before anything is applied: every built object, checked as the API server would.

``plan()`` runs this over all objects it built and raises ``SpecError`` when one would be
refused, so a reconcile never creates the ConfigMap and Services and then gets a 422 for the
StatefulSet. The spec-level checks (``k8s_checks.check_pod_inputs``) name CR fields; what this
module finds points at the built object (``StatefulSet/x spec.template...``), because it can
only be reached by input no spec check covers. The rules are the subset of the API server's
validation (apimachinery names and labels, core/v1 pod spec, apps/v1, policy/v1) that the
operator's objects can violate: names, labels, container and volume names, mounts, ports,
env names, quantities, scheduling fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..api.quantity import QuantityError, parse_bytes
from .errors import Problems
from .k8s_checks import (
    check_labels,
    check_requirement,
    dns1123_label,
    dns1123_subdomain,
    duplicates,
    env_name,
    qualified_name,
)

Obj = Mapping[str, Any]
_SERVICE_PORT_NAME_MAX = 15


def check_objects(objects: Sequence[Obj], problems: Problems) -> None:
    for obj in objects:
        where = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        _metadata(obj, where, problems)
        spec = obj.get("spec") or {}
        if obj.get("kind") == "StatefulSet":
            template = spec.get("template") or {}
            check_labels((template.get("metadata") or {}).get("labels") or {},
                         f"{where} spec.template.metadata.labels", problems)
            _selector_matches(spec, template, where, problems)
            claims = [c.get("metadata", {}).get("name", "")
                      for c in spec.get("volumeClaimTemplates") or []]
            _pod_spec(template.get("spec") or {}, f"{where} spec.template.spec", claims,
                      problems)
            for i, claim in enumerate(spec.get("volumeClaimTemplates") or []):
                _quantity(((claim.get("spec") or {}).get("resources") or {}).get("requests", {})
                          .get("storage"), f"{where} spec.volumeClaimTemplates[{i}] storage",
                          problems)
        elif obj.get("kind") == "Service":
            check_labels(spec.get("selector") or {}, f"{where} spec.selector", problems)
            _ports(spec.get("ports") or [], "port", f"{where} spec.ports", problems)
        elif obj.get("kind") == "PodDisruptionBudget":
            labels = (spec.get("selector") or {}).get("matchLabels") or {}
            check_labels(labels, f"{where} spec.selector.matchLabels", problems)


def _metadata(obj: Obj, where: str, problems: Problems) -> None:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    why = dns1123_label(name) if obj.get("kind") == "Service" else dns1123_subdomain(name)
    if why:
        problems.add(f"{where} metadata.name", f"{name!r} {why}")
    check_labels(meta.get("labels") or {}, f"{where} metadata.labels", problems)
    for key in (meta.get("annotations") or {}):
        why = qualified_name(key)
        if why:
            problems.add(f"{where} metadata.annotations", f"{key!r}: {why}")


def _selector_matches(spec: Obj, template: Obj, where: str, problems: Problems) -> None:
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        problems.add(f"{where} spec.selector", "does not match the pod template's labels")


def _quantity(value: Any, where: str, problems: Problems) -> None:
    try:
        parse_bytes(value, field=where)
    except QuantityError as exc:
        problems.add(where, str(exc))


def _ports(ports: Sequence[Obj], key: str, where: str, problems: Problems) -> None:
    for i, port in enumerate(ports):
        number = port.get(key)
        if not isinstance(number, int) or not 1 <= number <= 65535:
            problems.add(f"{where}[{i}].{key}", f"{number!r} is not a port number 1-65535")
        name = port.get("name")
        if name is not None and (len(name) > _SERVICE_PORT_NAME_MAX or dns1123_label(name)):
            problems.add(f"{where}[{i}].name", f"{name!r} must be an IANA service name "
                         f"(at most {_SERVICE_PORT_NAME_MAX} lower-case letters, digits, '-')")
    for name in duplicates(p.get("name") for p in ports if p.get("name")):
        problems.add(where, f"port name {name!r} is used twice")


def _pod_spec(pod: Obj, where: str, claims: Sequence[str], problems: Problems) -> None:
    volumes = pod.get("volumes") or []
    names = [v.get("name", "") for v in volumes]
    for name in names:
        why = dns1123_label(name)
        if why:
            problems.add(f"{where}.volumes", f"volume name {name!r} {why}")
    for name in duplicates([*names, *claims]):
        problems.add(f"{where}.volumes", f"volume name {name!r} is used twice")
    for i, vol in enumerate(volumes):
        sources = [k for k in vol if k != "name"]
        if len(sources) != 1:
            problems.add(f"{where}.volumes[{i}]", f"must have exactly one source, has {sources}")
    mountable = set(names) | set(claims)  # volumeClaimTemplates are volumes of the pod too
    containers = [(f"{where}.initContainers[{i}]", c)
                  for i, c in enumerate(pod.get("initContainers") or [])]
    containers += [(f"{where}.containers[{i}]", c) for i, c in enumerate(pod.get("containers")
                                                                         or [])]
    for name in duplicates(c.get("name") for _, c in containers):
        problems.add(where, f"container name {name!r} is used twice")
    for cwhere, container in containers:
        _container(container, cwhere, mountable, problems)
    check_labels(pod.get("nodeSelector") or {}, f"{where}.nodeSelector", problems)
    if pod.get("priorityClassName") is not None:
        why = dns1123_subdomain(str(pod["priorityClassName"]))
        if why:
            problems.add(f"{where}.priorityClassName", f"{pod['priorityClassName']!r} {why}")
    node_affinity = (pod.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for t, term in enumerate(required.get("nodeSelectorTerms") or []):
        for e, req in enumerate(term.get("matchExpressions") or []):
            check_requirement(req.get("key", ""), req.get("operator", ""), req.get("values"),
                              f"{where}.affinity.nodeAffinity.required.nodeSelectorTerms[{t}]"
                              f".matchExpressions[{e}]", problems)
    for i, tol in enumerate(pod.get("tolerations") or []):
        if tol.get("operator") == "Exists" and tol.get("value"):
            problems.add(f"{where}.tolerations[{i}].value", "must be empty for operator Exists")


def _container(container: Obj, where: str, volumes: set[str], problems: Problems) -> None:
    why = dns1123_label(str(container.get("name") or ""))
    if why:
        problems.add(f"{where}.name", f"{container.get('name')!r} {why}")
    _ports(container.get("ports") or [], "containerPort", f"{where}.ports", problems)
    env = container.get("env") or []
    for i, var in enumerate(env):
        why = env_name(str(var.get("name") or ""))
        if why:
            problems.add(f"{where}.env[{i}].name", f"{var.get('name')!r} {why}")
        if "value" in var and "valueFrom" in var:
            problems.add(f"{where}.env[{i}]", "sets both value and valueFrom")
    mounts = container.get("volumeMounts") or []
    for i, mount in enumerate(mounts):
        if mount.get("name") not in volumes:
            problems.add(f"{where}.volumeMounts[{i}].name",
                         f"{mount.get('name')!r} is not a volume of the pod")
        path = str(mount.get("mountPath") or "")
        if not path.startswith("/") or ":" in path:
            problems.add(f"{where}.volumeMounts[{i}].mountPath",
                         f"{path!r} must be an absolute path without ':'")
    for path in duplicates(m.get("mountPath") for m in mounts):
        problems.add(f"{where}.volumeMounts", f"mountPath {path!r} is used twice "
                     "(the API server requires unique mount paths)")
    resources = container.get("resources") or {}
    for part in ("requests", "limits"):
        for name, value in (resources.get(part) or {}).items():
            if name != "cpu":
                _quantity(value, f"{where}.resources.{part}[{name}]", problems)
