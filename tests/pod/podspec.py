"""What a kubelet derives from a pod spec before it starts anything (pure functions).

Kubernetes semantics followed (v1.33 API docs): ``envFrom`` first, then ``env`` (later entries
win; ``$(VAR)`` references expand against earlier ones, and in ``command`` and ``args`` against
the container's spec environment); downward-API ``fieldRef`` and
``resourceFieldRef``; probe defaults (``timeoutSeconds`` 1, ``periodSeconds`` 10,
``successThreshold`` 1, ``failureThreshold`` 3, ``initialDelaySeconds`` 0); native sidecars are
init containers with ``restartPolicy: Always``; named ports resolve against the container's own
``ports``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6,
          "G": 10**9, "T": 10**12}


def parse_quantity(q: str | int) -> int:
    """A Kubernetes quantity as an integer (bytes, or cores for whole CPUs)."""
    s = str(q)
    m = re.fullmatch(r"(\d+)([KMGT]i|[kMGT])?", s)
    if not m:
        raise ValueError(f"unsupported quantity {q!r}")
    return int(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


@dataclass(frozen=True)
class PodMeta:
    name: str
    namespace: str
    uid: str = "00000000-0000-4000-8000-000000000001"
    node_name: str = "mi355x-node-0"
    pod_ip: str = "127.0.0.1"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


_FIELDS = {
    "metadata.name": lambda m: m.name, "metadata.namespace": lambda m: m.namespace,
    "metadata.uid": lambda m: m.uid, "spec.nodeName": lambda m: m.node_name,
    "status.podIP": lambda m: m.pod_ip, "status.hostIP": lambda m: m.pod_ip,
}


def _expand(value: str, env: dict[str, str]) -> str:
    # $(VAR) expands when VAR is defined earlier; $$(VAR) is a literal $(VAR).
    def sub(m: re.Match[str]) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$?\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)


def container_env(container: dict[str, Any], configmaps: dict[str, dict[str, str]],
                  meta: PodMeta) -> dict[str, str]:
    """The environment the container's process gets from its spec (image env not included)."""
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        ref = src.get("configMapRef")
        if ref is None:
            raise NotImplementedError(f"envFrom source {src} (only configMapRef)")
        data = configmaps.get(ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise LookupError(f"configmap {ref['name']!r} not found (CreateContainerConfigError)")
        prefix = src.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = _expand(str(var["value"]), env)
        elif "valueFrom" in var:
            env[name] = _value_from(var["valueFrom"], container, configmaps, meta)
        else:
            env[name] = ""
    return env


def command_line(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The container's command and args as the kubelet runs them: ``$(VAR)`` expanded from the
    environment its spec defines (``env``: :func:`container_env`; the image's ENV takes no
    part), an undefined reference left as written, ``$$(VAR)`` a literal ``$(VAR)``."""
    return [_expand(str(a), env) for a in (*container.get("command", []),
                                           *container.get("args", []))]


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(path: str, meta: PodMeta) -> str:
    """A downward-API ``fieldRef`` as the kubelet resolves it when the container starts (a
    missing label or annotation is the empty string)."""
    sub = _SUBSCRIPT.match(path)
    if sub is not None:
        values = meta.labels if sub.group(1) == "labels" else meta.annotations
        return str(values.get(sub.group(2), ""))
    if path not in _FIELDS:
        raise NotImplementedError(f"fieldRef {path}")
    return str(_FIELDS[path](meta))


def _value_from(src: dict[str, Any], container: dict[str, Any],
                configmaps: dict[str, dict[str, str]], meta: PodMeta) -> str:
    if "fieldRef" in src:
        return field_value(src["fieldRef"]["fieldPath"], meta)
    if "resourceFieldRef" in src:
        ref = src["resourceFieldRef"]
        kind, _, res = ref["resource"].partition(".")
        raw = container.get("resources", {}).get(kind, {}).get(res)
        if raw is None:
            raise LookupError(f"resourceFieldRef {ref['resource']} is not set")
        divisor = parse_quantity(ref.get("divisor", "1"))
        return str(-(-parse_quantity(raw) // divisor))
    if "configMapKeyRef" in src:
        ref = src["configMapKeyRef"]
        return configmaps[ref["name"]][ref["key"]]
    raise NotImplementedError(f"valueFrom {sorted(src)}")


@dataclass(frozen=True)
class Probe:
    """A probe with Kubernetes' defaults filled in."""

    kind: str  # httpGet | exec | tcpSocket
    target: dict[str, Any]
    initial_delay_s: float
    period_s: float
    timeout_s: float
    success_threshold: int
    failure_threshold: int


def probe(container: dict[str, Any], name: str) -> Probe | None:
    spec = container.get(name)
    if spec is None:
        return None
    kinds = [k for k in ("httpGet", "exec", "tcpSocket", "grpc") if k in spec]
    if len(kinds) != 1:
        raise ValueError(f"{container['name']}.{name}: exactly one handler, got {kinds}")
    return Probe(kind=kinds[0], target=spec[kinds[0]],
                 initial_delay_s=spec.get("initialDelaySeconds", 0),
                 period_s=spec.get("periodSeconds", 10), timeout_s=spec.get("timeoutSeconds", 1),
                 success_threshold=spec.get("successThreshold", 1),
                 failure_threshold=spec.get("failureThreshold", 3))


def hook(handler: dict[str, Any], grace_s: float) -> Probe:
    """A lifecycle hook (``preStop``) as a one-shot probe bounded by the grace period."""
    kinds = [k for k in ("exec", "httpGet", "sleep") if k in handler]
    if kinds == ["sleep"]:  # the kubelet's own sleep action (no binary in the image)
        seconds = min(float(handler["sleep"]["seconds"]), grace_s)
        return Probe(kind="exec", target={"command": ["/bin/sleep", f"{seconds:g}"]},
                     initial_delay_s=0, period_s=0, timeout_s=grace_s, success_threshold=1,
                     failure_threshold=1)
    if kinds != ["exec"]:
        raise NotImplementedError(f"lifecycle handler {sorted(handler)} (only exec, sleep)")
    return Probe(kind="exec", target=handler["exec"], initial_delay_s=0, period_s=0,
                 timeout_s=grace_s, success_threshold=1, failure_threshold=1)


def resolve_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise LookupError(f"{container['name']}: no port named {port!r}")


def containers_in_start_order(pod_spec: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(container, role): init containers in order (role ``sidecar`` for restartPolicy Always,
    else ``init``), then the app containers (role ``app``)."""
    out = [(c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
           for c in pod_spec.get("initContainers", [])]
    return out + [(c, "app") for c in pod_spec["containers"]]


def memory_limit(container: dict[str, Any]) -> int | None:
    raw = container.get("resources", {}).get("limits", {}).get("memory")
    return None if raw is None else parse_quantity(raw)


def cpu_request(container: dict[str, Any]) -> int:
    """Whole CPUs the container is guaranteed (its limit; 1 when unset or fractional)."""
    raw = container.get("resources", {}).get("limits", {}).get("cpu")
    try:
        return max(1, parse_quantity(raw)) if raw is not None else 1
    except ValueError:
        return 1


def hugepages(container: dict[str, Any]) -> dict[int, int]:
    """page size -> bytes requested (requests == limits for hugepages)."""
    out: dict[int, int] = {}
    for res, raw in container.get("resources", {}).get("limits", {}).items():
        if res.startswith("hugepages-"):
            out[parse_quantity(res.removeprefix("hugepages-"))] = parse_quantity(raw)
    return out


def gpus(container: dict[str, Any], resource: str = "amd.com/gpu") -> int:
    return int(container.get("resources", {}).get("limits", {}).get(resource, 0))
