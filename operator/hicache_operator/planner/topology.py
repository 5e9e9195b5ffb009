"""Ranks, GPUs and NUMA nodes of one pod on the assumed node.

The planner does not know which GPUs the device plugin will hand out; it assumes the best
aligned case (a pod that fits one NUMA node gets GPUs of one node) for display. The launcher
resolves each rank's real NUMA node in the pod from ``/sys/bus/pci/devices/<BDF>/numa_node``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hicache_umbp.contract.settings import HUGEPAGE_SIZES

from ..api.config import NodeFacts
from ..api.quantity import parse_bytes


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    gpu: int
    numa_node: int


TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


@dataclass(frozen=True)
class Hint:
    """A topology hint: the NUMA nodes a resource (or the merge) would use, and whether that
    is the narrowest such set (kubelet ``TopologyHint``)."""

    nodes: frozenset[int]
    preferred: bool

    def __str__(self) -> str:
        return "{" + ",".join(map(str, sorted(self.nodes))) + "}" + \
            (" preferred" if self.preferred else " not preferred")


def resource_hints(request: int, per_node: Sequence[int], single_only: bool = False,
                   ) -> list[Hint]:
    """The kubelet's hints for one resource: every set of NUMA nodes whose capacity covers the
    request, preferred when no smaller set does (device, CPU and memory managers alike).
    ``single_only``: the single-numa-node policy keeps only one-node hints."""
    nodes = range(len(per_node))
    fits = [frozenset(c) for k in range(1, len(per_node) + 1)
            for c in itertools.combinations(nodes, k) if sum(per_node[i] for i in c) >= request]
    if not fits:
        return []
    least = min(len(m) for m in fits)
    hints = [Hint(m, len(m) == least) for m in fits]
    return [h for h in hints if len(h.nodes) == 1] if single_only else hints


def merge_hints(providers: Sequence[Sequence[Hint]], numa_nodes: int) -> Hint:
    """The topology manager's merge (``pkg/kubelet/cm/topologymanager/policy.go``): over every
    combination of one hint per resource, the bitwise AND of the sets, preferred only when
    every hint is preferred *and* all sets are equal; the best is a preferred one over a
    non-preferred one, then the narrowest. No combination with a non-empty set: every node,
    not preferred."""
    best: Hint | None = None
    for combo in itertools.product(*providers):
        merged = frozenset(range(numa_nodes)).intersection(*(h.nodes for h in combo))
        if not merged:
            continue
        preferred = all(h.preferred for h in combo) and len({h.nodes for h in combo}) <= 1
        hint = Hint(merged, preferred)
        if best is None or (hint.preferred, -len(hint.nodes)) > (best.preferred,
                                                                  -len(best.nodes)):
            best = hint
    return best or Hint(frozenset(range(numa_nodes)), False)


def admits(policy: str, hint: Hint) -> bool:
    """Whether the policy admits a pod whose merged hint is ``hint``."""
    if policy in ("none", "best-effort"):
        return True
    if policy == "restricted":
        return hint.preferred
    return hint.preferred and len(hint.nodes) == 1


@dataclass(frozen=True)
class Admission:
    """One topology manager policy's verdict on the pod (one container's requests)."""

    policy: str
    hint: Hint
    admitted: bool
    reason: str


def topology_admission(gpus: int, cpus: int, memory_bytes: int,
                       hugepages: Mapping[int, int], facts: NodeFacts) -> dict[str, Admission]:
    """Each policy's merged hint and verdict for the engine container on the assumed node:
    GPUs per NUMA node from the node facts, CPUs and memory split evenly; memory and each
    hugepage size give hints only under the Static memory manager."""
    n = facts.numa_nodes
    gpu_per = [sum(1 for g in range(facts.gpus_per_node) if facts.numa_of_gpu(g) == i)
               for i in range(n)]
    requests: list[tuple[str, int, list[int]]] = [("amd.com/gpu", gpus, gpu_per),
                                                  ("cpu", cpus, [facts.cpus // n] * n)]
    if facts.memory_manager_policy == "Static":
        mem = facts.memory_bytes // n
        requests.append(("memory", memory_bytes, [mem] * n))
        requests += [(f"hugepages-{size}", b, [mem] * n) for size, b in hugepages.items() if b]
    out = {}
    for policy in TOPOLOGY_POLICIES:
        if policy == "none":
            out[policy] = Admission(policy, Hint(frozenset(range(n)), False), True,
                                    "no NUMA alignment")
            continue
        single = policy == "single-numa-node"
        hints = {name: resource_hints(req, per, single) for name, req, per in requests if req}
        merged = merge_hints(list(hints.values()), n) if all(hints.values()) else \
            Hint(frozenset(range(n)), False)
        ok = admits(policy, merged)
        detail = "; ".join(
            f"{name} {req} -> " + (", ".join(map(str, hints[name])) or "no hint")
            for name, req, _ in requests if req)
        out[policy] = Admission(policy, merged, ok, f"merged hint {merged} ({detail})")
    return out


@dataclass(frozen=True)
class Topology:
    ranks: tuple[RankPlacement, ...]
    numa_nodes_used: tuple[int, ...]
    single_numa_node_compatible: bool
    pods_per_node: int
    reasons: tuple[str, ...] = field(default=())
    pods_per_node_limited_by: tuple[str, ...] = field(default=())
    admission: Mapping[str, Admission] = field(default_factory=dict)

    @property
    def admitted_by(self) -> tuple[str, ...]:
        return tuple(p for p in TOPOLOGY_POLICIES if self.admission[p].admitted)


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
    engine_cpus: int = 0,
    engine_memory_bytes: int = 0,
    engine_hugepages: Mapping[int, int] | None = None,
) -> Topology:
    """Rank i -> GPU i -> NUMA node of GPU i, the single-numa-node verdict, pods per node.

    single-numa-node needs every resource of the pod (GPUs, CPUs, memory incl. hugepages) on one
    NUMA node: gpus_per_pod <= gpus_per_numa_node, cpus <= cpus / numa_nodes,
    memory + hugepages <= node memory / numa_nodes. ``memory_bytes_per_pod`` excludes hugepages.
    ``engine_*``: the engine container's requests, which the topology manager (scope
    ``container``, the default) aligns with its GPUs; :func:`topology_admission` gives each
    policy's verdict.
    """
    ranks = tuple(RankPlacement(r, r, facts.numa_of_gpu(r)) for r in range(gpus_per_pod))
    used = tuple(sorted({r.numa_node for r in ranks}))
    reasons: list[str] = []
    if gpus_per_pod > facts.gpus_per_numa_node:
        reasons.append(
            f"{gpus_per_pod} GPUs per pod span {len(used)} NUMA nodes "
            f"({facts.gpus_per_numa_node} GPUs per NUMA node on a {facts.gpu_model} node): "
            f"the single-numa-node Topology Manager policy rejects the pod "
            f"(TopologyAffinityError); use best-effort or <= "
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
        admission=topology_admission(
            gpus_per_pod, engine_cpus or cpus_per_pod, engine_memory_bytes or memory_bytes_per_pod,
            hugepages_per_pod if engine_hugepages is None else engine_hugepages, facts),
    )
