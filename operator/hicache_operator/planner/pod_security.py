"""Pod Security Admission: what a namespace's ``pod-security.kubernetes.io/enforce`` level admits.

Pure. The built-in admission plugin refuses to create a pod that violates the namespace's
enforced level (``403``; the StatefulSet then reports ``FailedCreate`` and the CR would wait for
pods that never come). :func:`check_pod` evaluates a pod spec against a level with the checks of
the Pod Security Standards (k8s.io/pod-security-admission ``policy/check_*.go``, version
"latest"):

baseline
    no host namespaces (``hostNetwork``, ``hostPID``, ``hostIPC``); no ``privileged``
    container; capabilities added only from :data:`BASELINE_CAPABILITIES`; no ``hostPath``
    volume; no ``hostPort``; AppArmor ``RuntimeDefault``/``Localhost`` (field or annotation);
    SELinux type among :data:`SELINUX_TYPES`, no user or role; ``procMount`` Default; seccomp
    not ``Unconfined``; only the safe sysctls; no Windows ``hostProcess``.
restricted
    baseline, plus volumes only of :data:`RESTRICTED_VOLUMES`; every container
    ``allowPrivilegeEscalation: false``; ``runAsNonRoot: true`` (pod, or every container) and
    none false; no ``runAsUser: 0``; seccomp ``RuntimeDefault``/``Localhost`` (pod, or every
    container); every container drops ``ALL`` and adds at most ``NET_BIND_SERVICE``.

The planner renders what the level admits where it can (capabilities it adds for itself,
:func:`admitted_capabilities`) and refuses the rest with what the namespace must allow.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .errors import Problems

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
Level = Literal["privileged", "baseline", "restricted"]
LEVELS: tuple[Level, ...] = ("privileged", "baseline", "restricted")
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes"})
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret", "image"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


@dataclass(frozen=True)
class Violation:
    check: str  # the standard's control, e.g. "capabilities"
    where: str  # the pod spec field, e.g. "containers[engine].securityContext.capabilities"
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.where}: {self.detail}"


def parse_level(value: str | None) -> Level | None:
    """The level a namespace label names; ``None`` for an unknown value (the plugin then
    enforces restricted, and says the label is invalid)."""
    if value is None or value == "":
        return "privileged"
    return value if value in LEVELS else None


def admitted_capabilities(level: Level) -> frozenset[str] | None:
    """Capabilities a container may add at ``level`` (``None``: any)."""
    if level == "baseline":
        return BASELINE_CAPABILITIES
    if level == "restricted":
        return RESTRICTED_CAPABILITIES
    return None


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            yield f"{field}[{c.get('name', '')}]", c


def _ctx(c: Mapping[str, Any]) -> Mapping[str, Any]:
    return c.get("securityContext") or {}


def check_pod(pod_spec: Mapping[str, Any], level: Level,
              annotations: Mapping[str, str] | None = None) -> list[Violation]:
    """Every violation of ``level`` by a pod with this spec (and annotations); empty: admitted."""
    if level == "privileged":
        return []
    out = _baseline(pod_spec, annotations or {})
    if level == "restricted":  # its capability rule is stricter than baseline's: not both
        out = [v for v in out if v.check != "capabilities"] + _restricted(pod_spec)
    return out


def least_level(pod_spec: Mapping[str, Any],
                annotations: Mapping[str, str] | None = None) -> Level:
    """The most restrictive level that admits the pod."""
    for level in ("restricted", "baseline"):
        if not check_pod(pod_spec, level, annotations):
            return level
    return "privileged"


def _baseline(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> list[Violation]:
    out: list[Violation] = []
    psc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(Violation("host namespaces", field, "must not be true"))
    for where, c in _containers(spec):
        sc = _ctx(c)
        if sc.get("privileged"):
            out.append(Violation("privileged", f"{where}.securityContext.privileged",
                                 "must not be true"))
        added = [str(a) for a in (sc.get("capabilities") or {}).get("add") or []]
        extra = [a for a in added if a not in BASELINE_CAPABILITIES]
        if extra:
            out.append(Violation("capabilities", f"{where}.securityContext.capabilities.add",
                                 f"{', '.join(extra)} beyond the baseline set"))
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(Violation("host ports", f"{where}.ports", f"hostPort "
                                     f"{port['hostPort']}"))
        if sc.get("procMount") not in (None, "Default"):
            out.append(Violation("procMount", f"{where}.securityContext.procMount",
                                 "must be Default"))
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            out.append(Violation("hostPath volumes", f"volumes[{v.get('name', '')}]",
                                 f"hostPath {v['hostPath'].get('path', '')}"))
    for key, value in annotations.items():
        if key.startswith(_APPARMOR_ANNOTATION) and value != "runtime/default" \
                and not value.startswith("localhost/"):
            out.append(Violation("AppArmor", f"annotations[{key}]", f"{value}"))
    contexts = [("securityContext", psc)] + [(f"{w}.securityContext", _ctx(c))
                                             for w, c in _containers(spec)]
    for where, sc in contexts:
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            out.append(Violation("AppArmor", f"{where}.appArmorProfile", f"type {apparmor}"))
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") \
                or selinux.get("role"):
            out.append(Violation("SELinux", f"{where}.seLinuxOptions",
                                 "type must be a container type; user and role unset"))
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(Violation("seccomp", f"{where}.seccompProfile", "Unconfined"))
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(Violation("hostProcess", f"{where}.windowsOptions.hostProcess",
                                 "must not be true"))
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(Violation("sysctls", "securityContext.sysctls",
                                 f"{sysctl.get('name')} is not a safe sysctl"))
    return out


def _restricted(spec: Mapping[str, Any]) -> list[Violation]:
    out: list[Violation] = []
    psc = spec.get("securityContext") or {}
    for v in spec.get("volumes") or []:
        kind = next((k for k in v if k != "name"), "")
        if kind not in RESTRICTED_VOLUMES:
            out.append(Violation("volume types", f"volumes[{v.get('name', '')}]",
                                 f"{kind} is not allowed"))
    if psc.get("runAsNonRoot") is False:
        out.append(Violation("runAsNonRoot", "securityContext.runAsNonRoot", "must be true"))
    if psc.get("runAsUser") == 0:
        out.append(Violation("runAsUser", "securityContext.runAsUser", "must not be 0"))
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for where, c in _containers(spec):
        sc = _ctx(c)
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(Violation("allowPrivilegeEscalation",
                                 f"{where}.securityContext.allowPrivilegeEscalation",
                                 "must be false"))
        nonroot = sc.get("runAsNonRoot")
        if nonroot is False or (nonroot is None and psc.get("runAsNonRoot") is not True):
            out.append(Violation("runAsNonRoot", f"{where}.securityContext.runAsNonRoot",
                                 "must be true (here or in the pod's securityContext)"))
        if sc.get("runAsUser") == 0:
            out.append(Violation("runAsUser", f"{where}.securityContext.runAsUser",
                                 "must not be 0"))
        if (sc.get("seccompProfile") or {}).get("type", pod_seccomp) not in (
                "RuntimeDefault", "Localhost"):
            out.append(Violation("seccomp", f"{where}.securityContext.seccompProfile",
                                 "must be RuntimeDefault or Localhost"))
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(Violation("capabilities", f"{where}.securityContext.capabilities.drop",
                                 "must include ALL"))
        extra = [str(a) for a in caps.get("add") or [] if a not in RESTRICTED_CAPABILITIES]
        if extra:
            out.append(Violation("capabilities", f"{where}.securityContext.capabilities.add",
                                 f"{', '.join(extra)} beyond NET_BIND_SERVICE"))
    return out


def resolve_level(label: str | None) -> tuple[Level, list[str]]:
    """The level to render for, from the namespace's enforce label, and a warning for a value
    the plugin does not know (it then enforces restricted)."""
    level = parse_level(label)
    if level is not None:
        return level, []
    return "restricted", [
        f"Pod Security: the namespace's {ENFORCE_LABEL} label {label!r} is not a level "
        f"(privileged, baseline, restricted); the admission plugin enforces restricted, and "
        f"the pods are rendered for it"]


#: What each control needs from the namespace, for the user (the CR's status).
_WHY = {
    "capabilities": "the capabilities the CR asks for (spec.security.capabilities)",
    "hostPath volumes": "a hostPath volume (spec.l3.ssd.volume.hostPath or spec.model.volume)",
    "host namespaces": "host namespaces (spec.security.hostIPC / hostNetwork)",
    "privileged": "a privileged engine (spec.security.privileged)",
    "volume types": "a volume type restricted does not allow (spec.model.volume)",
    "runAsNonRoot": "an engine identity without runAsNonRoot (the chart's "
                    "operatorConfig.enginePodSecurity)",
    "runAsUser": "an engine run as root (operatorConfig.enginePodSecurity.runAsUser 0)",
}


def check_pod_security(objects: list[dict[str, Any]], namespace: str, level: Level,
                       problems: Problems) -> None:
    """Each workload's pod template against ``level``: a problem per workload that the
    admission plugin would refuse, naming the level it needs and what needs it."""
    if level == "privileged":
        return
    for obj in objects:
        template = (obj.get("spec") or {}).get("template")
        if obj.get("kind") not in ("StatefulSet", "Deployment") or not template:
            continue
        meta = template.get("metadata") or {}
        found = check_pod(template.get("spec") or {}, level, meta.get("annotations"))
        if not found:
            continue
        need = least_level(template.get("spec") or {}, meta.get("annotations"))
        causes = sorted({_WHY.get(v.check, v.check) for v in found})
        problems.add(
            f"metadata.namespace ({namespace})",
            f"namespace {namespace} enforces Pod Security level {level} ({ENFORCE_LABEL}), "
            f"which would refuse every pod of {obj['kind']} {obj['metadata']['name']}: "
            f"{'; '.join(str(v) for v in found)}. It needs {', '.join(causes)}: label the "
            f"namespace {ENFORCE_LABEL}={need}, or change the CR (or the operator's "
            f"configuration) so it needs none of them; nothing was created")
