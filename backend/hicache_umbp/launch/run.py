"""The launch sequence: config, GPUs and NUMA, sidecars, hugepages, SSD, command, report.

:func:`plan_launch` runs steps 1-6 and returns what to exec; it never execs, so tests and
``--dry-run`` share every line of it. Each step logs one line a human can read; warnings are
logged and collected in the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..contract.load import load_launch_config
from ..contract.settings import BY_KEY, ConfigError, LaunchConfig
from ..contract.units import fmt_bytes
from .access import MempolicyProbe, check_gpu_access, mempolicy_syscall_probe
from .command import Command, expected_ranks, extensions_env, render_command, shell_quote
from .errors import LaunchError
from .gpus import numa_per_rank, probe_gpus
from .hugepages import check_hugepages
from .noderoot import NodeRoot
from .report import new_report
from .ssd import IoUringProbe, io_uring_syscall_probe, prepare_ssd
from .standalone import release_dead_registrations, wait_for_sidecars

log = logging.getLogger("hicache_umbp.launch")


@dataclass
class LaunchPlan:
    config: LaunchConfig
    command: Command
    child_env: dict[str, str]
    report: dict[str, Any]


class _Laps:
    """Seconds each launch step took, into ``report["timings_s"]`` (time-to-Ready analysis)."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.timings: dict[str, float] = report.setdefault("timings_s", {})
        self.last = time.monotonic()

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.timings[step] = round(now - self.last, 4)
        self.last = now


def _warn(report: dict[str, Any], message: str) -> None:
    log.warning("warning: %s", message)
    report["warnings"].append(message)


def _load(env: Mapping[str, str]) -> LaunchConfig:
    try:
        cfg = load_launch_config(env)
    except ConfigError as e:
        raise LaunchError("InvalidConfig", str(e)) from e
    ranks, want = cfg.store.umbp_local_ranks, expected_ranks(cfg)
    if ranks != want:
        how = (f"{BY_KEY['tp_size'].env}={cfg.tp_size} with DP attention"
               if cfg.enable_dp_attention else
               f"{BY_KEY['tp_size'].env}={cfg.tp_size} x {BY_KEY['dp_size'].env}={cfg.dp_size}")
        raise LaunchError(
            "InvalidConfig",
            f"{BY_KEY['umbp_local_ranks'].env}={ranks} but {how} runs {want} ranks in this pod; "
            f"they must agree (one rank per GPU)")
    return cfg


def plan_launch(
    env: Mapping[str, str],
    root: NodeRoot,
    *,
    dry_run: bool = False,
    io_uring_probe: IoUringProbe = io_uring_syscall_probe,
    mempolicy_probe: MempolicyProbe = mempolicy_syscall_probe,
    wait_sidecars: Callable[..., Any] = wait_for_sidecars,
    report: dict[str, Any] | None = None,
) -> LaunchPlan:
    """Probe the node and render the SGLang command; raises :class:`LaunchError` on a failed check.

    ``report`` (optional) is filled in as the steps go, so a caller still has the partial report
    when a step raises.
    """
    report = {} if report is None else report
    for key, value in new_report(dry_run).items():
        report.setdefault(key, value)
    lap = _Laps(report)
    # 1. the env contract
    cfg = _load(env)
    store = cfg.store
    ranks = store.umbp_local_ranks
    set_vars = sum(1 for k in env if k.startswith("HICACHE_"))
    log.info("config: model %s, %d rank(s) (tp %d, dp %d%s), L3 %s %s, %d HICACHE_* variables "
             "set", cfg.model_path or "<unset>", ranks, cfg.tp_size, cfg.dp_size,
             ", DP attention" if cfg.enable_dp_attention else "", cfg.l3_backend,
             store.umbp_mode, set_vars)

    lap("config")
    # 2. GPUs and NUMA
    probe = probe_gpus(root, env)
    report["gpus"] = [g.as_dict() for g in probe.gpus]
    for w in probe.warnings:
        _warn(report, w)
    if len(probe.gpus) < ranks:
        raise LaunchError(
            "GpuDiscoveryFailed",
            f"{BY_KEY['umbp_local_ranks'].env}={ranks} needs {ranks} GPUs (rank i uses GPU i); "
            f"{len(probe.gpus)} visible via {probe.source}"
            + (f" after {', '.join(probe.filters)}" if probe.filters else "")
            + ": the pod's amd.com/gpu request or the visibility variables are short")
    if len(probe.gpus) > ranks:
        _warn(report, f"{len(probe.gpus)} GPUs visible but {ranks} rank(s) configured; GPUs "
                      f"{ranks}..{len(probe.gpus) - 1} stay idle")
    check_gpu_access(root, probe.gpus[:ranks])
    numa, numa_warnings = numa_per_rank(probe, ranks, cfg.numa_policy)
    for w in numa_warnings:
        _warn(report, w)
    report["numa_placement"] = "none" if cfg.numa_policy == "none" else "bound"
    if cfg.numa_policy == "auto" and any(n >= 0 for n in numa):
        refused = mempolicy_probe()
        if refused is not None:
            _warn(report, f"NUMA placement degraded: {refused}; the host pool"
                          + (" and UMBP DRAM" if store.umbp_mode == "embedded" else "")
                          + f" of every rank stay unbound (wanted NUMA nodes "
                          f"{','.join(map(str, numa))}). Grant SYS_NICE (spec.security."
                          f"capabilities; the admin policy's allowedCapabilities must list it)")
            report["numa_placement"] = "degraded"
            report["fallbacks"].append("numa->unbound")
            numa = tuple(-1 for _ in numa)
    if report["numa_placement"] == "bound" and any(n < 0 for n in numa):
        report["numa_placement"] = "partial" if any(n >= 0 for n in numa) else "unknown"
    report["numa_per_rank"] = list(numa)
    log.info("gpus: %d visible via %s (%d physical%s), device files open; NUMA per rank %s "
             "(numa %s, placement %s)", len(probe.gpus), probe.source, probe.physical_count,
             ", partitioned" if probe.physical_count < len(probe.gpus) else "",
             ",".join(map(str, numa)), cfg.numa_policy, report["numa_placement"])
    resolved: dict[str, Any] = {}
    if cfg.numa_policy == "auto":
        if store.sources.get("host_numa") == "default":
            resolved["host_numa"] = numa
        if (store.umbp_mode == "embedded" and store.sources.get("umbp_dram_numa") == "default"
                and any(b > 0 for b in store.umbp_dram_bytes)):
            resolved["umbp_dram_numa"] = numa

    lap("gpus")
    # 3. standalone sidecars: before the hugepage check, which needs what a dead engine left
    # mapped in them
    if store.umbp_mode == "standalone":
        sa = wait_sidecars(root, store)
        report["standalone"] = sa.as_dict()
        log.info("standalone: %d sidecar socket(s) accept connections after %.1f s",
                 len(sa.sockets), sa.waited_s)
        released = release_dead_registrations(root, store, dry_run=dry_run)
        report["standalone"]["released"] = released
        for r in released:
            log.warning("standalone: %s the host pool registration(s) a previous engine "
                        "process (pid %s) left in the umbp-%s sidecar (it did not exit "
                        "cleanly)", "released" if r["released"] else "would release",
                        r["pid"], r["medium"])
    else:
        log.info("standalone: not used (%s mode)", store.umbp_mode)

    lap("standalone")
    # 4. hugepages
    hp = check_hugepages(root, cfg, numa)
    report["hugepages"] = {"backing": hp.backing, "fallback_to_4k": hp.fallback_to_4k,
                           "sizes": [c.as_dict() for c in hp.checks]}
    if hp.fallback_to_4k:
        for c in hp.checks:
            for p in c.problems:
                _warn(report, p)
        _warn(report, f"starting on 4 KiB pages ({BY_KEY['host_allow_4k_fallback'].env}=true): "
                      f"the pools now count against the pod's memory limit and lose hugepage TLB "
                      f"reach")
        report["fallbacks"].append("hugepages->4KiB")
        if store.host_hugepage_bytes:
            resolved["host_hugepage_bytes"] = 0
        if store.umbp_mode == "embedded" and store.umbp_dram_hugepage_bytes:
            resolved["umbp_dram_hugepage_bytes"] = 0
    summary = "; ".join(
        f"{fmt_bytes(c.need_pages * c.page_size)} of {fmt_bytes(c.page_size)} pages needed"
        + (" (+ pools sized by ratio)" if c.unknown_pools else "")
        + f", cgroup {c.cgroup.version} allows "
        + ("unlimited" if c.cgroup.available is None else fmt_bytes(c.cgroup.available))
        + f", node has {c.node_free_pages} free"
        for c in hp.checks) or "no hugepage-backed pool"
    log.info("hugepages: %s: %s", summary,
             "FALLBACK to 4 KiB pages" if hp.fallback_to_4k else "ok")

    lap("hugepages")
    # 5. SSD tier
    ssd = prepare_ssd(root, cfg, io_uring_probe)
    if ssd is None:
        log.info("ssd: no SSD tier in the engine (%s)",
                 "served by the ssd sidecar" if store.umbp_mode == "standalone"
                 and store.umbp_ssd_enabled else "disabled")
    elif ssd.engine == "hicache":
        report["ssd"] = ssd.as_dict()
        log.info("ssd: hicache engine on %d drive(s) (%s), %s planned for the pod, %s free, "
                 "%s already held, io %s: ok", len(ssd.drives),
                 ", ".join(d.dir for d in ssd.drives), fmt_bytes(ssd.capacity_bytes),
                 fmt_bytes(ssd.free_bytes), fmt_bytes(ssd.used_by_cache_bytes), ssd.io_backend)
    else:
        report["ssd"] = ssd.as_dict()
        if ssd.io_backend_fallback:
            _warn(report, f"io_uring unavailable; SSD tier uses posix I/O "
                          f"({BY_KEY['ssd_allow_posix_fallback'].env}=true)")
            report["fallbacks"].append("io_uring->posix")
            resolved["umbp_ssd_io_backend"] = "posix"
        log.info("ssd: %d rank dir(s) under %s, %s planned, %s free, io %s: ok",
                 len(ssd.rank_dirs), ssd.mount, fmt_bytes(ssd.capacity_bytes),
                 fmt_bytes(ssd.free_bytes), ssd.io_backend)

    lap("ssd")
    # 6. the command
    command = render_command(cfg, resolved)
    command.env_overrides.update(extensions_env(cfg, env))
    child_env = {**env, **command.env_overrides}
    lap("command")
    report["argv"] = list(command.argv)
    report["env"] = command.env_overrides
    report["ok"] = True
    log.info("command: %s", shell_quote(command.argv))
    return LaunchPlan(cfg, command, child_env, report)
