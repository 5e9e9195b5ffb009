"""``docs/env.md``: the pod's environment, generated from the settings table.

``python -m hicache_umbp.contract.envdoc > docs/env.md`` (``make env-doc``) writes it; a unit
test fails when the committed file differs. Every ``HICACHE_*`` variable is listed with its
extra-config key, type, default, the modes it applies to and its meaning (the table's ``doc``),
together with the CR field the operator renders it from and the other names the same meaning
has further down: mori's own ``UMBP_*`` variables of the standalone sidecars and SGLang's
built-in ``mori`` backend's keys and variables. The names in that column are the constants of
:mod:`.mori_env` and :mod:`.builtin`, never retyped here.
"""

from __future__ import annotations

import sys

from . import builtin, mori_env
from .load import render_value
from .settings import ALL_MODES, ENV_PREFIX, SETTINGS, Setting

_BUILTIN = "SGLang's built-in `mori` backend"

#: Where the operator takes each setting from (``hicache_operator.planner.engine``; a unit test
#: checks that every key it renders is listed).
FROM_CR: dict[str, str] = {
    "umbp_mode": "spec.l3.mode",
    "umbp_namespace": "`<namespace>/<name>` of the CR",
    "umbp_model_id": "spec.model.path",
    "umbp_local_ranks": "ranks per pod (spec.engine: TP, x DP without DP attention)",
    "umbp_dram_bytes": "spec.l3.dram.capacity / ranks (embedded)",
    "umbp_dram_numa": "the launcher: each rank's GPU NUMA node (hostAllocator.numa auto)",
    "umbp_dram_hugepage_bytes": "spec.l3.dram.hugePageSize",
    "umbp_dram_prefault": "spec.l3.dram.prefault",
    "umbp_ssd_enabled": "spec.l3.ssd.enabled",
    "umbp_ssd_engine": "spec.l3.ssd.engine",
    "umbp_ssd_dir": "the SSD volumes' mounts (one per drive)",
    "umbp_ssd_bytes": "spec.l3.ssd.capacity / ranks",
    "umbp_ssd_io_threads": "spec.l3.ssd.ioThreads",
    "umbp_ssd_direct_io": "spec.l3.ssd.directIO",
    "umbp_ssd_io_backend": "spec.l3.ssd.ioBackend",
    "umbp_ssd_durability": "spec.l3.ssd.durability",
    "umbp_tier_write_policy": "spec.l3.tiering.writePolicy",
    "umbp_tier_queue_bytes": "spec.l3.tiering.queueSize",
    "umbp_promote_on_hit": "spec.l3.tiering.promoteOnHit",
    "umbp_socket_dir": "the sockets volume's mount (standalone)",
    "umbp_standalone_wait_s": "not rendered (the default)",
    "umbp_ssd_slot_bytes": "the page part of spec.model.kvBytesPerToken (standalone SSD)",
    "umbp_master_address": "not rendered (distributed mode is not supported)",
    "umbp_peer_port": "not rendered (distributed mode is not supported)",
    "umbp_rdma_devices": "not rendered (distributed mode is not supported)",
    "umbp_log_interval_s": "not rendered (the default)",
    "host_hugepage_bytes": "spec.hiCache.hostAllocator.hugePageSize",
    "host_prefault": "spec.hiCache.hostAllocator.prefault",
    "host_numa": "the launcher: each rank's GPU NUMA node (hostAllocator.numa auto)",
    "host_prefault_threads": "spec.hiCache.hostAllocator.prefaultThreads",
    "host_allow_4k_fallback": "not rendered (the default: hugepages or no start)",
    "l3_backend": "spec.l3.backend (rendered when not umbp)",
    "model_path": "spec.model.path",
    "tp_size": "spec.engine.tensorParallelSize",
    "dp_size": "spec.engine.dataParallelSize",
    "enable_dp_attention": "spec.engine.enableDpAttention",
    "page_size": "spec.engine.pageSize",
    "port": "spec.engine.port",
    "mem_layout": "spec.hiCache.memLayout",
    "write_policy": "spec.hiCache.writePolicy",
    "io_backend": "spec.hiCache.ioBackend",
    "host_pool_bytes": "spec.hiCache.hostPoolPerRank",
    "host_pool_ratio": "spec.hiCache.hostPoolRatio",
    "numa_policy": "spec.hiCache.hostAllocator.numa",
    "ssd_allow_posix_fallback": "spec.l3.ssd.allowPosixFallback",
    "extra_args": "`--enable-metrics` (operator configuration) + spec.engine.extraArgs",
    "report_path": "the run volume's mount",
    "engine_stop_grace_s": "the engine's host pools (planner.pod_overhead); InPlaceIfPossible "
                           "only",
}

#: The same meaning under other names further down the pod.
ALSO: dict[str, tuple[str, ...]] = {
    "umbp_dram_bytes": (
        f"the umbp-dram sidecar's `{mori_env.DRAM_CAPACITY}` (standalone: the pod's whole DRAM "
        "tier, spec.l3.dram.capacity)",
        f"{_BUILTIN}: extra-config `{builtin.DRAM_CAPACITY_KEY}` (one value for every rank)",
    ),
    "umbp_dram_numa": (f"mori `{mori_env.DRAM_NUMA_NODE}` (one node per process)",),
    "umbp_dram_hugepage_bytes": (
        f"mori `{mori_env.DRAM_USE_HUGEPAGES}` and `{mori_env.DRAM_HUGEPAGE_SIZE}`",),
    "umbp_dram_prefault": (f"mori `{mori_env.DRAM_PREFAULT}`",),
    "umbp_ssd_enabled": (f"{_BUILTIN}: extra-config `{builtin.SSD_ENABLED_KEY}` (always false)",),
    "umbp_ssd_bytes": (f"the umbp-ssd sidecar's `{mori_env.SSD_CAPACITY}` (standalone: the pod's "
                       "whole SSD tier)",),
    "umbp_ssd_dir": (f"the umbp-ssd sidecar's `{mori_env.SSD_DIR}`",),
    "umbp_ssd_slot_bytes": (f"the umbp-ssd sidecar's `{mori_env.DISTRIBUTED_DRAM_PAGE_SIZE}`",),
    "umbp_socket_dir": (f"mori `{mori_env.STANDALONE_ADDRESS}` = `unix:<dir>/<medium>.sock`",),
    "host_hugepage_bytes": (
        f"{_BUILTIN}: `{builtin.SGLANG_HOST_HUGEPAGE}` and `{builtin.SGLANG_HOST_HUGEPAGE_SIZE}`",),
    "host_numa": (f"{_BUILTIN}: `{builtin.SGLANG_HOST_NUMA_NODE}` (one node per process)",),
    "host_prefault": (f"{_BUILTIN}: `{builtin.SGLANG_HOST_PREFAULT}`",),
    "host_pool_bytes": ("SGLang `--hicache-size` (whole decimal GB, rounded down)",),
    "host_pool_ratio": ("SGLang `--hicache-ratio`",),
    "enable_dp_attention": ("SGLang `--attn-dp-size`; the launcher sets `SGLANG_DP_SIZE`",),
}

_KINDS = {
    "bool": "bool", "int": "int", "bytes": "bytes", "float": "number", "str": "string",
    "enum": "one of", "rank_int": "int per rank", "rank_bytes": "bytes per rank",
    "rank_port": "port per rank",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(s: Setting) -> str:
    if s.kind == "enum":
        return "one of " + ", ".join(f"`{c}`" for c in s.choices)
    out = _KINDS[s.kind]
    lo, hi = s.minimum, s.maximum
    if lo is not None or (hi is not None and s.kind not in ("bytes", "rank_bytes")):
        bounds = [f">= {lo:g}" if lo is not None else "",
                  f"<= {hi:g}" if hi is not None and s.kind not in ("bytes", "rank_bytes") else ""]
        out += " (" + ", ".join(b for b in bounds if b) + ")"
    return out


def _default(s: Setting) -> str:
    value = render_value(s, s.default)
    return f"`{value}`" if value != "" else "empty"


def _row(s: Setting) -> str:
    modes = "all" if s.modes == ALL_MODES else ", ".join(sorted(s.modes))
    meaning = s.doc + "".join(f" Also: {a}." for a in ALSO.get(s.key, ()))
    return (f"| `{s.env}` | `{s.key}` | {_cell(_type(s))} | {_cell(_default(s))} | {modes} | "
            f"{_cell(FROM_CR.get(s.key, ''))} | {_cell(meaning)} |")


def render_env_doc() -> str:
    head = [
        "# The pod's environment",
        "",
        "<!-- Generated by `python -m hicache_umbp.contract.envdoc` (make env-doc) from the "
        "settings table, backend/hicache_umbp/contract/settings.py; do not edit. -->",
        "",
        f"The operator renders these `{ENV_PREFIX}*` variables into each engine pod's ConfigMap; "
        "the launcher (`python -m hicache_umbp.launch`) and the UMBP store read them back with "
        "the same parser (`hicache_umbp.contract.load`). Sources, highest first: the extra-config "
        "JSON of `--hicache-storage-backend-extra-config` (the key column), the variable, the "
        "default. Sizes are plain byte integers (mori reads them with `std::stoull`: `10Gi` "
        "would be 10 bytes); booleans are true/false, 1/0, yes/no or on/off; a per-rank value "
        "is one value for every rank or a comma list with one entry per rank. An unknown "
        f"`{ENV_PREFIX}*` variable or key, or one of another mode, is an error naming the "
        "closest valid one.",
        "",
        "Each variable also says which CR field it comes from and, where the same meaning has "
        "other names further down (mori's `UMBP_*` variables of the standalone sidecars, "
        "SGLang's built-in `mori` backend), those names.",
    ]
    out = head
    for scope, title in (("store", "Read by the store and the launcher"),
                         ("launch", "Read by the launcher only")):
        out += ["", f"## {title}", "",
                "| variable | extra-config key | type | default | modes | from the CR | meaning |",
                "|---|---|---|---|---|---|---|"]
        out += [_row(s) for s in SETTINGS if s.scope == scope]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_env_doc())
