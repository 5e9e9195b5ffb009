"""Ranks, GPUs and NUMA nodes of one pod on the assumed node.

The planner does not know which GPUs the device plugin will hand out; it assumes the best
aligned case (a pod that fits one NUMA node gets GPUs of one node) for display. The launcher
resolves each rank's real NUMA node in the pod from ``/sys/bus/pci/devices/<BDF>/numa_node``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hicache_umbp.contract.settings import HUGEPAGE_SIZES

from ..api.config import NodeFacts
from ..api.quantity import parse_bytes


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    gpu: int
    numa_node: int


@dataclass(frozen=True)
class Topology:
    ranks: tuple[RankPlacement, ...]
    numa_nodes_used: tuple[int, ...]
    single_numa_node_compatible: bool
    pods_per_node: int
    reasons: tuple[str, ...] = field(default=())
    pods_per_node_limited_by: tuple[str, ...] = field(default=())


def pods_per_node(
    gpus_per_pod: int,
    cpus_per_pod: int,
    memory_bytes_per_pod: int,
    hugepages_per_pod: Mapping[int, int],
    facts: NodeFacts,
) -> tuple[int, tuple[str, ...]]:
    """How many pods of this size fit one node, and which node resources limit it.

    ``min(GPUs / g, CPUs / c, memory / (m + sum(h)), hugepages-<P> / h_P)``: node memory counts
    hugepages too; each hugepage size is counted only when the node facts declare its
    pre-allocated amount (``nodeFacts.hugepages``).
    """
    hp_total = sum(hugepages_per_pod.values())
    fits: dict[str, int] = {}
    if gpus_per_pod:
        fits["gpus"] = facts.gpus_per_node // gpus_per_pod
    if cpus_per_pod:
        fits["cpu"] = facts.cpus // cpus_per_pod
    if memory_bytes_per_pod + hp_total:
        fits["memory"] = facts.memory_bytes // (memory_bytes_per_pod + hp_total)
    for name, amount in facts.hugepages.items():
        page = HUGEPAGE_SIZES[name]
        if hugepages_per_pod.get(page):
            node = parse_bytes(amount, field=f"nodeFacts.hugepages.{name}")
            fits[f"hugepages-{name}"] = node // hugepages_per_pod[page]
    if not fits:
        return 0, ()
    least = min(fits.values())
    return least, tuple(sorted(k for k, v in fits.items() if v == least))


def plan_topology(
    gpus_per_pod: int,
    cpus_per_pod: int,
    memory_bytes_per_pod: int,
    hugepages_per_pod: Mapping[int, int],
    facts: NodeFacts,
) -> Topology:
    """Rank i -> GPU i -> NUMA node of GPU i, the single-numa-node verdict, pods per node.

    single-numa-node needs every resource of the pod (GPUs, CPUs, memory incl. hugepages) on one
    NUMA node: gpus_per_pod <= gpus_per_numa_node, cpus <= cpus / numa_nodes,
    memory + hugepages <= node memory / numa_nodes. ``memory_bytes_per_pod`` excludes hugepages.
    """
    ranks = tuple(RankPlacement(r, r, facts.numa_of_gpu(r)) for r in range(gpus_per_pod))
    used = tuple(sorted({r.numa_node for r in ranks}))
    reasons: list[str] = []
    if gpus_per_pod > facts.gpus_per_numa_node:
        reasons.append(
            f"{gpus_per_pod} GPUs per pod span {len(used)} NUMA nodes "
            f"({facts.gpus_per_numa_node} GPUs per NUMA node on a {facts.gpu_model} node): "
            f"the single-numa-node Topology Manager policy rejects the pod "
            f"(TopologyAffinityError); use best-effort/restricted or <= "
            f"{facts.gpus_per_numa_node} GPUs per pod"
        )
    cpus_per_numa = facts.cpus // facts.numa_nodes
    if cpus_per_pod > cpus_per_numa:
        reasons.append(f"{cpus_per_pod} CPUs per pod > {cpus_per_numa} CPUs per NUMA node")
    mem_per_numa = facts.memory_bytes // facts.numa_nodes
    total = memory_bytes_per_pod + sum(hugepages_per_pod.values())
    if total > mem_per_numa:
        reasons.append(f"{total} B memory+hugepages per pod > {mem_per_numa} B per NUMA node")
    fit, limited_by = pods_per_node(
        gpus_per_pod, cpus_per_pod, memory_bytes_per_pod, hugepages_per_pod, facts
    )
    return Topology(
        ranks=ranks,
        numa_nodes_used=used,
        single_numa_node_compatible=not reasons,
        pods_per_node=fit,
        reasons=tuple(reasons),
        pods_per_node_limited_by=limited_by,
    )
