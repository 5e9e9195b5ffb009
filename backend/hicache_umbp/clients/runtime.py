"""mori at run time: importing ``mori.umbp`` where it exists, finding its binaries, and the
deployment modes this host cannot run (distributed needs an RDMA NIC)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from ..contract.mori_env import STANDALONE_SERVER_BINARY

#: Env var holding the command prefix (trixie loader + --library-path) that mori binaries need
#: on hosts older than glibc 2.38; set by the engine environment's ``engine-python`` wrapper
#: (make engine-env), empty in the engine image.
LOADER_ENV = "MORI_CPU_LOADER"
INFINIBAND_SYSFS = "/sys/class/infiniband"


class MoriUnavailableError(RuntimeError):
    """``mori.umbp`` cannot be imported here (not the engine image or environment)."""


class DistributedModeUnavailableError(RuntimeError):
    """``umbp_mode=distributed`` was asked for where it cannot run."""


def import_umbp() -> Any:
    try:
        from mori import umbp  # lazy: mori is optional for every importer of this module
    except ImportError as exc:  # pragma: no cover - depends on the interpreter
        raise MoriUnavailableError(
            "mori.umbp is not importable in this interpreter: run the store inside the engine "
            "image, or in tests with the engine environment's .cache/venvs/engine/bin/"
            "engine-python (make engine-env)"
        ) from exc
    return umbp


def mori_loader_prefix() -> list[str]:
    """Command prefix for mori binaries: ``$MORI_CPU_LOADER`` split, or ``[]``."""
    return shlex.split(os.environ.get(LOADER_ENV, ""))


def standalone_server_binary() -> str:
    """Path of ``umbp_standalone_server`` shipped inside the amd-mori wheel."""
    env_bin = os.environ.get("UMBP_STANDALONE_BIN", "")
    if env_bin:
        return env_bin
    umbp = import_umbp()
    path = Path(umbp.__file__).resolve().parents[1] / STANDALONE_SERVER_BINARY
    if not path.is_file():
        raise MoriUnavailableError(f"umbp_standalone_server not found at {path}")
    return str(path)


def rdma_devices(sysfs: str = INFINIBAND_SYSFS) -> list[str]:
    """RDMA devices the kernel exposes (``/sys/class/infiniband``), sorted."""
    try:
        return sorted(os.listdir(sysfs))
    except OSError:
        return []


def require_distributed(sysfs: str = INFINIBAND_SYSFS) -> None:
    """Refuse distributed mode with the reason: no RDMA NIC, or not implemented yet."""
    devices = rdma_devices(sysfs)
    if not devices:
        raise DistributedModeUnavailableError(
            f"umbp_mode=distributed needs an RDMA NIC for mori's transfer engine, but "
            f"{sysfs} lists no device on this host; use umbp_mode=embedded or standalone"
        )
    raise DistributedModeUnavailableError(
        f"umbp_mode=distributed (RDMA devices {', '.join(devices)}) is not supported by this "
        "backend yet; use umbp_mode=embedded or standalone"
    )
