"""Operator configuration: default images, the admin policy and the assumed node facts.

The Helm chart renders this as a YAML/JSON file and points ``SGLANG_HICACHE_OPERATOR_CONFIG`` at
it (not ``HICACHE_*``: that prefix is the pod's env contract). :func:`operator_config_schema` is the
JSON schema the chart's ``values.schema.json`` reuses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from .quantity import parse_bytes
from .types import GPU_MODEL_NAMES, ApiModel, GpuModelName, Quantity, Toleration

CONFIG_ENV = "SGLANG_HICACHE_OPERATOR_CONFIG"


class OperatorConfigError(ValueError):
    """The operator configuration file is unreadable or invalid."""


class AdminPolicy(ApiModel):
    """What a namespace user may obtain through an SGLangHiCache (allow-lists, deny by default)."""

    allowed_host_path_prefixes: list[str] = Field(
        default_factory=list,
        description="Host paths a CR may mount (SSD tier or model "
        "volume) must lie under one of these absolute prefixes; empty forbids hostPath.",
    )
    allow_privileged: bool = Field(default=False, description="Allow privileged engine containers.")
    allow_host_ipc: bool = Field(default=False, alias="allowHostIPC", description="Allow hostIPC.")
    allow_host_network: bool = Field(default=False, description="Allow hostNetwork.")
    allowed_capabilities: list[str] = Field(
        default_factory=lambda: ["IPC_LOCK", "SYS_NICE"],
        description="Capabilities the engine may get. A non-root engine never holds one "
        "(Kubernetes gives no ambient capabilities); they shape the container's "
        "RuntimeDefault seccomp profile: SYS_NICE, requested by default with numa: auto, "
        "lets the launcher bind host pools to NUMA nodes (mbind). IPC_LOCK, granted by "
        "default when listed, matters only to an engine run as root.",
    )
    max_hugepages_per_pod: Quantity = Field(
        default="2Ti", description="Upper bound of hugepages (all sizes) one pod may request."
    )
    allowed_gpu_models: list[GpuModelName] = Field(
        default_factory=lambda: list(GPU_MODEL_NAMES), description="GPU models CRs may target."
    )

    @property
    def max_hugepages_bytes(self) -> int:
        return parse_bytes(self.max_hugepages_per_pod, field="policy.maxHugepagesPerPod")


ENGINE_IMAGE_UID = 10001  # USER of images/engine/Dockerfile
Gid = Annotated[int, Field(ge=0, le=2**31 - 1)]


class EnginePodSecurity(ApiModel):
    """Identity of engine pods (pod securityContext), set by the admin, never by a CR.

    The engine image runs as uid 10001; pinning it here (with runAsNonRoot) means an image that
    switches back to root is refused by the kubelet instead of silently running as root. GPU
    device nodes (/dev/kfd, /dev/dri/renderD*) are usually mode 0660, group render (video on
    older hosts), and those group ids differ between host OS images: list the hosts' numeric
    gids in supplementalGroups when the image's own group entries do not match them.
    """

    run_as_non_root: bool = Field(
        default=True,
        description="Refuse to start engine containers whose user is root (runAsNonRoot).",
    )
    run_as_user: int | None = Field(
        default=ENGINE_IMAGE_UID,
        ge=0,
        le=2**31 - 1,
        description="uid of every engine pod container (runAsUser); null leaves it to the "
        "image (the engine image's USER is 10001).",
    )
    run_as_group: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Primary gid (runAsGroup); null leaves it to the image (gid 0).",
    )
    supplemental_groups: list[Gid] = Field(
        default_factory=list,
        max_length=32,
        description="Extra gids of engine processes (supplementalGroups): the GPU nodes' "
        "numeric render and video group ids (`getent group render video` on a node) when the "
        "GPU device nodes are not accessible to other users.",
    )
    fs_group: int | None = Field(
        default=ENGINE_IMAGE_UID,
        ge=0,
        le=2**31 - 1,
        description="Group that owns (and may write) the pod's PVC and emptyDir volumes "
        "(fsGroup, changed only when the volume root differs: fsGroupChangePolicy "
        "OnRootMismatch), so the non-root engine can write its SSD tier. hostPath volumes are "
        "not changed: the admin prepares their ownership. null disables it.",
    )

    @model_validator(mode="after")
    def _non_root_needs_a_non_root_uid(self) -> EnginePodSecurity:
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError(
                "runAsUser 0 (root) contradicts runAsNonRoot true: set runAsNonRoot false "
                "to run engines as root, or a non-zero runAsUser"
            )
        if len(set(self.supplemental_groups)) != len(self.supplemental_groups):
            raise ValueError(f"supplementalGroups {self.supplemental_groups} lists a gid twice")
        return self


def describe_errors(e: ValidationError) -> str:
    """``field.path: message; ...`` for a pydantic error (camelCase paths, as in the file)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()
    )


class NodeFacts(ApiModel):
    """The node the planner assumes when none is known (defaults: an MI355X node)."""

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "node facts") -> NodeFacts:
        if not isinstance(data, Mapping):
            raise OperatorConfigError(f"{source}: node facts must be a mapping")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise OperatorConfigError(
                f"{source}: invalid node facts: {describe_errors(e)}"
            ) from None

    gpu_model: GpuModelName = Field(default="MI355X", description="GPU model of the node.")
    gpus_per_node: int = Field(default=8, ge=1, le=64, description="GPUs per node.")
    numa_nodes: int = Field(
        default=2, ge=1, le=16, description="NUMA nodes (NPS1: one per socket)."
    )
    gpus_per_numa_node: int = Field(
        default=4, ge=1, le=64, description="GPUs attached to each NUMA node."
    )
    gpu_numa: list[int] | None = Field(
        default=None, description="NUMA node of GPU i (overrides the even split)."
    )
    cpus: int = Field(default=256, ge=1, description="Allocatable CPUs per node.")
    memory: Quantity = Field(
        default="3Ti", description="Allocatable memory per node, hugepages included."
    )
    hugepages: dict[Literal["2Mi", "1Gi"], Quantity] = Field(
        default_factory=dict,
        description="Hugepages pre-allocated on the node per page size (e.g. {2Mi: 2Ti}), "
        "for the pods-per-node count; empty: unknown (only the memory total is counted).",
    )
    topology_manager_policy: Literal["none", "best-effort", "restricted", "single-numa-node"] = (
        Field(default="best-effort", description="The kubelet's topologyManagerPolicy on these "
              "nodes; the plan says whether it admits the pod (restricted and "
              "single-numa-node reject a pod whose GPUs span NUMA nodes while its CPUs fit one)."))
    memory_manager_policy: Literal["None", "Static"] = Field(
        default="Static", description="The kubelet's memoryManagerPolicy: Static adds memory "
        "and hugepages NUMA hints to the topology manager's merge.")

    @property
    def memory_bytes(self) -> int:
        return parse_bytes(self.memory, field="nodeFacts.memory")

    def numa_of_gpu(self, gpu: int) -> int:
        if self.gpu_numa is not None and gpu < len(self.gpu_numa):
            return self.gpu_numa[gpu]
        return min(gpu // self.gpus_per_numa_node, self.numa_nodes - 1)


class CacheMetricsConfig(ApiModel):
    """How the operator reads each ready engine pod's SGLang metrics into ``status.cache``."""

    enabled: bool = Field(
        default=True,
        description="Start SGLang with --enable-metrics and scrape /metrics on its HTTP port "
        "on every resync (the operator must reach engine pods on that port).",
    )
    timeout_seconds: float = Field(
        default=2.0, gt=0, le=30, description="Time limit of one pod's scrape."
    )
    window_seconds: int = Field(
        default=300,
        ge=1,
        le=86400,
        description="Hit ratios cover the scrapes of the last this many seconds.",
    )
    max_pods_per_resync: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="Pods of one SGLangHiCache scraped per resync (larger ones rotate).",
    )
    max_concurrent_scrapes: int = Field(
        default=32, ge=1, le=1024, description="Scrapes in flight across all resources."
    )
    min_ratio_change: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="status.cache is rewritten only when a ratio moved by at least this much "
        "(0.02: two percentage points), so steady traffic causes no status writes.",
    )


class RolloutConfig(ApiModel):
    """How the operator runs in-place rollouts (updateStrategy InPlaceIfPossible)."""

    restart_timeout_seconds: int | None = Field(
        default=None,
        ge=10,
        le=86400,
        description="An in-place update fails (Degraded InPlaceUpdateFailed, the rollout "
        "stops) when the pod's engine container is still the old one this long after the "
        "update. Unset (the default): the pod's terminationGracePeriodSeconds plus 120 s, "
        "since the kubelet (a new image) and the hicache launcher's watcher (a new "
        "configuration) may each take the whole grace period to drain and stop the old engine "
        "(planner.pod_overhead: 835 s for the DeepSeek-R1 example). A value below the pod's "
        "grace period reports slow but legitimate restarts as failed.",
    )
    drain_grace_seconds: int = Field(
        default=35,
        ge=0,
        le=3600,
        description="After the operator sets a pod's readiness gate "
        "(hicache.sglang.ai/in-place-ready) False, it waits this long before it restarts the "
        "engine in place, so the Service's endpoints stop sending it requests first. The "
        "operator also takes the pod out of every router pod's worker list (smg keeps routing "
        "to a pod that is not Ready while its engine is healthy); its next Ready adds it back. "
        "Behind a router the engine also waits until the router has let the pod go: smg "
        "removes a drained worker's URL 5 s after the drain, so the operator waits 6 s from it.",
    )
    prepull: bool = Field(
        default=True,
        description="Pull a new engine image on each pod's node (a short-lived pull pod) "
        "before that pod's engine restarts: the kubelet stops the old container before it "
        "pulls, so without it the pull adds to the engine's downtime.",
    )
    prepull_timeout_seconds: int = Field(
        default=1800,
        ge=10,
        le=86400,
        description="A pull pod that has not pulled the image this long after it was made "
        "stops the rollout (Degraded InPlaceUpdateFailed); the engine keeps its old image.",
    )


class OperatorConfig(ApiModel):
    """Operator-wide settings (chart values)."""

    default_image: str = Field(
        default="ghcr.io/sglang-hicache/engine:0.1.0",
        min_length=1,
        description="Engine image (ROCm SGLang + amd-mori + backend) for CRs without spec.image.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Default image pull policy."
    )
    router_image: str = Field(
        default="ghcr.io/sglang-hicache/router:0.1.0",
        min_length=1,
        description="Router image (SGLang's model gateway smg, images/router) for CRs without "
        "spec.router.image.",
    )
    policy: AdminPolicy = Field(default_factory=AdminPolicy, description="Admin policy.")
    node_facts: NodeFacts = Field(default_factory=NodeFacts, description="Assumed node.")
    engine_pod_security: EnginePodSecurity = Field(
        default_factory=EnginePodSecurity,
        description="uid, gids and volume group of engine pods (pod securityContext).",
    )
    gpu_resource_name: str = Field(default="amd.com/gpu", description="Extended resource of a GPU.")
    gpu_tolerations: list[Toleration] = Field(
        default_factory=lambda: [
            Toleration(key="amd.com/gpu", operator="Exists", effect="NoSchedule")
        ],
        description="Tolerations added to every engine pod (GPU node taints).",
    )
    watch_namespaces: list[str] = Field(
        default_factory=list, description="Namespaces to watch; empty watches all."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Operator log level."
    )
    resync_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Every SGLangHiCache is reconciled again this often even when no event "
        "arrives: drift correction, status and the cache figures scraped from the pods (an "
        "unchanged world writes nothing). Read when the operator starts.",
    )
    cache_metrics: CacheMetricsConfig = Field(
        default_factory=CacheMetricsConfig,
        description="Scraping SGLang's cache metrics into status.cache.",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="In-place rollouts (updateStrategy InPlaceIfPossible).",
    )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "config") -> OperatorConfig:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise OperatorConfigError(
                f"{source}: invalid operator configuration: {describe_errors(e)}"
            ) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> OperatorConfig:
        """Load a YAML or JSON file (JSON is YAML); an empty file means all defaults."""
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise OperatorConfigError(f"{p}: cannot read operator configuration: {e}") from None
        if not isinstance(data, dict):
            raise OperatorConfigError(f"{p}: operator configuration must be a mapping")
        return cls.from_mapping(data, source=str(p))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """The file named by ``SGLANG_HICACHE_OPERATOR_CONFIG``, or defaults when unset."""
        env = os.environ if env is None else env
        path = env.get(CONFIG_ENV, "").strip()
        return cls.from_file(path) if path else cls()


def operator_config_schema() -> dict[str, Any]:
    """JSON schema of the configuration file (camelCase keys, defaults included)."""
    schema = OperatorConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def dump_schema() -> str:
    return json.dumps(operator_config_schema(), indent=2, sort_keys=True) + "\n"
