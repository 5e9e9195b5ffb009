"""Can the engine use what the node gave it: the GPU device files and the NUMA memory policy.

GPUs: the AMD device plugin passes the host's ``/dev/kfd`` and ``/dev/dri/renderD*`` with the
host's owner and mode (typically ``root:render 0660``; the render gid differs between host OS
images). HIP opens ``/dev/kfd`` and each render node read-write; a process whose groups lack the
device's group sees no GPU at all, long after the launcher has started SGLang. The launcher opens
them the same way first and fails with the gid to add.

NUMA: containerd's and Docker's RuntimeDefault seccomp profiles allow ``mbind``,
``set_mempolicy`` and ``get_mempolicy`` only to containers configured with ``CAP_SYS_NICE``;
elsewhere they fail with ``EPERM`` and the host allocator can only log that placement is
degraded. The launcher asks the kernel once (``get_mempolicy``) and, when refused, says so in
its report instead of claiming per-rank placement.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Sequence

from .errors import LaunchError
from .gpus import Gpu
from .noderoot import NodeRoot

#: Where an admin sets the gids engine processes get (chart values; operator configuration).
SUPPLEMENTAL_GROUPS_FIELD = "enginePodSecurity.supplementalGroups"
_SYS_GET_MEMPOLICY = 239  # x86_64

Opener = Callable[[str, int], int]
MempolicyProbe = Callable[[], str | None]


def gpu_device_paths(gpus: Sequence[Gpu]) -> list[str]:
    """What HIP opens for these GPUs: ``/dev/kfd``, then each render node."""
    return ["/dev/kfd", *dict.fromkeys(f"/dev/dri/{g.render_node}" for g in gpus)]


def check_gpu_access(root: NodeRoot, gpus: Sequence[Gpu], opener: Opener = os.open) -> None:
    """Open every device file HIP needs read-write, as HIP does; raise ``GpuAccessDenied``
    naming the device's group and the setting that grants it."""
    for path in gpu_device_paths(gpus):
        host = str(root.path(path))
        try:
            os.close(opener(host, os.O_RDWR | os.O_CLOEXEC))
        except FileNotFoundError as e:
            raise LaunchError(
                "GpuDiscoveryFailed",
                f"{path} does not exist: the device plugin did not pass it (HIP needs /dev/kfd "
                f"and the render nodes of the pod's GPUs)") from e
        except PermissionError as e:
            st = os.stat(host)
            groups = sorted({os.getgid(), *os.getgroups()})
            raise LaunchError(
                "GpuAccessDenied",
                f"cannot open {path} read-write (owner {st.st_uid}:{st.st_gid}, mode "
                f"{st.st_mode & 0o777:04o}) as uid {os.getuid()} with groups "
                f"{', '.join(map(str, groups))}: HIP would see no GPU. Add gid {st.st_gid} "
                f"(the node's render group: getent group render) to the engine pods' "
                f"supplementalGroups, the operator's {SUPPLEMENTAL_GROUPS_FIELD} chart value"
            ) from e


def mempolicy_syscall_probe() -> str | None:
    """``None`` when this process may use the NUMA memory-policy syscalls, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    mode = ctypes.c_int(0)
    if libc.syscall(_SYS_GET_MEMPOLICY, ctypes.byref(mode), None, 0, None, 0) == 0:
        return None
    err = ctypes.get_errno()
    if err == errno.EPERM:
        return ("get_mempolicy is refused (EPERM): the container's seccomp profile allows "
                "mbind/set_mempolicy only when it is configured with CAP_SYS_NICE")
    return f"get_mempolicy failed with {errno.errorcode.get(err, err)}"
