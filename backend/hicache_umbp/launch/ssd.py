"""Prepare the SSD tier: drive or per-rank directories, free space, write permission, io_uring.

Two engines (``umbp_ssd_engine``):

* ``hicache`` (:mod:`hicache_umbp.disk`), embedded and standalone alike (the engine process
  holds the tier): every drive directory of ``umbp_ssd_dir`` must exist, be on a read-write
  mount and take a real write; its free space plus what ``<dir>/hicache-disk/`` already holds
  (a restarted pod keeps its slot files) must cover the drive's share, ``pod bytes / drives``
  plus its index (at most ``4096 + 64 B`` per 4 KiB slot: the page size is known only when
  SGLang registers its host pool, so the smallest slot is assumed; the store checks the exact
  geometry when it opens the drive). No rank directories, no io_uring (threads with
  ``preadv``/``pwritev``).
* ``mori``: only the embedded store opens the SSD itself (in standalone mode the SSD sidecar
  does): each rank's directory ``<dir>/rank-<i>`` is created and written, and the filesystem's
  free space plus what the rank directories already hold must cover the planned capacity.

Every path is a node path under :class:`NodeRoot`: a mount must exist (it is the pod's volume)
and must not be mounted read-only (``/proc/self/mountinfo``, and the kernel's own ``statvfs``
flag); free space is ``statvfs`` ``f_bavail * f_frsize``.

io_uring is probed with a real ``io_uring_setup`` call: container runtimes' default seccomp
profiles block it (containerd >= 1.7.x, Docker >= 25), and ``kernel.io_uring_disabled`` can
switch it off for the whole node.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..contract.settings import BY_KEY, LaunchConfig
from ..contract.units import fmt_bytes
from .errors import LaunchError
from .noderoot import NodeRoot

IoUringProbe = Callable[[], "str | None"]

# io_uring_setup has the same number on x86_64 and aarch64 (the generic syscall table).
_SYS_IO_URING_SETUP = 425
_PROBE_NAME = ".hicache-write-probe"


def io_uring_syscall_probe() -> str | None:
    """``None`` when this process can create an io_uring, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(128)  # struct io_uring_params is 120 bytes
    fd = libc.syscall(_SYS_IO_URING_SETUP, 1, params)
    if fd >= 0:
        os.close(fd)
        return None
    err = ctypes.get_errno()
    hint = {
        errno.EPERM: "blocked (seccomp profile or kernel.io_uring_disabled)",
        errno.ENOSYS: "not supported by this kernel or filtered by seccomp",
    }.get(err, os.strerror(err))
    return f"io_uring_setup failed with {errno.errorcode.get(err, err)}: {hint}"


#: What ``<dir>/hicache-disk/`` is called (``hicache_umbp.disk.layout.DIR_NAME``; the launcher
#: does not import the store's rooms).
DISK_DIR = "hicache-disk"
_SLOT = 4096
_ENTRY = 64
#: The hicache engine's I/O path, reported in place of mori's io backend.
THREAD_IO = "preadv/pwritev threads"


def drive_need(share: int) -> int:
    """Bytes one drive of the hicache engine needs for ``share`` bytes of slots: the data plus
    an index of ``4096 + 64 B`` per slot at the smallest slot (4 KiB), in whole 4 KiB pages."""
    index = 4096 + share // _SLOT * _ENTRY
    return share + -(-index // _SLOT) * _SLOT


@dataclass(frozen=True)
class DriveResult:
    """One drive directory of the hicache engine."""

    dir: str
    need_bytes: int
    free_bytes: int
    held_bytes: int  # what <dir>/hicache-disk/ already holds (a restarted pod's slots)

    def as_dict(self) -> dict[str, object]:
        return {"dir": self.dir, "need_bytes": self.need_bytes, "free_bytes": self.free_bytes,
                "held_bytes": self.held_bytes}


@dataclass(frozen=True)
class SsdResult:
    mount: str
    rank_dirs: tuple[str, ...]
    capacity_bytes: int
    free_bytes: int
    used_by_cache_bytes: int
    io_backend: str
    io_backend_fallback: bool
    engine: str = "mori"
    drives: tuple[DriveResult, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "mount": self.mount,
            "rank_dirs": list(self.rank_dirs),
            "drives": [d.as_dict() for d in self.drives],
            "capacity_bytes": self.capacity_bytes,
            "free_bytes": self.free_bytes,
            "used_by_cache_bytes": self.used_by_cache_bytes,
            "io_backend": self.io_backend,
            "io_backend_fallback": self.io_backend_fallback,
        }


def _mount_of(root: NodeRoot, path: str) -> tuple[str, list[str]] | None:
    """Mount point and options of the mount holding ``path`` (longest prefix in mountinfo)."""
    best: tuple[str, list[str]] | None = None
    for line in (root.read_text("/proc/self/mountinfo") or "").splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[5].split(","))
    return best


def _disk_usage(host_dir: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(host_dir):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _write_probe(host_dir: str) -> None:
    probe = os.path.join(host_dir, _PROBE_NAME)
    fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"hicache")
    finally:
        os.close(fd)
        os.unlink(probe)


def _io_uring_state(root: NodeRoot, probe: IoUringProbe) -> str | None:
    disabled = root.read_int("/proc/sys/kernel/io_uring_disabled")
    if disabled == 2:
        return "kernel.io_uring_disabled=2 on the node"
    return probe()


def _writable_mount(root: NodeRoot, mount: str, label: str) -> os.statvfs_result:
    """The directory exists and is on a read-write mount; its filesystem's statvfs."""
    if not root.path(mount).is_dir():
        raise LaunchError(
            "SsdUnavailable",
            f"{label}={mount!r} does not exist or is not a directory: the SSD volume is not "
            f"mounted there (check spec.l3.ssd.volume and the pod's volumeMounts)",
        )
    mounted = _mount_of(root, mount)
    st = root.statvfs(mount)
    if (mounted and "ro" in mounted[1]) or st.f_flag & os.ST_RDONLY:
        where = mounted[0] if mounted else mount
        raise LaunchError(
            "SsdUnavailable",
            f"{label}={mount!r} is on a read-only mount ({where}); the SSD tier must write "
            f"there: mount the volume read-write",
        )
    return st


def prepare_ssd(
    root: NodeRoot, cfg: LaunchConfig, io_uring_probe: IoUringProbe = io_uring_syscall_probe
) -> SsdResult | None:
    """Check the SSD tier's directories (module docstring); ``None`` when the engine process
    holds no SSD tier (disabled, or mori's in the umbp-ssd sidecar)."""
    store = cfg.store
    if not store.umbp_ssd_enabled:
        return None
    if store.umbp_ssd_engine == "hicache":
        return _prepare_drives(root, cfg)
    if store.umbp_mode != "embedded":
        return None
    dir_env = BY_KEY["umbp_ssd_dir"].env
    mount = store.umbp_ssd_dir
    st = _writable_mount(root, mount, dir_env)
    rank_dirs = []
    for rank in range(store.umbp_local_ranks):
        node_dir = store.rank(rank).ssd_dir
        host_dir = root.path(node_dir)
        try:
            host_dir.mkdir(parents=True, exist_ok=True)
            _write_probe(str(host_dir))
        except OSError as e:
            raise LaunchError(
                "SsdUnavailable",
                f"cannot write rank {rank}'s SSD directory {node_dir!r} under {dir_env}="
                f"{mount!r}: {e.strerror or e} (errno {errno.errorcode.get(e.errno or 0, e.errno)})"
                f"; the volume must be writable by the engine's user (fsGroup)",
            ) from e
        rank_dirs.append(node_dir)
    capacity = sum(store.umbp_ssd_bytes)
    free = st.f_bavail * st.f_frsize
    used = sum(_disk_usage(str(root.path(d))) for d in rank_dirs)
    if free + used < capacity:
        per_rank = store.umbp_ssd_bytes
        plan = (f"{len(per_rank)} x {fmt_bytes(per_rank[0])}" if len(set(per_rank)) == 1
                else " + ".join(fmt_bytes(b) for b in per_rank))
        raise LaunchError(
            "SsdUnavailable",
            f"SSD tier needs {plan} = {fmt_bytes(capacity)} ({BY_KEY['umbp_ssd_bytes'].env}) "
            f"under {dir_env}={mount!r}; the filesystem has {fmt_bytes(free)} free"
            + (f" plus {fmt_bytes(used)} already held by the cache" if used else "")
            + ": the volume is smaller than spec.l3.ssd.capacity or shared with other data",
        )
    backend, fallback = store.umbp_ssd_io_backend, False
    if backend == "io_uring":
        why = _io_uring_state(root, io_uring_probe)
        if why is not None:
            flag = BY_KEY["ssd_allow_posix_fallback"].env
            if not cfg.ssd_allow_posix_fallback:
                raise LaunchError(
                    "SsdUnavailable",
                    f"{BY_KEY['umbp_ssd_io_backend'].env}=io_uring is not available: {why}. "
                    f"Allow io_uring in the pod's seccomp profile, choose ioBackend posix, or "
                    f"set {flag}=true to fall back to posix",
                )
            backend, fallback = "posix", True
    return SsdResult(mount, tuple(rank_dirs), capacity, free, used, backend, fallback)


def _prepare_drives(root: NodeRoot, cfg: LaunchConfig) -> SsdResult:
    """The hicache engine's drives: each exists, is writable and holds its share."""
    store = cfg.store
    dir_env = BY_KEY["umbp_ssd_dir"].env
    dirs = store.ssd_dirs()
    pod = store.ssd_pod_bytes()
    share = pod // max(len(dirs), 1)
    need = drive_need(share)
    drives = []
    for d in dirs:
        st = _writable_mount(root, d, f"{dir_env} drive")
        try:
            _write_probe(str(root.path(d)))
        except OSError as e:
            raise LaunchError(
                "SsdUnavailable",
                f"cannot write the SSD drive directory {d!r} ({dir_env}): "
                f"{e.strerror or e} (errno {errno.errorcode.get(e.errno or 0, e.errno)}); the "
                f"volume must be writable by the engine's user (fsGroup)",
            ) from e
        free = st.f_bavail * st.f_frsize
        held = _disk_usage(str(root.path(os.path.join(d, DISK_DIR))))
        if free + held < need:
            s = BY_KEY["umbp_ssd_bytes"]
            raise LaunchError(
                "SsdUnavailable",
                f"{s.key} ({s.env}): the SSD tier's share of drive {d!r} is "
                f"{fmt_bytes(pod)} / {len(dirs)} drive(s) = {fmt_bytes(share)} + index = "
                f"{fmt_bytes(need)}, but the volume has {fmt_bytes(free)} free"
                + (f" plus {fmt_bytes(held)} the tier already holds" if held else "")
                + ": lower spec.l3.ssd.capacity or give each drive a larger volume",
            )
        drives.append(DriveResult(d, need, free, held))
    return SsdResult(
        mount=dirs[0] if dirs else "", rank_dirs=(), capacity_bytes=pod,
        free_bytes=sum(d.free_bytes for d in drives),
        used_by_cache_bytes=sum(d.held_bytes for d in drives), io_backend=THREAD_IO,
        io_backend_fallback=False, engine="hicache", drives=tuple(drives))
