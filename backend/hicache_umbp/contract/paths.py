"""Paths of the pod contract: where the operator mounts what the launcher and the store use.

The operator mounts the volumes at these paths and renders them into the env; the settings'
defaults are the same constants, so a path is written once.
"""

from __future__ import annotations

import os

from .media import Medium

#: The standalone servers' UNIX sockets (an emptyDir shared by the engine and the sidecars).
SOCKET_DIR = "/var/run/umbp"
#: The launcher's report and the host-pool status files next to it.
REPORT_DIR = "/var/run/hicache"
REPORT_PATH = f"{REPORT_DIR}/launch-report.json"
#: The SSD tier's volume in the engine (embedded) or the umbp-ssd sidecar (standalone).
SSD_MOUNT = "/mnt/umbp-ssd"
#: The pod's annotations in the engine container (a downward API volume; InPlaceIfPossible).
POD_INFO_DIR = "/var/run/hicache-pod"
ANNOTATIONS_FILE = f"{POD_INFO_DIR}/annotations"


def standalone_socket_path(socket_dir: str, medium: Medium) -> str:
    """``<umbp_socket_dir>/<medium>.sock``: one server per medium, shared by the pod's ranks."""
    return os.path.join(socket_dir, f"{medium}.sock")


def rank_ssd_dir(ssd_dir: str, local_rank: int) -> str:
    """``<umbp_ssd_dir>/rank-<i>``: each rank's own directory of the embedded SSD tier."""
    return os.path.join(ssd_dir, f"rank-{local_rank}")


def host_pool_status_path(report_path: str, local_rank: int) -> str:
    """``host-pool-rank<r>.json`` next to the launch report: how a rank's host pool is backed."""
    return os.path.join(os.path.dirname(report_path), f"host-pool-rank{local_rank}.json")
