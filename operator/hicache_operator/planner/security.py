"""Security contexts and the admin policy gate (DESIGN §9).

A namespace user who may create an SGLangHiCache must not gain more than with a plain pod:
privileged mode, host namespaces, extra capabilities and hostPath mounts come only from the
admin policy (chart values). Engines drop every capability except those granted (IPC_LOCK by
default, for pinned host memory), run with ``seccompProfile: RuntimeDefault`` and
``allowPrivilegeEscalation: false`` — the ROCm device plugin hands ``/dev/kfd`` and
``/dev/dri/renderD*`` to non-privileged containers, so GPUs need no privilege.
"""

from __future__ import annotations

import re
from typing import Any

from ..api.config import AdminPolicy, EnginePodSecurity
from ..api.spec import MODEL_VOLUME_KINDS, SGLangHiCacheSpec
from .errors import Problems
from .ssd import host_path_allowed

DEFAULT_CAPABILITY = "IPC_LOCK"
_CAPABILITY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")

def normalise_capability(name: str) -> str:
    name = name.strip().upper()
    return name[4:] if name.startswith("CAP_") else name


def granted_capabilities(spec: SGLangHiCacheSpec, policy: AdminPolicy) -> list[str]:
    allowed = {normalise_capability(c) for c in policy.allowed_capabilities}
    caps = [DEFAULT_CAPABILITY] if DEFAULT_CAPABILITY in allowed else []
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


def engine_security_context(spec: SGLangHiCacheSpec, policy: AdminPolicy) -> dict[str, Any]:
    caps = granted_capabilities(spec, policy)
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


def security_warnings(spec: SGLangHiCacheSpec, policy: AdminPolicy) -> list[str]:
    out: list[str] = []
    caps = granted_capabilities(spec, policy)
    if DEFAULT_CAPABILITY not in caps:
        out.append(
            "IPC_LOCK is not granted (admin policy): pinning the host pool for GPU "
            "transfers may fail or fall back to pageable copies"
        )
    if spec.hi_cache.host_allocator.numa == "auto" and "SYS_NICE" not in caps:
        out.append(
            "NUMA binding (numa: auto) uses mbind/set_mempolicy, which container "
            "runtimes' RuntimeDefault seccomp profiles allow only with CAP_SYS_NICE; "
            "request SYS_NICE in spec.security.capabilities (the admin policy must allow "
            "it) or the launcher cannot bind pools to the GPU's NUMA node"
        )
    if (
        spec.l3.ssd.enabled
        and spec.l3.ssd.io_backend == "io_uring"
        and not spec.l3.ssd.allow_posix_fallback
    ):
        out.append(
            "SSD io_uring: recent RuntimeDefault seccomp profiles block io_uring "
            "syscalls; the launcher fails unless allowPosixFallback is true (unverified "
            "per runtime)"
        )
    return out
