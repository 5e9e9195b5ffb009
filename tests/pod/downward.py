"""Downward API volumes as the kubelet writes them (``pkg/volume/downwardapi``, ``AtomicWriter``).

Each item's file holds the field's value; ``metadata.labels`` and ``metadata.annotations`` are
``key="value"`` lines sorted by key, the value Go-quoted (``%q``). The files are published
atomically: the payload goes into a fresh timestamped directory, the ``..data`` symlink is
renamed over to point at it, and each item is a symlink ``<path> -> ..data/<path>``; a reader
never sees half a file. The kubelet rewrites the volume when the pod's labels or annotations
change (Kubernetes conformance: "Downward API volume should update annotations on
modification"); :func:`write` is what it does each time.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def quote(value: str) -> str:
    """Go's ``%q`` for the strings Kubernetes allows in labels and annotations (printable
    unicode is kept; JSON's escapes coincide with Go's for the rest)."""
    return json.dumps(value, ensure_ascii=False)


def _map_file(values: Mapping[str, str]) -> str:
    return "".join(f"{k}={quote(v)}\n" for k, v in sorted(values.items()))


def render(items: list[dict[str, Any]], fields: Mapping[str, Any]) -> dict[str, str]:
    """path -> content for a ``downwardAPI`` volume's items; ``fields`` maps a fieldPath
    (``metadata.name``, ``metadata.labels``, ``metadata.annotations``, ...) to its value."""
    out: dict[str, str] = {}
    for item in items:
        ref = item.get("fieldRef")
        if ref is None:
            raise NotImplementedError(f"downwardAPI item {sorted(item)} (only fieldRef)")
        path = ref["fieldPath"]
        if path not in fields:
            raise NotImplementedError(f"downwardAPI fieldRef {path}")
        value = fields[path]
        out[item["path"]] = _map_file(value) if isinstance(value, Mapping) else str(value)
    return out


def write(volume: Path, files: Mapping[str, str], mode: int = 0o644) -> bool:
    """Publish ``files`` in ``volume`` atomically; False when nothing changed."""
    data = volume / "..data"
    if data.exists() and all((data / p).is_file() and (data / p).read_text() == c
                             for p, c in files.items()):
        return False
    stamp = volume / time.strftime(f"..%Y_%m_%d_%H_%M_%S.{time.monotonic_ns()}")
    stamp.mkdir(parents=True)
    for path, content in files.items():
        target = stamp / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        os.chmod(target, mode)
    os.chmod(stamp, 0o755)
    old = os.readlink(data) if data.is_symlink() else None
    tmp = volume / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(stamp.name, tmp)
    os.replace(tmp, data)
    for path in files:
        link = volume / path
        if not link.is_symlink():
            os.symlink(f"..data/{path}", link)
    if old is not None:
        shutil.rmtree(volume / old, ignore_errors=True)
    return True
