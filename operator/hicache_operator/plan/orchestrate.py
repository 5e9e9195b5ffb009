"""``plan()``: (CR, operator config, node facts) -> every Kubernetes object plus an explanation.

Pure: no API calls, no clock, no randomness; the same input gives byte-identical objects. Owner
references are left to the controller. Invalid input raises one :class:`SpecError` listing every
problem with its field path, and so does a built object the API server would refuse
(``object_checks``): a plan either holds only objects that can all be applied, or nothing.
``planner.summary`` renders a finished plan; this module does not depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from hicache_umbp.contract.media import l3_media, no_l3_tier
from hicache_umbp.contract.units import fmt_bytes

from ..api.config import NodeFacts, OperatorConfig
from ..api.quantity import format_bytes, parse_bytes
from ..api.spec import SGLangHiCacheSpec
from ..api.status import (
    CacheTier,
    PlanStatus,
    RankPlan,
    RouterTreePlan,
    TokensPerPod,
    TopologyPlan,
)
from ..builders import (
    BuildInput,
    build_client_service,
    build_configmap,
    build_headless_service,
    build_pdb,
    build_router_deployment,
    build_router_pdb,
    build_router_role,
    build_router_rolebinding,
    build_router_serviceaccount,
    build_statefulset,
)
from ..planner.engine import (
    EngineEnv,
    attention_tp_size,
    check_mla_l3,
    check_page_size,
    check_parallelism,
    check_user_args_and_env,
    mla_warnings,
    plan_engine_env,
)
from ..planner.errors import Problems, SpecError
from ..planner.k8s_checks import check_pod_inputs, model_path_warnings
from ..planner.kv_pools import compare_kv_pools
from ..planner.l3_staging import staging_warnings
from ..planner.object_checks import check_objects
from ..planner.page_geometry import page_geometry
from ..planner.placement import (
    GPU_MODELS,
    GpuModel,
    pod_affinity,
    pod_tolerations,
    tolerates_unhealthy,
)
from ..planner.pod_security import Level, check_pod_security, resolve_level
from ..planner.rollout import rollout_warnings
from ..planner.router import RouterPlan, plan_router, router_pod_labels, router_warnings
from ..planner.security import check_security, granted_capabilities, security_warnings
from ..planner.sizing import PodSizing, size_pod
from ..planner.ssd import SsdLayout, plan_ssd
from ..planner.topology import Topology, plan_topology
from ..planner.validate import parse_cr

#: An SSD emptyDir above this is no cache a node's root disk should hold (warned).
EMPTYDIR_SSD_MAX = 64 * 1024**3


class _NoAliasDumper(yaml.SafeDumper):
    """Manifests spell every value out (no &anchors/*aliases for shared sub-objects)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class Plan:
    name: str
    namespace: str
    spec: SGLangHiCacheSpec
    config: OperatorConfig
    gpu_model: GpuModel
    sizing: PodSizing
    ssd: SsdLayout
    engine: EngineEnv
    topology: Topology
    objects: list[dict[str, Any]]
    status_plan: dict[str, Any]
    warnings: list[str]
    router: RouterPlan | None = None

    def manifests_yaml(self) -> str:
        return "".join(
            "---\n" + yaml.dump(o, Dumper=_NoAliasDumper, sort_keys=False, width=100)
            for o in self.objects
        )

    def cache_tiers(self) -> list[dict[str, Any]]:
        """The ``status.cache.tiers`` block: planned capacity per tier and pod."""
        tiers = [CacheTier(tier="Host", capacity_bytes=self.sizing.host_pool_per_rank
                           * self.sizing.ranks)]
        if self.sizing.dram_total:
            tiers.append(CacheTier(tier="L3-DRAM", capacity_bytes=self.sizing.dram_total))
        if self.ssd.enabled:
            tiers.append(CacheTier(tier="L3-SSD", capacity_bytes=self.ssd.capacity))
        return [t.model_dump(by_alias=True, exclude_none=True) for t in tiers]

    @property
    def ssd_claim_sizes(self) -> dict[str, int]:
        """Size of each per-pod SSD claim template (volumeClaimTemplates) by name."""
        return self.ssd.claim_sizes if self.ssd.enabled else {}


def plan(
    cr: Mapping[str, Any], config: OperatorConfig, node_facts: NodeFacts | None = None,
    *, router_serving: bool = True, pod_security: str | None = None,
) -> Plan:
    """Plan every object of one SGLangHiCache; raises :class:`SpecError` on invalid input.

    ``router_serving``: whether the client Service may send requests to the router already;
    the controller passes False until the router's Deployment has an available pod (or the
    Service already points at it), so turning the router on never leaves the Service without
    endpoints. The default plans the steady state.

    ``pod_security``: the value of the CR namespace's ``pod-security.kubernetes.io/enforce``
    label (``None``: no label, or not read: privileged). The pods are rendered with what that
    level admits; what they still need beyond it raises a :class:`SpecError` with reason
    ``PodSecurityRejects`` naming the level the namespace must allow and why."""
    problems = Problems()
    parsed = parse_cr(cr, problems)
    if parsed is None:
        if not problems:  # pragma: no cover - parse_cr always explains a None
            problems.add("<root>", "invalid CR")
        problems.raise_if_any()
    assert parsed is not None
    if node_facts is not None:
        config = config.model_copy(update={"node_facts": node_facts})
    spec, policy = parsed.spec, config.policy

    check_security(spec, policy, problems)
    check_user_args_and_env(spec, problems)
    check_pod_inputs(spec, problems)
    ranks = check_parallelism(spec, problems)
    check_mla_l3(spec, problems)
    if spec.l3.mode == "standalone" and parse_bytes(spec.l3.dram.capacity) == 0:
        problems.add(
            "spec.l3.dram.capacity",
            "standalone mode always runs a DRAM server (mori serves one medium per "
            "server and the store connects to dram.sock): set a capacity > 0",
        )
    if not l3_media(spec.l3.mode, dram=parse_bytes(spec.l3.dram.capacity) > 0,
                    ssd=spec.l3.ssd.enabled):
        problems.add("spec.l3", no_l3_tier(dram="l3.dram.capacity", ssd="l3.ssd"))
    ssd = plan_ssd(spec, ranks, policy, problems)
    page = page_geometry(spec, attention_tp_size(spec), problems)
    sizing = size_pod(
        spec, ranks, ssd.capacity if ssd.enabled else 0, config, problems, page=page
    )
    check_page_size(spec, parsed.namespace, parsed.name, sizing, ssd, problems)
    router = plan_router(spec, parsed.namespace, _engine_selector(parsed.name), sizing, problems,
                         router_pod_labels(parsed.name))
    engine = (
        plan_engine_env(
            spec, parsed.namespace, parsed.name, sizing, ssd, problems,
            enable_metrics=config.cache_metrics.enabled,
        )
        if not problems
        else None
    )
    problems.raise_if_any()
    assert engine is not None

    facts = config.node_facts
    engine_c = sizing.engine
    topology = plan_topology(
        ranks, sizing.cpu_total, sizing.memory_total, sizing.hugepages_total, facts,
        engine_cpus=engine_c.cpu, engine_memory_bytes=engine_c.memory_bytes,
        engine_hugepages=engine_c.hugepages,
    )
    model = GPU_MODELS[spec.placement.gpu_model]
    tolerations = pod_tolerations(spec.placement, config)
    level, level_warning = resolve_level(pod_security)
    warnings = _warnings(spec, config, ssd, sizing, topology, tolerations, level)
    warnings.extend(level_warning)
    warnings.extend(router_warnings(spec, router))
    build = BuildInput(
        name=parsed.name,
        namespace=parsed.namespace,
        spec=spec,
        config=config,
        sizing=sizing,
        ssd=ssd,
        engine=engine,
        affinity=pod_affinity(spec.placement, model),
        tolerations=tolerations,
        capabilities=granted_capabilities(spec, policy, level),
        router=router,
        router_serving=router_serving,
    )
    objects = [
        build_configmap(build),
        build_headless_service(build),
        build_client_service(build),
        # A one-pod budget of maxUnavailable 1 protects nothing: planned only from 2 replicas,
        # so scaling down to 1 prunes it.
        *([build_pdb(build)] if spec.replicas > 1 else []),
        *([build_router_serviceaccount(build), build_router_role(build),
           build_router_rolebinding(build), build_router_deployment(build)]
          if router is not None else []),
        *([build_router_pdb(build)] if router is not None and spec.router.replicas > 1 else []),
        build_statefulset(build),
    ]
    check_objects(objects, problems)
    problems.raise_if_any()
    check_pod_security(objects, parsed.namespace, level, problems)
    problems.raise_if_any("PodSecurityRejects")
    status_plan = _status_plan(sizing, topology, warnings, router)
    return Plan(
        name=parsed.name,
        namespace=parsed.namespace,
        spec=spec,
        config=config,
        gpu_model=model,
        sizing=sizing,
        ssd=ssd,
        engine=engine,
        topology=topology,
        objects=objects,
        status_plan=status_plan,
        warnings=warnings,
        router=router,
    )


def _engine_selector(name: str) -> dict[str, str]:
    """The engine pods' labels (``BuildInput.selector``), which the router discovers."""
    return {"app.kubernetes.io/name": "sglang-hicache", "app.kubernetes.io/instance": name}


def _warnings(
    spec: SGLangHiCacheSpec,
    config: OperatorConfig,
    ssd: SsdLayout,
    sizing: PodSizing,
    topology: Topology,
    tolerations: list[dict[str, Any]],
    level: Level = "privileged",
) -> list[str]:
    out: list[str] = []
    facts = config.node_facts
    if facts.gpu_model != spec.placement.gpu_model:
        out.append(
            f"node facts describe a {facts.gpu_model} node but the CR targets "
            f"{spec.placement.gpu_model}: sizing checks use the {facts.gpu_model} facts"
        )
    if not topology.single_numa_node_compatible:
        out.extend(
            f"incompatible with the single-numa-node Topology Manager policy: {r}"
            for r in topology.reasons
        )
    verdict = topology.admission[facts.topology_manager_policy]
    if not verdict.admitted:
        out.append(
            f"the nodes' topologyManagerPolicy {facts.topology_manager_policy} rejects the "
            f"engine container (TopologyAffinityError, pod Failed): {verdict.reason}; "
            f"policies that admit it: {', '.join(topology.admitted_by)}"
        )
    if topology.pods_per_node == 0:
        out.append(
            f"no {facts.gpu_model} node of the assumed node facts fits one pod (short of "
            f"{', '.join(topology.pods_per_node_limited_by)}): pods stay Pending"
        )
    lost = sizing.dram_requested - sizing.dram_total
    if spec.l3.mode == "embedded" and sizing.dram_page and lost > 0:
        out.append(
            f"l3.dram.capacity {spec.l3.dram.capacity} over {sizing.ranks} ranks rounds down "
            f"to whole {format_bytes(sizing.dram_page)} pages: "
            f"{format_bytes(sizing.dram_per_rank)} per rank, "
            f"{format_bytes(sizing.dram_total)} in total ({fmt_bytes(lost)} less than asked); "
            f"use a multiple of {sizing.ranks} x {format_bytes(sizing.dram_page)}"
        )
    strategy = spec.update_strategy.rolling_update
    if strategy is not None and spec.replicas and strategy.partition >= spec.replicas:
        out.append(
            f"updateStrategy.rollingUpdate.partition {strategy.partition} >= replicas "
            f"{spec.replicas}: no pod is updated to a new template until it is lowered"
        )
    pools = compare_kv_pools(spec, GPU_MODELS[spec.placement.gpu_model])
    if pools is not None and not pools.fits:
        out.append(pools.warning(spec, GPU_MODELS[spec.placement.gpu_model]))
    out.extend(rollout_warnings(spec))
    out.extend(model_path_warnings(spec))
    out.extend(mla_warnings(spec))
    out.extend(staging_warnings(spec, sizing.page, sizing.ssd_total, sizing.ranks))
    if tolerates_unhealthy(tolerations):
        out.append(
            "a toleration matches the amd-gpu-unhealthy taint: pods may land on GPUs "
            "the AMD GPU operator marked unhealthy"
        )
    if ssd.enabled and ssd.ephemeral_bytes > EMPTYDIR_SSD_MAX:
        out.append(
            f"the SSD tier is an emptyDir of {fmt_bytes(ssd.ephemeral_bytes)} per pod: it "
            f"lives on the kubelet's root disk (ephemeral-storage), which {spec.replicas} "
            f"pod(s) share with images and logs; use l3.ssd.volume.claimTemplate on a "
            f"local-NVMe StorageClass"
        )
    if ssd.enabled and ssd.volume_bytes is None:
        out.append(
            "hostPath SSD without size: capacity is not checked here; the launcher "
            "checks free space in the pod"
        )
    identity = config.engine_pod_security
    host_path = any(d.kind == "hostPath" for d in ssd.drives)
    if ssd.enabled and host_path and identity.run_as_user not in (None, 0):
        out.append(
            f"hostPath SSD: the kubelet applies no fsGroup to hostPath volumes, so the "
            f"directory must be writable by uid {identity.run_as_user} on every node "
            f"(docs/install.md, engine pod identity)"
        )
    out.extend(security_warnings(spec, config.policy, config.engine_pod_security, level))
    return out


def _status_plan(sizing: PodSizing, topology: Topology, warnings: list[str],
                 router: RouterPlan | None = None) -> dict[str, Any]:
    ranks = [
        RankPlan(
            rank=r.rank,
            gpu=r.gpu,
            numa_node=r.numa_node,
            host_pool_bytes=sizing.host_pool_per_rank,
            dram_bytes=sizing.dram_per_rank,
            ssd_bytes=sizing.ssd_per_rank,
        )
        for r in topology.ranks
    ]
    status = PlanStatus(
        gpus_per_pod=sizing.ranks,
        ranks_per_pod=sizing.ranks,
        cpu_per_pod=sizing.cpu_total,
        memory_per_pod=format_bytes(sizing.memory_total),
        hugepages_per_pod=sizing.hugepages_display(),
        shm_size=format_bytes(sizing.shm_bytes),
        host_pool_bytes_per_rank=sizing.host_pool_per_rank,
        dram_bytes=sizing.dram_total,
        ssd_bytes=sizing.ssd_total,
        ranks=ranks,
        topology=TopologyPlan(
            single_numa_node_compatible=topology.single_numa_node_compatible,
            admitted_by=list(topology.admitted_by),
            reasons=list(topology.reasons),
            pods_per_node=topology.pods_per_node,
            pods_per_node_limited_by=list(topology.pods_per_node_limited_by),
        ),
        warnings=warnings,
        router=None if router is None else RouterTreePlan(
            tree_chars=router.sizing.tree_chars,
            sized_for_pods=router.sizing.pods,
            tokens_per_pod=None if router.sizing.pod_tokens is None else TokensPerPod(
                host=router.sizing.pod_tokens.host, l3_dram=router.sizing.pod_tokens.l3_dram,
                l3_ssd=router.sizing.pod_tokens.l3_ssd, total=router.sizing.pod_tokens.total),
            memory=format_bytes(router.sizing.memory_bytes),
        ),
    )
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


__all__ = ["Plan", "SpecError", "plan"]
