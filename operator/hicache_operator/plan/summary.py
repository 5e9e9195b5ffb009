"""The ten-second summary of a plan (``plan -o summary``): it only reads a finished ``Plan``."""

from __future__ import annotations

import shlex

from hicache_umbp.contract.units import fmt_bytes, k8s_hugepage_resource

from ..api.quantity import format_bytes
from ..planner.engine import SIDECAR_MEDIUM, attention_tp_size, standalone_server_command
from ..planner.kv_pools import compare_kv_pools
from ..planner.rollout import rollout_summary
from ..planner.router_sizing import pod_tokens
from .orchestrate import Plan


def _bytes(n: int) -> str:
    return f"{fmt_bytes(n)} ({n} B)" if n else "0"


def render_summary(p: Plan) -> str:
    s, spec, facts = p.sizing, p.spec, p.config.node_facts
    out: list[str] = []
    add = out.append
    add(
        f"SGLangHiCache {p.namespace}/{p.name}: {spec.replicas} pod(s) x {s.ranks} GPU(s) "
        f"{p.gpu_model.name} (device ids {', '.join(p.gpu_model.device_ids)}), "
        f"L3 {spec.l3.mode}, backend {spec.l3.backend}"
    )
    add(f"model: {spec.model.path}   image: {spec.image or p.config.default_image}")
    add("")
    add("Per pod (requests == limits, Guaranteed QoS):")
    for c in s.containers:
        parts = [f"cpu {c.cpu}", f"memory {format_bytes(c.memory_bytes)}"]
        parts += [
            f"{k8s_hugepage_resource(pg)} {format_bytes(a)}"
            for pg, a in sorted(c.hugepages.items())
            if a
        ]
        if c.gpus:
            parts.append(f"{p.config.gpu_resource_name} {c.gpus}")
        add(f"  {c.name:<10} " + "   ".join(parts))
    add(
        f"  {'total':<10} cpu {s.cpu_total}   memory {format_bytes(s.memory_total)}   "
        f"hugepages {s.hugepages_display()}"
    )
    add(
        f"  /dev/shm   {format_bytes(s.shm_bytes)} (emptyDir medium Memory, inside the engine's "
        f"memory limit)"
    )
    add("Arithmetic:")
    for line in (*s.arithmetic, *p.ssd.arithmetic):
        add(f"  {line}")
    add("")
    add(
        f"Ranks (assumed {facts.gpu_model} node: {facts.gpus_per_node} GPUs, {facts.numa_nodes} "
        f"NUMA nodes, {facts.gpus_per_numa_node} GPUs per NUMA node; NUMA resolved in the pod, "
        f"numa: {spec.hi_cache.host_allocator.numa}):"
    )
    add(f"  {'rank':<5}{'gpu':<5}{'numa':<6}{'host pool':<28}{'UMBP DRAM':<28}SSD")
    pool = (
        _bytes(s.host_pool_per_rank)
        if s.host_pool_per_rank
        else f"ratio {spec.hi_cache.host_pool_ratio}"
    )
    standalone = spec.l3.mode == "standalone"
    dram = "shared server" if standalone else _bytes(s.dram_per_rank)
    ssd = ("pod's drives, shared" if p.ssd.ours else "shared server" if standalone
           else _bytes(s.ssd_per_rank))
    for r in p.topology.ranks:
        add(f"  {r.rank:<5}{r.gpu:<5}{r.numa_node:<6}{pool:<28}{dram:<28}{ssd}")
    verdict = "yes" if p.topology.single_numa_node_compatible else "NO"
    limits = ", ".join(p.topology.pods_per_node_limited_by) or "-"
    add(
        f"single-numa-node compatible: {verdict}; pods of this size per node: "
        f"{p.topology.pods_per_node} (limited by {limits})"
    )
    add(f"Topology Manager policies that admit the engine container: "
        f"{', '.join(p.topology.admitted_by)}")
    add("")
    if p.ssd.enabled:
        add(f"SSD: engine {p.ssd.engine}, tier {_bytes(p.ssd.capacity)}; dirs "
            f"{', '.join(p.ssd.dirs)}")
        for d in p.ssd.drives:
            size = f"{format_bytes(d.volume_bytes)} " if d.volume_bytes else ""
            add(f"  {d.name}: {d.kind} {size}mounted at {d.mount_path}")
    else:
        add("SSD: disabled")
    add("Capacity in tokens per pod (model.kvBytesPerToken): " + tier_tokens(p))
    if standalone:
        add("Standalone UMBP sidecars (native sidecars, survive engine restarts):")
        for line in sidecar_lines(p):
            add(f"  {line}")
    add(f"Warm L3 cache: {warm_cache(p)}")
    add(f"Rollouts: {rollout_summary(spec)}")
    add("")
    add(router_line(p))
    for line in p.router.sizing.arithmetic if p.router else ():
        add(f"  {line}")
    add("")
    add("SGLang command (rendered by the launcher from this env; NUMA resolved in the pod):")
    add(f"  {shlex.join(p.engine.sglang_argv)}")
    add("")
    add("Warnings:" if p.warnings else "Warnings: none")
    for w in p.warnings:
        add(f"  - {w}")
    add("Objects: " + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in p.objects))
    return "\n".join(out) + "\n"


def router_line(p: Plan) -> str:
    """Whether requests go through the cache-aware router, and how it is sized."""
    r = p.spec.router
    if p.router is None:
        why = "router.enabled false" if r.enabled is False else "one pod (router.enabled unset)"
        return f"Router: off ({why}); the Service spreads requests over the pods"
    s = p.router.sizing
    return (f"Router: smg, {r.replicas} pod(s), policy {r.policy}, discovers pods "
            f"{','.join(f'{k}={v}' for k, v in sorted(p.router.selector.items()))}; prefix tree "
            f"{s.tree_chars} characters, {s.cpu} CPUs, {format_bytes(s.memory_bytes)}")


def warm_cache(p: Plan) -> str:
    """What of the L3 cache survives an engine restart, a pod restart and a reschedule
    (``hicache_umbp.contract.persistence``: mori 1.2.4 measured, the hicache SSD tier by its
    restart tests; docs/operations.md)."""
    from hicache_umbp.contract.persistence import warm_cache_survival

    dram = p.sizing.dram_total > 0
    ssd = p.ssd.enabled
    kept = all(d.kind != "emptyDir" for d in p.ssd.drives)
    try:
        return warm_cache_survival(p.spec.l3.mode, dram=dram, ssd=ssd, ssd_engine=p.ssd.engine,
                                   ssd_volume_kept=kept).summary()
    except ValueError as e:  # no L3 tier (the plan was refused for it)
        return str(e)


def tier_tokens(p: Plan) -> str:
    """Each tier's capacity in tokens of one pod, from ``spec.model.kvBytesPerToken``: host pool,
    UMBP DRAM and SSD as :func:`~hicache_operator.planner.router_sizing.pod_tokens` counts them
    (``b`` bytes per token and rank; L3 ``T * b`` per token for mha, ``b`` for mla: one copy per
    pod), and the device pool ``G * floor(D / b)`` when the plan can estimate D
    (:func:`~hicache_operator.planner.kv_pools.compare_kv_pools`, needs model.weightsSize)."""
    spec, s = p.spec, p.sizing
    tp = attention_tp_size(spec)
    t = pod_tokens(s, tp, spec.model.attention == "mla")
    if t is None or s.page is None:
        return "unknown (set model.kvBytesPerToken)"
    parts = []
    pools = compare_kv_pools(spec, p.gpu_model)
    if pools is not None:
        b = s.page.page_bytes // s.page.page_size
        groups = max(s.ranks // max(tp, 1), 1)
        parts.append(f"device ~{groups * (pools.device_per_rank // b):,}")
    parts.append(f"host pool {t.host:,}")
    if s.dram_total:
        parts.append(f"UMBP DRAM {t.l3_dram:,}")
    if p.ssd.enabled:
        parts.append(f"SSD {t.l3_ssd:,}")
    return ", ".join(parts)


def sidecar_lines(p: Plan) -> list[str]:
    return [
        f"{c.name}: {shlex.join(standalone_server_command(SIDECAR_MEDIUM[c.name]))}"
        for c in p.sizing.containers[1:]
    ]
