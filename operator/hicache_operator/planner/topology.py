"""Ranks, GPUs and NUMA nodes of one pod on the assumed node.

The planner does not know which GPUs the device plugin will hand out; it assumes the best
aligned case (a pod that fits one NUMA node gets GPUs of one node) for display. The launcher
resolves each rank's real NUMA node in the pod from ``/sys/bus/pci/devices/<BDF>/numa_node``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api.config import NodeFacts


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


def plan_topology(
    gpus_per_pod: int, cpus_per_pod: int, memory_bytes_per_pod: int, facts: NodeFacts
) -> Topology:
    """Rank i -> GPU i -> NUMA node of GPU i, and the single-numa-node verdict.

    single-numa-node needs every resource of the pod (GPUs, CPUs, memory incl. hugepages) on one
    NUMA node: gpus_per_pod <= gpus_per_numa_node, cpus <= cpus / numa_nodes,
    memory <= node memory / numa_nodes.
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
    if memory_bytes_per_pod > mem_per_numa:
        reasons.append(
            f"{memory_bytes_per_pod} B memory+hugepages per pod > {mem_per_numa} B per NUMA node"
        )
    return Topology(
        ranks=ranks,
        numa_nodes_used=used,
        single_numa_node_compatible=not reasons,
        pods_per_node=facts.gpus_per_node // gpus_per_pod if gpus_per_pod else 0,
        reasons=tuple(reasons),
    )
