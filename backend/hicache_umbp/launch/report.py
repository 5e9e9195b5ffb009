"""The launch report: what the launcher resolved, as one JSON file a probe or the operator reads.

Written atomically (temporary file + rename) to ``HICACHE_REPORT_PATH`` before SGLang is
exec'd, and also when a check fails (``ok: false`` with the reason and message), so a
``kubectl exec cat`` or a readiness probe shows why a pod did not start. Schema version 1:

``{"schema": 1, "ok": bool, "reason": str|null, "error": str|null, "dry_run": bool,
"gpus": [...], "numa_per_rank": [...], "numa_placement": "bound"|"degraded"|"partial"|
"unknown"|"none", "hugepages": {...}, "ssd": {...}|null,
"standalone": {...}|null, "fallbacks": [...], "warnings": [...], "argv": [...],
"env": {...}}``

``ssd`` (:class:`~hicache_umbp.launch.ssd.SsdResult`): ``engine`` (``hicache`` | ``mori``),
``capacity_bytes`` (the pod's), ``free_bytes``, ``used_by_cache_bytes``, ``io_backend``; the
hicache engine lists ``drives`` (``dir``, ``need_bytes``: share plus index, ``free_bytes``,
``held_bytes``: what ``hicache-disk/`` already held), mori's embedded SSD node ``rank_dirs``.
Keys are only added within schema 1 (``engine`` and ``drives`` were), never renamed.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from .noderoot import NodeRoot

SCHEMA_VERSION = 1


def new_report(dry_run: bool) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "ok": False,
        "reason": None,
        "error": None,
        "dry_run": dry_run,
        "config_revision": None,  # with updateStrategy InPlaceIfPossible (launch.revision)
        "gpus": [],
        "numa_per_rank": [],
        "numa_placement": None,
        "hugepages": {},
        "ssd": None,
        "standalone": None,
        "fallbacks": [],
        "warnings": [],
        "argv": [],
        "env": {},
    }


def write_report(root: NodeRoot, node_path: str, report: dict[str, Any]) -> str:
    """Write ``report`` to ``node_path`` under ``root`` atomically; returns the host path."""
    target = root.path(node_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".launch-report.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return str(target)
