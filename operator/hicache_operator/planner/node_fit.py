"""Node fit: does a planned pod fit one node of the configured kind, and the admin's hugepage
limit (DESIGN §5: ``sum(hugepages) + sum(memory) <= node memory``, ``sum(cpu) <= node cpus``,
``R <= node GPUs``, ``sum(hugepages) <= policy.maxHugepagesPerPod``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hicache_umbp.contract.units import fmt_bytes

from ..api.config import OperatorConfig
from .errors import Problems


class PodTotals(Protocol):
    """What of a planned pod's sizing (:class:`.sizing.PodSizing`) the fit needs."""

    @property
    def hugepages_total(self) -> Mapping[int, int]: ...
    @property
    def memory_total(self) -> int: ...
    @property
    def cpu_total(self) -> int: ...
    @property
    def host_pool_per_rank(self) -> int: ...
    @property
    def dram_total(self) -> int: ...
    @property
    def ranks(self) -> int: ...


def check_node_fit(s: PodTotals, config: OperatorConfig, problems: Problems) -> None:
    """Every limit of the node and the policy the pod ``s`` exceeds, at the CR field to change."""
    facts, policy = config.node_facts, config.policy
    hp_total = sum(s.hugepages_total.values())
    node_mem = facts.memory_bytes
    if hp_total + s.memory_total > node_mem:
        # Point at the biggest contributor: the host pool, the UMBP DRAM or explicit memory.
        host = s.host_pool_per_rank * s.ranks
        path = "spec.hiCache.hostPoolPerRank" if host >= s.dram_total else "spec.l3.dram.capacity"
        problems.add(
            path,
            f"the pod needs hugepages {hp_total} B ({fmt_bytes(hp_total)}) + memory "
            f"{s.memory_total} B ({fmt_bytes(s.memory_total)}) = "
            f"{hp_total + s.memory_total} B, more than the node's {node_mem} B "
            f"({fmt_bytes(node_mem)}, {facts.gpu_model} node facts)",
        )
    max_hp = policy.max_hugepages_bytes
    if hp_total > max_hp:
        problems.add(
            "spec.hiCache.hostPoolPerRank",
            f"hugepages per pod {hp_total} B ({fmt_bytes(hp_total)}) exceed the admin policy "
            f"maxHugepagesPerPod {policy.max_hugepages_per_pod} ({max_hp} B)",
        )
    if s.cpu_total > facts.cpus:
        problems.add(
            "spec.resources.cpu",
            f"the pod needs {s.cpu_total} CPUs (all containers), the node has {facts.cpus}",
        )
    if s.ranks > facts.gpus_per_node:
        problems.add(
            "spec.engine",
            f"{s.ranks} GPUs per pod > {facts.gpus_per_node} GPUs on a {facts.gpu_model} node",
        )
