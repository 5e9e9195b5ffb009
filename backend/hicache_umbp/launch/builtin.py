"""SGLang 0.5.23's built-in ``mori`` backend: its storage flags, extra-config and environment.

``--hicache-storage-backend mori`` builds ``UMBPStore`` (``sglang/srt/mem_cache/storage/umbp/
umbp_store.py``) per rank and, for the host pool, SGLang's own ``UMBPHostTensorAllocator``
(``umbp_host_allocator.py``). What they read, and so what is rendered here:

* extra-config (``umbp_store.py`` reads each key with ``int()``/a strict bool; an unknown key
  only logs a warning, so nothing else is ever put in):

  - ``ssd_enabled``: always ``false``. mori's ``UMBPConfig.from_environment()`` defaults to an
    enabled SSD tier in ``/tmp/umbp_ssd`` (32 GiB), and on mori 1.2.4 the built-in backend never
    writes it in-process anyway (``config._builtin_rules`` refuses an SSD tier);
  - ``dram_capacity_bytes`` (embedded): the DRAM tier of ONE ``UMBPStore`` = one rank, a single
    integer for every rank (there is no per-rank form).

* the host allocator's process-wide env (``hicache_umbp.contract.settings.SGLANG_HOST_*``):
  hugepages on or
  off, their size, prefault, and ``SGLANG_HICACHE_HOST_NUMA_NODE``, which SGLang parses with
  ``int()``: one node for the process, never a list. Every scheduler of the pod inherits the same
  environment, so it is rendered only when all ranks share one node; the per-rank nodes stay in
  ``HICACHE_HOST_NUMA`` and ``hicache_umbp.sglang.hook`` sets each scheduler's own value before
  SGLang's allocator reads it.
* standalone mode: ``UMBP_STANDALONE_ADDRESS`` in the environment (the allocator picks memfd
  backing from it before the extra-config is parsed, and ``UMBPStore`` refuses the address in the
  extra-config when a host pool exists) and ``UMBP_STANDALONE_AUTO_START=0``; the store connects
  every rank to the one DRAM sidecar.
* embedded DRAM tier: mori's ``UMBP_DRAM_USE_HUGEPAGES`` / ``_HUGEPAGE_SIZE`` / ``_NUMA_NODE`` /
  ``_PREFAULT`` (one value per process as well; the hook sets the rank's node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..contract.builtin import (
    DRAM_CAPACITY_KEY,
    SGLANG_HOST_HUGEPAGE,
    SGLANG_HOST_HUGEPAGE_SIZE,
    SGLANG_HOST_NUMA_NODE,
    SGLANG_HOST_PREFAULT,
    SSD_ENABLED_KEY,
)
from ..contract.mori_env import DRAM_NUMA_NODE, dram_tier_env, standalone_client_env
from ..contract.paths import standalone_socket_path
from ..contract.settings import BY_KEY, LaunchConfig
from ..contract.values import parse_value
from .errors import LaunchError


def _effective(cfg: LaunchConfig, resolved: Mapping[str, Any], key: str) -> Any:
    """The value the launcher settled on: a node-resolved one, else the configured one."""
    return resolved.get(key, getattr(cfg.store, key))


def _one_value(values: tuple[int, ...]) -> int | None:
    return values[0] if len(set(values)) == 1 else None


def builtin_extra_config(cfg: LaunchConfig) -> dict[str, Any]:
    """The built-in backend's extra-config JSON object."""
    extra: dict[str, Any] = {SSD_ENABLED_KEY: False}
    store = cfg.store
    if store.umbp_mode == "embedded":
        dram = _one_value(store.umbp_dram_bytes)
        if dram is None:
            raise LaunchError(
                "InvalidConfig",
                f"{BY_KEY['umbp_dram_bytes'].env}={','.join(map(str, store.umbp_dram_bytes))}: "
                f"SGLang's built-in backend takes one {DRAM_CAPACITY_KEY} for every rank; give "
                f"the same size per rank")
        extra[DRAM_CAPACITY_KEY] = dram
    return extra


def builtin_env(cfg: LaunchConfig, resolved: Mapping[str, Any]) -> dict[str, str]:
    """SGLang's host-allocator variables and mori's client variables for this pod."""
    store = cfg.store
    hugepage = int(_effective(cfg, resolved, "host_hugepage_bytes"))
    env = {SGLANG_HOST_HUGEPAGE: "1" if hugepage else "0",
           SGLANG_HOST_PREFAULT: "1" if store.host_prefault else "0"}
    if hugepage:
        env[SGLANG_HOST_HUGEPAGE_SIZE] = str(hugepage)
    node = _one_value(tuple(_effective(cfg, resolved, "host_numa")))
    if node is not None:
        env[SGLANG_HOST_NUMA_NODE] = str(node)
    if store.umbp_mode == "standalone":
        env.update(standalone_client_env(standalone_socket_path(store.umbp_socket_dir, "dram")))
    elif any(b > 0 for b in store.umbp_dram_bytes):
        dram_node = _one_value(tuple(_effective(cfg, resolved, "umbp_dram_numa")))
        env.update(dram_tier_env(
            hugepage_bytes=int(_effective(cfg, resolved, "umbp_dram_hugepage_bytes")),
            numa_node=-1 if dram_node is None else dram_node,
            prefault=store.umbp_dram_prefault))
    return env


def scheduler_numa_env(env: Mapping[str, str], local_rank: int) -> dict[str, str | None]:
    """The process-wide NUMA variables one scheduler (``local_rank``) of the pod must see.

    SGLang's built-in allocator and mori's DRAM tier read ONE node per process, but every
    scheduler inherits the pod's environment; the launcher wrote the per-rank nodes to
    ``HICACHE_HOST_NUMA`` / ``HICACHE_UMBP_DRAM_NUMA``. Returns ``{variable: value}``, ``None``
    meaning "unset it" (a rank whose GPU has no NUMA node). Empty when the launcher set neither
    (not one of our pods: SGLang's own behaviour is kept).
    """
    targets = {"host_numa": SGLANG_HOST_NUMA_NODE, "umbp_dram_numa": DRAM_NUMA_NODE}
    present = [key for key in targets if BY_KEY[key].env in env]
    if not present:
        return {}
    ranks_setting = BY_KEY["umbp_local_ranks"]
    ranks = parse_value(ranks_setting, ranks_setting.env,
                        env.get(ranks_setting.env, ranks_setting.default), 1)
    out: dict[str, str | None] = {}
    for key in present:
        nodes = parse_value(BY_KEY[key], BY_KEY[key].env, env[BY_KEY[key].env], ranks)
        node = nodes[local_rank]
        out[targets[key]] = str(node) if node >= 0 else None
    return out
