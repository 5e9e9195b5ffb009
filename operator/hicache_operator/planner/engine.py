"""The engine container's env (the backend's env contract) and the SGLang command it leads to.

Env names, parsers and the command renderer are imported from the backend's contract
(:mod:`hicache_umbp.contract`) and its launcher (:mod:`hicache_umbp.launch.command`): the
operator renders exactly what the pod reads, and what it shows as "the SGLang command line" is
what the launcher will exec for that env (with NUMA nodes still ``auto`` until the pod resolves
them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hicache_umbp.contract.builtin import BUILTIN_BACKEND, SGLANG_HOST_ALLOCATOR_ENV
from hicache_umbp.contract.load import load_launch_config, render_env
from hicache_umbp.contract.media import Medium
from hicache_umbp.contract.mori_env import STANDALONE_SERVER_BINARY
from hicache_umbp.contract.page_limits import page_size_problems
from hicache_umbp.contract.paths import (
    REPORT_PATH,
    SOCKET_DIR,
    SSD_MOUNT,
    standalone_socket_path,
)
from hicache_umbp.contract.settings import BY_KEY, MAX_MEMORY_BYTES, ConfigError, RankConfig
from hicache_umbp.contract.units import GB
from hicache_umbp.launch.command import owned_flag, render_command
from hicache_umbp.launch.errors import LaunchError

from ..api.k8s import IN_PLACE
from ..api.spec import SGLangHiCacheSpec
from .errors import Problems
from .page_geometry import largest_page_size, page_size_refusal
from .pod_overhead import engine_stop_grace_seconds
from .sizing import PodSizing
from .ssd import SsdLayout

OWNED_ENV_PREFIXES = ("HICACHE_", "UMBP_")
# SGLang's built-in backend's host allocator reads SGLANG_HICACHE_HOST_*: the launcher renders
# them from spec.hiCache.hostAllocator (an engine env entry would fight it, or with backend umbp
# mean nothing).
# SGLANG_SET_CPU_AFFINITY: the launcher turns SGLang's own pinning off (it ignores the pod's
# cpuset; hicache_umbp.launch.command.CPU_AFFINITY_ENV).
OWNED_ENV_NAMES = frozenset(
    {"SGLANG_DP_RANK", "SGLANG_DP_SIZE", "SGLANG_SET_CPU_AFFINITY", "POD_NAME", "POD_NAMESPACE",
     *SGLANG_HOST_ALLOCATOR_ENV}
)
SIDECAR_MEDIUM: dict[str, Medium] = {"umbp-dram": "dram", "umbp-ssd": "ssd"}
#: SGLang serves Prometheus metrics on its HTTP port (/metrics) with this flag; the operator
#: scrapes them into status.cache (operator configuration cacheMetrics.enabled).
METRICS_FLAG = "--enable-metrics"


@dataclass(frozen=True)
class EngineEnv:
    values: dict[str, Any]  # contract keys -> values
    env: dict[str, str]  # HICACHE_* -> rendered string
    sglang_argv: tuple[str, ...]


def ranks_per_pod(spec: SGLangHiCacheSpec) -> int:
    """GPUs (= ranks) one SGLang server drives: TP with DP attention, else TP x DP."""
    e = spec.engine
    if e.enable_dp_attention:
        return e.tensor_parallel_size
    return e.tensor_parallel_size * e.data_parallel_size


def check_parallelism(spec: SGLangHiCacheSpec, problems: Problems) -> int:
    e = spec.engine
    ranks = ranks_per_pod(spec)
    if e.enable_dp_attention:
        if e.data_parallel_size < 2:
            problems.add(
                "spec.engine.dataParallelSize",
                f"enableDpAttention needs dataParallelSize >= 2 (got {e.data_parallel_size})",
            )
        elif e.tensor_parallel_size % e.data_parallel_size:
            problems.add(
                "spec.engine.dataParallelSize",
                f"DP attention splits the TP group: tensorParallelSize "
                f"{e.tensor_parallel_size} is not a multiple of dataParallelSize "
                f"{e.data_parallel_size}",
            )
    if e.gpus_per_pod is not None and e.gpus_per_pod != ranks:
        formula = (
            f"tensorParallelSize {e.tensor_parallel_size} (DP attention shares the TP GPUs)"
            if e.enable_dp_attention
            else f"tensorParallelSize {e.tensor_parallel_size} x dataParallelSize "
            f"{e.data_parallel_size} = {ranks}"
        )
        problems.add(
            "spec.engine.gpusPerPod",
            f"gpusPerPod {e.gpus_per_pod} does not match the parallelism: {formula}",
        )
    return ranks


def attention_tp_size(spec: SGLangHiCacheSpec) -> int:
    """Ranks that hold one copy of an MLA KV cache: the TP group, split by DP attention."""
    e = spec.engine
    if e.enable_dp_attention and e.data_parallel_size > 1:
        return max(e.tensor_parallel_size // e.data_parallel_size, 1)
    return e.tensor_parallel_size


def check_mla_l3(spec: SGLangHiCacheSpec, problems: Problems) -> None:
    """MLA with attention TP > 1 needs one L3 store per pod.

    SGLang 0.5.23 backs an MLA page up from attention-TP rank 0 only (``backup_skip``) and
    prefetches the minimum of the ranks' ``batch_exists``: with an embedded store per rank the
    other ranks never see a page, so the minimum is always 0 (measured in the pod tier: no L3
    hit at all) and N-1 of N per-rank stores stay empty. A standalone sidecar is one store every
    rank reads.
    """
    tp = attention_tp_size(spec)
    if spec.model.attention == "mla" and tp > 1 and spec.l3.mode == "embedded":
        problems.add(
            "spec.l3.mode",
            f"an MLA model with attention tensor parallelism {tp} cannot use an embedded L3: "
            "SGLang backs MLA pages up from TP rank 0 only and prefetches the minimum of the "
            "ranks' hits, so per-rank stores never hit; use l3.mode standalone (one store "
            "per pod that every rank reads)",
        )


def mla_warnings(spec: SGLangHiCacheSpec) -> list[str]:
    """``attention: auto`` with attention TP > 1 and an embedded L3: fine for MHA, not MLA.

    Our adapter refuses to start an MLA model in that case; SGLang's built-in backend starts and
    never serves an L3 hit (measured: tests/backend/test_builtin_backend_sglang.py).
    """
    tp = attention_tp_size(spec)
    if spec.model.attention != "auto" or tp <= 1 or spec.l3.mode != "embedded":
        return []
    what = ("the built-in backend serves it no L3 hit at all (only rank 0 keeps pages, SGLang "
            "takes the minimum over the TP group)" if spec.l3.backend == BUILTIN_BACKEND else
            "the engine refuses to start (per-rank stores never hit)")
    return [f"model.attention is auto with attention tensor parallelism {tp} and an embedded "
            f"L3: if the model is MLA (DeepSeek-V2/V3/R1, Kimi K2) {what}; set model.attention "
            "(mla needs l3.mode standalone)"]


def check_user_args_and_env(spec: SGLangHiCacheSpec, problems: Problems) -> None:
    for i, arg in enumerate(spec.engine.extra_args):
        flag = owned_flag(arg)
        if flag:
            problems.add(
                f"spec.engine.extraArgs[{i}]",
                f"{flag} is set by the operator from the CR; remove it (use spec.engine "
                f"/ spec.hiCache fields instead)",
            )
    seen: set[str] = set()
    for i, var in enumerate(spec.engine.env):
        if var.name in OWNED_ENV_NAMES or var.name.startswith(OWNED_ENV_PREFIXES):
            problems.add(
                f"spec.engine.env[{i}].name",
                f"{var.name} is owned by the operator (HICACHE_*, UMBP_*, "
                f"SGLANG_DP_RANK, SGLANG_DP_SIZE, SGLANG_SET_CPU_AFFINITY, "
                f"SGLANG_HICACHE_HOST_*, POD_NAME, POD_NAMESPACE)",
            )
        if var.name in seen:
            problems.add(f"spec.engine.env[{i}].name", f"{var.name} is set twice")
        seen.add(var.name)
        if var.value is not None and var.value_from is not None:
            problems.add(f"spec.engine.env[{i}]", "set value or valueFrom, not both")


def sglang_extra_args(spec: SGLangHiCacheSpec, enable_metrics: bool) -> list[str]:
    """The user's extra SGLang arguments, led by ``--enable-metrics`` when metrics are on."""
    args = list(spec.engine.extra_args)
    if enable_metrics and METRICS_FLAG not in args:
        args.insert(0, METRICS_FLAG)
    return args


def contract_values(
    spec: SGLangHiCacheSpec, namespace: str, name: str, sizing: PodSizing, ssd: SsdLayout,
    enable_metrics: bool = True,
) -> dict[str, Any]:
    """Contract keys (hicache_umbp.contract.settings.SETTINGS) for this pod; mode-foreign keys
    omitted, and with SGLang's built-in backend the keys only our store reads (namespace, model id,
    DRAM/SSD tiering)."""
    e, hc, l3 = spec.engine, spec.hi_cache, spec.l3
    v: dict[str, Any] = {
        "umbp_mode": l3.mode,
        "umbp_namespace": f"{namespace}/{name}",
        "umbp_model_id": spec.model.path,
        "umbp_local_ranks": sizing.ranks,
        "umbp_ssd_enabled": ssd.enabled,
        "umbp_tier_write_policy": l3.tiering.write_policy,
        "umbp_tier_queue_bytes": sizing.queue_bytes_per_rank,
        "umbp_promote_on_hit": l3.tiering.promote_on_hit,
        "host_hugepage_bytes": sizing.host_page,
        "host_prefault": hc.host_allocator.prefault,
        "host_prefault_threads": hc.host_allocator.prefault_threads,
        "model_path": spec.model.path,
        "tp_size": e.tensor_parallel_size,
        "dp_size": e.data_parallel_size,
        "enable_dp_attention": e.enable_dp_attention,
        "page_size": e.page_size,
        "port": e.port,
        "mem_layout": hc.mem_layout,
        "write_policy": hc.write_policy,
        "io_backend": hc.io_backend,
        "numa_policy": hc.host_allocator.numa,
        "extra_args": json.dumps(sglang_extra_args(spec, enable_metrics)),
        "report_path": REPORT_PATH,
    }
    if not ssd.ours:
        # mori's io_uring fallback; the hicache engine never uses io_uring
        v["ssd_allow_posix_fallback"] = l3.ssd.allow_posix_fallback
    if hc.host_pool_per_rank is not None:
        v["host_pool_bytes"] = sizing.host_pool_per_rank
    elif hc.host_pool_ratio is not None:
        v["host_pool_ratio"] = hc.host_pool_ratio
    if ssd.ours:
        # Our SSD tier, in the engine process in either mode; the env default is mori (pods
        # rendered before the choice existed start as they did), so the engine is always named.
        v.update(
            umbp_ssd_engine="hicache",
            umbp_ssd_dir=",".join(ssd.dirs),
            umbp_ssd_bytes=sizing.ssd_per_rank,
            umbp_ssd_io_threads=l3.ssd.io_threads,
            umbp_ssd_direct_io=l3.ssd.direct_io,
            umbp_ssd_durability=l3.ssd.durability,
        )
    if l3.mode == "embedded":
        v["umbp_dram_bytes"] = sizing.dram_per_rank
        v["umbp_dram_hugepage_bytes"] = sizing.dram_page
        v["umbp_dram_prefault"] = l3.dram.prefault
        if ssd.enabled and not ssd.ours:
            v.update(
                umbp_ssd_dir=SSD_MOUNT,
                umbp_ssd_bytes=sizing.ssd_per_rank,
                umbp_ssd_io_backend=l3.ssd.io_backend,
                umbp_ssd_durability=l3.ssd.durability,
            )
    else:
        v["umbp_socket_dir"] = SOCKET_DIR
        if ssd.enabled and not ssd.ours and sizing.page is not None:
            # The same number as the sidecar's UMBP_DISTRIBUTED_DRAM_PAGE_SIZE (builders);
            # without the page geometry both keep their default (8 MiB), as before.
            v["umbp_ssd_slot_bytes"] = sizing.ssd_slot_bytes
    if spec.update_strategy.type == IN_PLACE:
        # Only the configuration watcher of InPlaceIfPossible reads it; rendered for no other
        # strategy, so their pods' templates stay byte for byte across an operator upgrade.
        v["engine_stop_grace_s"] = engine_stop_grace_seconds(sizing.engine_pool_bytes)
    if l3.backend == BUILTIN_BACKEND:
        # Rendered only when not the default, so pods of CRs that never set it keep their
        # ConfigMap (and config hash) byte for byte: an operator upgrade restarts no engine.
        v["l3_backend"] = l3.backend
        for key in OUR_STORE_ONLY_KEYS:
            v.pop(key, None)
    return v


#: The CR field each rendered contract key comes from (contract_values), for refusals.
CONTRACT_FIELDS = {
    "umbp_dram_bytes": "spec.l3.dram.capacity",
    "umbp_ssd_bytes": "spec.l3.ssd.capacity",
    "umbp_tier_queue_bytes": "spec.l3.tiering.queueSize",
    "umbp_ssd_slot_bytes": "spec.engine.pageSize",
    "umbp_ssd_dir": "spec.l3.ssd.volumes",
    "umbp_ssd_io_threads": "spec.l3.ssd.ioThreads",
    "umbp_local_ranks": "spec.engine.tensorParallelSize",
    "host_pool_bytes": "spec.hiCache.hostPoolPerRank",
    "host_pool_ratio": "spec.hiCache.hostPoolRatio",
    "host_prefault_threads": "spec.hiCache.hostAllocator.prefaultThreads",
    "tp_size": "spec.engine.tensorParallelSize",
    "dp_size": "spec.engine.dataParallelSize",
    "page_size": "spec.engine.pageSize",
    "port": "spec.engine.port",
    "extra_args": "spec.engine.extraArgs",
}


def contract_field(problem: str) -> str:
    """The CR field behind a refusal of the env contract (it names the variable), else spec."""
    for key, field in CONTRACT_FIELDS.items():
        if re.search(rf"\b{re.escape(BY_KEY[key].env)}\b", problem):
            return field
    return "spec"


#: Contract keys only our store reads; never rendered for SGLang's built-in backend.
OUR_STORE_ONLY_KEYS = ("umbp_namespace", "umbp_model_id", "umbp_tier_write_policy",
                       "umbp_tier_queue_bytes", "umbp_promote_on_hit")


def plan_engine_env(
    spec: SGLangHiCacheSpec,
    namespace: str,
    name: str,
    sizing: PodSizing,
    ssd: SsdLayout,
    problems: Problems,
    enable_metrics: bool = True,
) -> EngineEnv | None:
    """Render the env and parse it back with the backend's own loader and command renderer."""
    if spec.hi_cache.host_pool_per_rank is not None and sizing.host_pool_per_rank < GB:
        # 0 would reach SGLang as --hicache-size 0, which silently means "size by ratio".
        problems.add(
            "spec.hiCache.hostPoolPerRank",
            f"{sizing.host_pool_per_rank} B is below 1 GB (10^9 B), the unit of "
            f"SGLang's --hicache-size (use hostPoolRatio to size the pool by ratio)",
        )
    if spec.l3.mode == "standalone" and sizing.dram_total > MAX_MEMORY_BYTES:
        # The umbp-dram sidecar's UMBP_DRAM_CAPACITY: not a contract key, the same bound.
        problems.add(
            "spec.l3.dram.capacity",
            f"{sizing.dram_total} B for the umbp-dram sidecar (UMBP_DRAM_CAPACITY) is above "
            f"{MAX_MEMORY_BYTES} B (128 TiB, the x86-64 user address space: no host mapping is "
            "larger; mori's PoolClient::Init() fails)",
        )
    values = contract_values(spec, namespace, name, sizing, ssd, enable_metrics)
    try:
        env = render_env(values)
        cfg = load_launch_config(env)
        command = render_command(cfg, {}, python="python")
    except ConfigError as err:
        for p in err.problems:
            problems.add(contract_field(p), f"the pod would reject its configuration: {p}")
        return None
    except LaunchError as err:
        problems.add("spec", f"the launcher would refuse to start: {err}")
        return None
    return EngineEnv(values=values, env=env, sglang_argv=command.argv)


#: The CR field behind each limit ``page_size_problems`` names (by its env variable).
PAGE_LIMIT_FIELDS = {
    "umbp_dram_bytes": "spec.l3.dram.capacity",
    "umbp_ssd_bytes": "spec.l3.ssd.capacity",
    "umbp_tier_queue_bytes": "spec.l3.tiering.queueSize",
}


def check_page_size(
    spec: SGLangHiCacheSpec, namespace: str, name: str, sizing: PodSizing, ssd: SsdLayout,
    problems: Problems,
) -> None:
    """Refuse at ``spec.engine.pageSize`` the page the pod's store would refuse when SGLang
    registers its host pool: the backend's own :func:`~hicache_umbp.build.page_size_problems`
    on the configuration the pod will load (rendered and loaded as :func:`plan_engine_env`
    does). Runs beside the CR's other problems, so one answer lists them all; a configuration
    the pod's loader refuses is left to :func:`plan_engine_env` or to the problem behind it.
    Ranks are sized alike: the first rank that refuses speaks for all (no message per rank).
    SGLang's built-in backend (``l3.backend: sglang-mori``) is not our store and keeps no SSD
    tier or ring: its page rules are its own, so nothing is checked for it."""
    page = sizing.page
    if page is None or spec.l3.backend == BUILTIN_BACKEND:
        return
    try:
        env = render_env(contract_values(spec, namespace, name, sizing, ssd))
        store = load_launch_config(env).store
        ranks = [store.rank(r) for r in range(store.umbp_local_ranks)]
        refusals = [page_size_problems(rank, page.part_bytes, page.parts) for rank in ranks]
    except ConfigError:
        return
    for rank, reasons in zip(ranks, refusals, strict=True):
        if not reasons:
            continue

        def fits(part: int, rank: RankConfig = rank) -> bool:
            return not page_size_problems(rank, part, page.parts)

        largest = largest_page_size(page, fits)
        for reason in reasons:
            fields = [f for k, f in PAGE_LIMIT_FIELDS.items() if BY_KEY[k].env in reason]
            problems.add(
                "spec.engine.pageSize",
                page_size_refusal(page, reason, " or ".join(fields), largest),
            )
        return


def sidecar_socket(medium: Medium) -> str:
    """The socket the store connects to for ``medium`` (the backend's own path rule)."""
    return standalone_socket_path(SOCKET_DIR, medium)


def standalone_server_command(medium: Medium) -> list[str]:
    """The sidecar's argv: ``umbp_standalone_server unix:<socket_dir>/<medium>.sock``."""
    return [STANDALONE_SERVER_BINARY, f"unix:{sidecar_socket(medium)}"]


def env_var_name(key: str) -> str:
    return BY_KEY[key].env
