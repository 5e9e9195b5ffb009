"""Every node path the launcher probes goes through one :class:`NodeRoot`.

In a pod the root is ``/``. Tests (and ``--node-root DIR``) point it at a directory holding a
fake ``sys/``, ``proc/``, ``dev/`` and mount tree, so the same code reads a hand-built node.
Symbolic links inside the root are followed *inside* the root: an absolute link target such as
``/sys/devices/pci0000:00/...`` is re-rooted, so sysfs trees copied from a real node keep working.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

# More links than this while resolving one path means a loop.
_MAX_LINK_HOPS = 40


class NodeRoot:
    """A view of the node's filesystem rooted at ``root`` (``/`` in production)."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root).resolve()
        self.is_real = str(self.root) == "/"

    def __repr__(self) -> str:
        return f"NodeRoot({str(self.root)!r})"

    def path(self, node_path: str) -> Path:
        """The host path of ``node_path`` (an absolute path as the node sees it)."""
        rel = PurePosixPath(node_path)
        if not rel.is_absolute():
            raise ValueError(f"node path {node_path!r} must be absolute")
        return self.root.joinpath(*rel.parts[1:])

    def exists(self, node_path: str) -> bool:
        return self.path(node_path).exists()

    def read_text(self, node_path: str) -> str | None:
        """The file's text, or ``None`` when it does not exist or cannot be read."""
        try:
            return self.path(node_path).read_text()
        except OSError:
            return None

    def read_int(self, node_path: str) -> int | None:
        """The file's first token as an integer, or ``None`` when absent or not a number."""
        text = self.read_text(node_path)
        if text is None:
            return None
        token = text.strip().split()[0] if text.strip() else ""
        try:
            return int(token, 0) if token.startswith("0x") else int(token)
        except ValueError:
            return None

    def listdir(self, node_path: str) -> list[str]:
        """Sorted entry names, or ``[]`` when the directory does not exist."""
        try:
            return sorted(os.listdir(self.path(node_path)))
        except OSError:
            return []

    def statvfs(self, node_path: str) -> os.statvfs_result:
        """Filesystem statistics of the mount holding ``node_path`` (free space, read-only)."""
        return os.statvfs(self.path(node_path))

    def realpath(self, node_path: str) -> str:
        """``node_path`` with every symbolic link resolved, as a node path (inside the root)."""
        parts = list(PurePosixPath(node_path).parts[1:])
        resolved: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/" + "/".join([*resolved, part])
            host = self.path(candidate)
            if host.is_symlink():
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise OSError(f"too many symbolic links resolving {node_path}")
                target = os.readlink(host)
                target_parts = list(PurePosixPath(target).parts)
                if PurePosixPath(target).is_absolute():
                    resolved = []
                    target_parts = target_parts[1:]
                parts = target_parts + parts
            else:
                resolved.append(part)
        return "/" + "/".join(resolved)
