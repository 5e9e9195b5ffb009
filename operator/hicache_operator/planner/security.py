"""Security contexts and the admin policy gate (DESIGN §9).

A namespace user who may create an SGLangHiCache must not gain more than with a plain pod:
privileged mode, host namespaces, extra capabilities and hostPath mounts come only from the
admin policy (chart values). Engines drop every capability except those granted, run with
``seccompProfile: RuntimeDefault`` and ``allowPrivilegeEscalation: false`` — the ROCm device
plugin hands ``/dev/kfd`` and ``/dev/dri/renderD*`` to non-privileged containers, so GPUs need
no privilege (only the device files' group, see ``enginePodSecurity.supplementalGroups``).

What a granted capability does for the engine, which runs as uid 10001: Kubernetes gives a
non-root process no ambient capabilities (kubernetes/kubernetes#56374), so added capabilities
only enter its bounding set and it never holds one. They still matter to the runtime:
containerd's RuntimeDefault seccomp profile is generated from the configured capabilities, and
it allows ``mbind``/``set_mempolicy``/``get_mempolicy`` only when ``SYS_NICE`` is among them.
So ``SYS_NICE`` is requested by default with ``numa: auto`` where the admin policy allows it
(per-rank NUMA binding works), and ``IPC_LOCK`` (granted by default where allowed) has an
effect only for an engine run as root.
"""

from __future__ import annotations

import re
from typing import Any

from ..api.config import AdminPolicy, EnginePodSecurity
from ..api.spec import MODEL_VOLUME_KINDS, SGLangHiCacheSpec
from .errors import Problems
from .pod_security import Level, admitted_capabilities
from .ssd import host_path_allowed

DEFAULT_CAPABILITY = "IPC_LOCK"
NUMA_CAPABILITY = "SYS_NICE"
_CAPABILITY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def normalise_capability(name: str) -> str:
    name = name.strip().upper()
    return name[4:] if name.startswith("CAP_") else name


def granted_capabilities(spec: SGLangHiCacheSpec, policy: AdminPolicy,
                         level: Level = "privileged") -> list[str]:
    """What the engine adds: IPC_LOCK and (numa: auto) SYS_NICE where the admin policy allows
    them, and the CR's own list. The two the operator adds for itself are left out where the
    namespace's Pod Security level refuses them (``pod_security``): IPC_LOCK does nothing for
    the non-root engine, and without SYS_NICE NUMA binding is reported degraded (warned);
    capabilities the CR asks for are kept, and a level that refuses them is reported."""
    allowed = {normalise_capability(c) for c in policy.allowed_capabilities}
    admitted = admitted_capabilities(level)
    caps = [DEFAULT_CAPABILITY] if DEFAULT_CAPABILITY in allowed else []
    if spec.hi_cache.host_allocator.numa == "auto" and NUMA_CAPABILITY in allowed:
        caps.append(NUMA_CAPABILITY)
    if admitted is not None:
        caps = [c for c in caps if c in admitted]
    for c in spec.security.capabilities:
        n = normalise_capability(c)
        if n in allowed and n not in caps:
            caps.append(n)
    return caps


def check_security(spec: SGLangHiCacheSpec, policy: AdminPolicy, problems: Problems) -> None:
    sec = spec.security
    allowed = sorted({normalise_capability(c) for c in policy.allowed_capabilities})
    for i, cap in enumerate(sec.capabilities):
        n = normalise_capability(cap)
        if not _CAPABILITY_RE.match(n):
            problems.add(f"spec.security.capabilities[{i}]", f"{cap!r} is not a capability name")
        elif n not in allowed:
            problems.add(
                f"spec.security.capabilities[{i}]",
                f"{n} is not in the admin policy's allowedCapabilities "
                f"({', '.join(allowed) or 'none'})",
            )
    for flag, path, permitted in (
        (sec.privileged, "spec.security.privileged", policy.allow_privileged),
        (sec.host_ipc, "spec.security.hostIPC", policy.allow_host_ipc),
        (sec.host_network, "spec.security.hostNetwork", policy.allow_host_network),
    ):
        if flag and not permitted:
            problems.add(path, "not allowed by the operator's admin policy")
    if spec.placement.gpu_model not in policy.allowed_gpu_models:
        problems.add(
            "spec.placement.gpuModel",
            f"{spec.placement.gpu_model} is not in the admin policy's allowedGpuModels "
            f"({', '.join(policy.allowed_gpu_models) or 'none'})",
        )
    _check_model_volume(spec, policy, problems)


def _check_model_volume(spec: SGLangHiCacheSpec, policy: AdminPolicy, problems: Problems) -> None:
    vol = spec.model.volume
    if vol is None:
        return
    path = "spec.model.volume"
    kinds = vol.kinds()
    if len(kinds) != 1:
        problems.add(
            path,
            f"must hold exactly one volume source of {', '.join(MODEL_VOLUME_KINDS)} "
            f"(got {', '.join(kinds) or 'none'})",
        )
        return
    if vol.host_path is not None:
        host = vol.host_path.path
        if not host.startswith("/"):
            problems.add(f"{path}.hostPath.path", "must be an absolute path")
        elif not host_path_allowed(host, policy.allowed_host_path_prefixes):
            problems.add(
                f"{path}.hostPath.path",
                f"{host!r} is not under a hostPath prefix the admin policy allows "
                f"(allowedHostPathPrefixes: "
                f"{', '.join(policy.allowed_host_path_prefixes) or 'none'})",
            )


def pod_security_context(identity: EnginePodSecurity) -> dict[str, Any]:
    """seccomp RuntimeDefault plus the admin-configured identity (operator configuration
    ``enginePodSecurity``): runAsNonRoot, runAsUser/Group, supplementalGroups (the hosts'
    GPU device groups) and fsGroup (write access to the SSD volume for a non-root engine)."""
    ctx: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if identity.run_as_non_root:
        ctx["runAsNonRoot"] = True
    if identity.run_as_user is not None:
        ctx["runAsUser"] = identity.run_as_user
    if identity.run_as_group is not None:
        ctx["runAsGroup"] = identity.run_as_group
    if identity.supplemental_groups:
        ctx["supplementalGroups"] = list(identity.supplemental_groups)
    if identity.fs_group is not None:
        ctx["fsGroup"] = identity.fs_group
        # Large SSD volumes: chown/chmod only when the volume root is not already right.
        ctx["fsGroupChangePolicy"] = "OnRootMismatch"
    return ctx


def engine_security_context(spec: SGLangHiCacheSpec, policy: AdminPolicy,
                            caps: list[str]) -> dict[str, Any]:
    """``caps``: :func:`granted_capabilities` for the namespace's level."""
    ctx: dict[str, Any] = {
        "capabilities": {"drop": ["ALL"], **({"add": caps} if caps else {})},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if spec.security.privileged and policy.allow_privileged:
        ctx["privileged"] = True  # privileged implies privilege escalation
    else:
        ctx["allowPrivilegeEscalation"] = False
    return ctx


def sidecar_security_context(capabilities: list[str]) -> dict[str, Any]:
    return {
        "capabilities": {"drop": ["ALL"], **({"add": capabilities} if capabilities else {})},
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def security_warnings(spec: SGLangHiCacheSpec, policy: AdminPolicy,
                      identity: EnginePodSecurity | None = None,
                      level: Level = "privileged") -> list[str]:
    out: list[str] = []
    caps = granted_capabilities(spec, policy, level)
    by_policy = granted_capabilities(spec, policy)
    dropped = [c for c in by_policy if c not in caps]
    if dropped:
        out.append(
            f"Pod Security: the namespace enforces level {level} "
            f"(pod-security.kubernetes.io/enforce), which refuses the capabilities "
            f"{', '.join(dropped)}: not added (IPC_LOCK does nothing for a non-root engine; "
            f"without SYS_NICE the NUMA binding below is degraded)")
    root_engine = identity is not None and identity.run_as_user == 0
    if DEFAULT_CAPABILITY not in caps and root_engine:
        out.append(
            "IPC_LOCK is not granted (admin policy): the root engine cannot mlock beyond "
            "RLIMIT_MEMLOCK"
        )
    if spec.hi_cache.host_allocator.numa == "auto" and NUMA_CAPABILITY not in caps \
            and NUMA_CAPABILITY in by_policy:
        out.append(
            "NUMA placement degraded: numa: auto binds each rank's host pool to its GPU's "
            "NUMA node with mbind/set_mempolicy, which the RuntimeDefault seccomp profile "
            "allows only to containers configured with CAP_SYS_NICE, and the namespace's Pod "
            f"Security level {level} refuses SYS_NICE: the launcher will report "
            "numa_placement degraded and leave the pools unbound (label the namespace "
            "pod-security.kubernetes.io/enforce=privileged, or set hostAllocator.numa: none)")
    elif spec.hi_cache.host_allocator.numa == "auto" and NUMA_CAPABILITY not in caps:
        out.append(
            "NUMA placement degraded: numa: auto binds each rank's host pool to its GPU's "
            "NUMA node with mbind/set_mempolicy, which the RuntimeDefault seccomp profile "
            "allows only to containers configured with CAP_SYS_NICE, and the admin policy's "
            "allowedCapabilities do not list SYS_NICE: the launcher will report "
            "numa_placement degraded and leave the pools unbound (allow SYS_NICE in the "
            "chart's policy.allowedCapabilities, or set hostAllocator.numa: none)"
        )
    if (
        spec.l3.ssd.enabled
        and spec.l3.ssd.engine == "mori"  # the hicache engine never uses io_uring
        and spec.l3.mode == "embedded"
        and spec.l3.ssd.io_backend == "io_uring"
        and not spec.l3.ssd.allow_posix_fallback
    ):
        # Standalone: the umbp-ssd sidecar falls back to posix by itself (mori 1.2.4).
        out.append(
            "SSD io_uring: the pod runs under the RuntimeDefault seccomp profile, which "
            "refuses io_uring (containerd's profile has no io_uring syscall; the pod tier "
            "runs it): the launcher stops with SsdUnavailable; set l3.ssd.ioBackend: posix or "
            "allowPosixFallback: true"
        )
    return out
