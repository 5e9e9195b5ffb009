"""The backend's public names: what a pod, SGLang and the engine image load it by.

Each is written here once. The operator renders them (the container command, the launcher's
extra-config), the launcher and the host-allocator hook compare with them, and thin public
modules keep each one loadable wherever the implementation lives: ``hicache_umbp.launch`` and
``hicache_umbp.serve`` (the process entries), ``hicache_umbp.sglang_adapter`` (re-exports
:class:`hicache_umbp.sglang.adapter.UMBPHiCacheStorage`) and ``hicache_umbp.sglang_hook``
(re-exports :func:`hicache_umbp.sglang.hook.plugin`). A pod started by any earlier operator runs
the same names.
"""

from __future__ import annotations

from typing import Any, Final

#: The engine container's command (``python -m hicache_umbp.launch``): probe the node, then exec.
LAUNCH_MODULE: Final = "hicache_umbp.launch"
LAUNCH_COMMAND: Final = ("python", "-m", LAUNCH_MODULE)
#: The engine container's preStop hook: drain in-flight requests before SIGTERM.
DRAIN_MODULE: Final = "hicache_umbp.drain"
DRAIN_COMMAND: Final = ("python", "-m", DRAIN_MODULE)
#: What the launcher execs: ``python -m sglang.launch_server`` with the host-allocator hook.
SERVE_MODULE: Final = "hicache_umbp.serve"
#: SGLang's dynamic storage backend keys for ours (``--hicache-storage-backend dynamic``).
BACKEND_NAME: Final = "umbp"
ADAPTER_MODULE: Final = "hicache_umbp.sglang_adapter"
ADAPTER_CLASS: Final = "UMBPHiCacheStorage"
#: The ``sglang.srt.plugins`` entry point (pyproject.toml) SGLang loads in every process.
PLUGIN_ENTRY_POINT: Final = "hicache_umbp.sglang_hook:plugin"


def dynamic_extra_config(**settings: Any) -> dict[str, Any]:
    """The ``--hicache-storage-backend-extra-config`` object that loads our backend, then
    ``settings`` (store keys); ``interface_v1: 1`` selects SGLang's zero-copy v1 calls."""
    return {
        "backend_name": BACKEND_NAME,
        "module_path": ADAPTER_MODULE,
        "class_name": ADAPTER_CLASS,
        "interface_v1": 1,
        **settings,
    }

#: SGLang 0.5.23's backup counters that the operator's cache status and the drain hook both
#: read: device -> host (L2) backups, and the host -> L3 backups that follow each of them
#: (completed, and dropped ones that never complete).
SGLANG_L2_BACKUP_METRIC: Final = "sglang:hicache_backup_tokens_total"
SGLANG_L3_BACKUP_METRIC: Final = "sglang:backuped_tokens_total"
SGLANG_L3_DROPPED_METRIC: Final = "sglang:hicache_backup_dropped_tokens_total"
#: Labels that tell apart the ranks' copies of one count SGLang exports per rank (an MLA pod's
#: ranks share their pages); the other labels tell real parts apart (dp ranks hold their own).
SGLANG_RANK_LABELS: Final = frozenset({"tp_rank", "pp_rank", "pp_size", "attn_cp_rank",
                                       "attn_cp_size", "moe_ep_rank"})
