"""``SGLangHiCache`` status: written by the controller, ``plan`` filled from the planner."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .types import ApiModel

Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Invalid"]
ConditionType = Literal["SpecValid", "Ready", "Progressing", "Degraded"]

class Condition(ApiModel):
    """A standard Kubernetes condition."""

    type: str = Field(description="SpecValid, Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="Condition status.")
    reason: str = Field(default="", description="CamelCase reason, e.g. TopologyAffinityError.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="Generation the condition is about."
    )


class RankPlan(ApiModel):
    """One rank of a pod as planned."""

    rank: int = Field(description="Local rank (SGLang worker) in the pod.")
    gpu: int = Field(description="GPU index assumed for this rank.")
    numa_node: int = Field(
        description="NUMA node of that GPU on the assumed node (the "
        "launcher resolves the real one in the pod)."
    )
    host_pool_bytes: int = Field(description="L2 host pool bytes (0: sized by ratio).")
    dram_bytes: int = Field(description="UMBP DRAM bytes for this rank (embedded mode).")
    ssd_bytes: int = Field(description="UMBP SSD bytes for this rank (embedded mode).")


class TopologyPlan(ApiModel):
    """How the pod fits the node's NUMA topology."""

    single_numa_node_compatible: bool = Field(
        description="Whether the pod can pass the single-numa-node Topology Manager policy."
    )
    reasons: list[str] = Field(default_factory=list, description="Why not, when not.")
    admitted_by: list[str] = Field(
        default_factory=list,
        description="Topology Manager policies that admit the engine container on the assumed "
        "node: the kubelet's hint merge of its GPUs, CPUs and (Static memory manager) memory "
        "and hugepages.")
    pods_per_node: int = Field(
        description="Pods of this size that fit one node (GPUs, CPUs, memory and hugepages "
        "of the assumed node facts)."
    )
    pods_per_node_limited_by: list[str] = Field(
        default_factory=list, description="The node resources that limit podsPerNode."
    )


class TokensPerPod(ApiModel):
    """Tokens one engine pod can serve a prefix hit from, per tier (planner.sizing)."""

    host: int = Field(description="In the L2 host pools.")
    l3_dram: int = Field(description="In the UMBP DRAM tier.")
    l3_ssd: int = Field(description="In the UMBP SSD tier.")
    total: int = Field(
        description="host + max(l3Dram, l3Ssd) (the SSD tier holds what DRAM holds)."
    )


class RouterTreePlan(ApiModel):
    """The router's prefix tree as planned from the pods' cache capacity."""

    tree_chars: int = Field(description="--max-tree-size (characters of request text).")
    sized_for_pods: int = Field(description="Engine pods the tree is sized for.")
    tokens_per_pod: TokensPerPod | None = Field(
        default=None, description="Capacity per pod (absent: model.kvBytesPerToken unset)."
    )
    memory: str = Field(description="Router memory (requests == limits).")


class PlanStatus(ApiModel):
    """What the operator computed for each pod (plain bytes and Kubernetes quantities)."""

    gpus_per_pod: int = Field(description="GPUs per pod.")
    ranks_per_pod: int = Field(description="SGLang ranks per pod.")
    cpu_per_pod: int = Field(description="Whole CPUs per pod, all containers.")
    memory_per_pod: str = Field(description="Memory per pod (non-hugepage), all containers.")
    hugepages_per_pod: str = Field(description="Hugepages per pod, e.g. '1600Gi (2Mi)'.")
    shm_size: str = Field(description="/dev/shm size.")
    host_pool_bytes_per_rank: int = Field(description="L2 host pool per rank in bytes.")
    dram_bytes: int = Field(description="UMBP DRAM bytes per pod.")
    ssd_bytes: int = Field(description="UMBP SSD bytes per pod.")
    ranks: list[RankPlan] = Field(default_factory=list, description="Per-rank plan.")
    topology: TopologyPlan = Field(description="NUMA fit.")
    warnings: list[str] = Field(default_factory=list, description="Planner warnings.")
    router: RouterTreePlan | None = Field(default=None, description="The router's tree.")


class CacheTier(ApiModel):
    """Planned capacity of one cache tier, per pod."""

    tier: Literal["Host", "L3-DRAM", "L3-SSD"] = Field(
        description="Host: SGLang's L2 host pool (all ranks); L3-DRAM and L3-SSD: UMBP."
    )
    capacity_bytes: int = Field(description="Capacity per pod in bytes.")


class CacheHitRatio(ApiModel):
    """Share of prompt tokens served from cache over the last window (0..1)."""

    total: float | None = Field(default=None, description="From any cache tier.")
    device: float | None = Field(default=None, description="From the GPU KV cache.")
    host: float | None = Field(default=None, description="From the L2 host pool.")
    storage: float | None = Field(
        default=None, description="From L3 (UMBP DRAM and SSD together, as SGLang counts it)."
    )
    l3_dram: float | None = Field(
        default=None,
        description="From L3's UMBP DRAM tier: storage's share of the pages the store served "
        "from DRAM (hicache_umbp_l3_read_pages_total{tier=dram}) over the same window.",
    )
    l3_ssd: float | None = Field(
        default=None,
        description="From L3's SSD tier: storage's share of the pages the store served from "
        "SSD (hicache_umbp_l3_read_pages_total{tier=ssd}) over the same window.",
    )


class SsdCacheStatus(ApiModel):
    """The SSD tier as the store reports it (engine hicache), all pods together."""

    read_bytes_per_second: int | None = Field(
        default=None,
        description="Read bandwidth over the last window: bytes read / wall time of the read "
        "batches (the speed of a read while it runs, not utilisation).",
    )
    write_bytes_per_second: int | None = Field(
        default=None, description="Write bandwidth over the last window, likewise."
    )
    pages: int | None = Field(default=None, description="Page parts held on the pods' drives.")
    capacity_pages: int | None = Field(
        default=None, description="Slots on the pods' drives (page parts they can hold)."
    )
    evictions: int | None = Field(
        default=None, description="Page parts evicted for new ones in the last window."
    )
    read_errors: int | None = Field(
        default=None,
        description="Page parts the disk failed to read in the last window (served as misses).",
    )
    write_errors: int | None = Field(
        default=None,
        description="Page parts the disk failed to write in the last window (reported not "
        "stored; l3Writes is Failing and the HiCacheSsdErrors alert fires).",
    )


class CacheStatus(ApiModel):
    """The cache: planned capacity per tier and what the engines report (``--enable-metrics``)."""

    tiers: list[CacheTier] = Field(default_factory=list, description="Capacity per tier.")
    hit_ratio: CacheHitRatio | None = Field(
        default=None,
        description="Hit ratios by tier over the last windowSeconds, all pods together; "
        "rewritten only when one moves by the operator's minRatioChange.",
    )
    host_used_ratio: float | None = Field(
        default=None, description="Share of the L2 host pools in use, all pods together."
    )
    l3_writes: Literal["Ok", "Failing"] | None = Field(
        default=None,
        description="Failing when L3 stores fewer than half the pages written to L2 (or "
        "drops backups, or the SSD tier's disk fails writes): the UMBP store refuses writes "
        "(an Event says so).",
    )
    ssd: SsdCacheStatus | None = Field(
        default=None,
        description="The SSD tier's bandwidth, fill and errors (engine hicache); rewritten "
        "only when a figure moves by minRatioChange of itself, or an error count changes.",
    )
    window_seconds: int | None = Field(default=None, description="Window of the ratios.")
    pods: int | None = Field(default=None, description="Pods whose metrics were read.")
    message: str | None = Field(
        default=None, description="Why some pods' metrics could not be read."
    )


class RouterStatus(ApiModel):
    """The router as observed: its pods and the engine pods it routes to."""

    replicas: int = Field(description="Router pods that exist.")
    ready_replicas: int = Field(description="Router pods that are ready.")
    serving: bool = Field(description="Whether the CR's Service sends requests to the router.")
    workers: int | None = Field(
        default=None,
        description="Engine pods the router routes to now: healthy workers in its own worker "
        "list (GET /workers), read on each resync.",
    )
    ready_pods: int | None = Field(
        default=None, description="Ready engine pods (the set the router should route to)."
    )
    missing_pods: list[str] = Field(
        default_factory=list,
        description="Ready engine pods that are not among the router's healthy workers.",
    )
    message: str | None = Field(default=None, description="Why the workers are unknown.")
class RolloutStatus(ApiModel):
    """A rollout in progress (absent when every pod runs the desired template)."""

    method: Literal["InPlace", "Replace"] = Field(
        description="InPlace: the operator restarts the engine container of each pod in place "
        "(updateStrategy InPlaceIfPossible, engine-only change); Replace: the StatefulSet "
        "replaces the pods."
    )
    revision: str | None = Field(
        default=None,
        description="The StatefulSet revision rolled out (status.updateRevision; empty until "
        "the StatefulSet controller has seen the new template).",
    )
    image: str = Field(description="The engine image rolled out.")
    config_hash: str = Field(description="The engine configuration revision rolled out.")
    reason: str = Field(
        description="What changes (InPlace), or why the pods must be replaced (Replace)."
    )
    updated_pods: int = Field(description="Pods on the new revision (restarted or replaced).")
    pods: int = Field(description="Pods this rollout updates (ordinal >= partition).")
    restarting: list[str] = Field(
        default_factory=list, description="Pods whose engine restarts in place now."
    )
    preparing: list[str] = Field(
        default_factory=list,
        description="Pods getting ready for their in-place restart: the new image being pulled "
        "on their node, or out of rotation (readiness gate False) for drainGraceSeconds.",
    )
    waiting: str | None = Field(
        default=None,
        description="Why no pod is restarted now although some are due (e.g. the router's "
        "worker list cannot be read, so which pods serve is unknown).",
    )
    failed_pod: str | None = Field(
        default=None, description="The pod whose in-place update failed (the rollout stops)."
    )
    failure: str | None = Field(default=None, description="Why it failed.")


class SGLangHiCacheStatus(ApiModel):
    """Observed state."""

    observed_generation: int | None = Field(default=None, description="Last generation acted on.")
    phase: Phase | None = Field(
        default=None, description="Pending, Progressing, Ready, Degraded or Invalid."
    )
    replicas: int | None = Field(
        default=None, description="Pods that exist (read by the scale subresource)."
    )
    ready_replicas: int | None = Field(default=None, description="Pods that are ready.")
    message: str | None = Field(default=None, description="Short human summary.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    plan: PlanStatus | None = Field(default=None, description="The computed plan.")
    cache: CacheStatus | None = Field(
        default=None, description="Cache capacity per tier and live hit ratios."
    )
    router: RouterStatus | None = Field(
        default=None, description="The router and the pods it serves (absent: no router)."
    )
    rollout: RolloutStatus | None = Field(
        default=None,
        description="The rollout in progress: how (in place or by replacing pods), why, and "
        "how far.",
    )
