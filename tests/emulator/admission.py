"""Pod Security Admission, as the API server's built-in plugin enforces it on pod creation.

The namespace's ``pod-security.kubernetes.io/enforce`` label (``privileged`` | ``baseline`` |
``restricted``; absent: privileged) selects the level; a pod that violates it is refused with
``403 Forbidden`` and the plugin's message (``pods "x" is forbidden: violates PodSecurity
"baseline:latest": <check> (<detail>), ...``), so the StatefulSet controller records
``FailedCreate``. Written from Kubernetes' Pod Security Standards (``policy/check_*.go`` of
k8s.io/pod-security-admission, "latest"), independently of the operator's
``planner/pod_security.py``, so the operator's checker is tested against a second reading of
the rules, not against itself. Only pods are checked (the plugin checks workload templates in
warn/audit mode only). Exemptions and the ``enforce-version`` label are not modelled.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                  "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                 "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                 "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                 "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                 "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret", "image"}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                  "container_engine_t"}


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or []


def _sc(c: dict[str, Any]) -> dict[str, Any]:
    return c.get("securityContext") or {}


def violations(pod: dict[str, Any], level: str) -> list[str]:
    """The plugin's ``<check> (<detail>)`` strings for ``pod`` at ``level``; empty: admitted."""
    if level not in ("baseline", "restricted"):
        return []
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    meta = pod.get("metadata") or {}
    out: list[str] = []
    host = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if host:
        out.append(f"host namespaces ({', '.join(f'{f}=true' for f in host)})")
    priv = [c["name"] for c in _containers(spec) if _sc(c).get("privileged")]
    if priv:
        out.append(f"privileged (containers {priv} must not set privileged=true)")
    for c in _containers(spec):
        added = [str(a) for a in (_sc(c).get("capabilities") or {}).get("add") or []]
        bad = [a for a in added if a not in _BASELINE_CAPS]
        if bad:
            out.append(f'non-default capabilities (container "{c["name"]}" must not include '
                       f"{bad} in securityContext.capabilities.add)")
    paths = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if paths:
        out.append(f"hostPath volumes (volumes {paths})")
    ports = [p["hostPort"] for c in _containers(spec) for p in c.get("ports") or []
             if p.get("hostPort")]
    if ports:
        out.append(f"hostPort (hostPorts {ports})")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and \
                value != "runtime/default" and not value.startswith("localhost/"):
            out.append(f"forbidden AppArmor profile ({key}={value})")
    for where in (psc, *(_sc(c) for c in _containers(spec))):
        app = (where.get("appArmorProfile") or {}).get("type")
        if app not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"forbidden AppArmor profile (appArmorProfile.type={app})")
        se = where.get("seLinuxOptions") or {}
        if se.get("type", "") not in _SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"seLinuxOptions ({se})")
        if (where.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append("seccompProfile (type=Unconfined)")
        if where.get("windowsOptions", {}).get("hostProcess"):
            out.append("hostProcess (windowsOptions.hostProcess=true)")
    masked = [c["name"] for c in _containers(spec) if _sc(c).get("procMount") not in
              (None, "Default")]
    if masked:
        out.append(f"procMount (containers {masked} must not set procMount)")
    unsafe = [s.get("name") for s in psc.get("sysctls") or [] if s.get("name") not in
              _SAFE_SYSCTLS]
    if unsafe:
        out.append(f"forbidden sysctls ({unsafe})")
    if level == "restricted":
        out += _restricted(spec, psc)
    return out


def _restricted(spec: dict[str, Any], psc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    kinds = [next((k for k in v if k != "name"), "") for v in spec.get("volumes") or []]
    bad = sorted({k for k in kinds if k not in _RESTRICTED_VOLUMES})
    if bad:
        out.append(f"restricted volume types (volume types {bad} are not allowed)")
    containers = list(_containers(spec))
    escalate = [c["name"] for c in containers if _sc(c).get("allowPrivilegeEscalation")
                is not False]
    if escalate:
        out.append(f"allowPrivilegeEscalation != false (containers {escalate})")
    pod_nonroot = psc.get("runAsNonRoot")
    nonroot = [c["name"] for c in containers if _sc(c).get("runAsNonRoot") is False or
               (_sc(c).get("runAsNonRoot") is None and pod_nonroot is not True)]
    if pod_nonroot is False or nonroot:
        out.append(f"runAsNonRoot != true (containers {nonroot})")
    root = [c["name"] for c in containers if _sc(c).get("runAsUser") == 0]
    if psc.get("runAsUser") == 0 or root:
        out.append("runAsUser=0")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    unset = [c["name"] for c in containers
             if (_sc(c).get("seccompProfile") or {}).get("type", pod_seccomp)
             not in ("RuntimeDefault", "Localhost")]
    if unset:
        out.append(f"seccompProfile (containers {unset} must set RuntimeDefault or Localhost)")
    for c in containers:
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f'unrestricted capabilities (container "{c["name"]}" must drop ALL)')
        added = [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            out.append(f'unrestricted capabilities (container "{c["name"]}" must not add '
                       f"{added})")
    return out


def denial(pod: dict[str, Any], namespace: dict[str, Any] | None) -> str | None:
    """The 403 message for creating ``pod`` in ``namespace``, or None when it is admitted."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    found = violations(pod, level)
    if not found:
        return None
    name = (pod.get("metadata") or {}).get("name", "")
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": ' + \
        ", ".join(found)


def record_failed_create(store: Any, owner: dict[str, Any], message: str) -> None:
    """The workload controller's Warning Event ``FailedCreate`` on ``owner``, once per
    message (the real controllers' event recorder aggregates repeats into a count)."""
    events = store.find_type("", "v1", "events")
    meta = owner["metadata"]
    name = f"{meta['name']}.failedcreate.{abs(hash(message)) % 10**8:08d}"
    if ("", "events", meta["namespace"], name) in store.objects:
        return
    store.create(events, meta["namespace"], {"metadata": {"name": name}, "type": "Warning",
                 "reason": "FailedCreate", "message": message,
                 "involvedObject": {"apiVersion": owner.get("apiVersion", ""),
                                    "kind": owner.get("kind", ""), "name": meta["name"],
                                    "namespace": meta["namespace"], "uid": meta.get("uid", "")}})
