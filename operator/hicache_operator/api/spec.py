"""``SGLangHiCache`` spec: the typed models the CRD is generated from and the planner reads.

Field-level rules (types, enums, ranges, quantity syntax) live on the fields; cross-field rules
are CEL ``x-kubernetes-validations`` on the model they concern (evaluated by the API server) and
are re-checked by the planner (``planner.validate``), which also knows the operator's policy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .k8s import Affinity, EnvVarSource, ModelVolumeSource, UpdateStrategy
from .l3 import BUILTIN_PREFAULT_THREADS_MESSAGE, L3
from .router import Router
from .types import (
    DNS1123_SUBDOMAIN,
    ApiModel,
    AutoCpu,
    AutoQuantity,
    GpuModelName,
    HugePageSize,
    Quantity,
    Toleration,
    cel_rules,
)

MODEL_VOLUME_KINDS = tuple(str(f.alias) for f in ModelVolumeSource.model_fields.values())
#: 16 MiB of KV cache per token: 30x Llama-3.1-405B in bf16 (516,096 B), so only a typo hits it.
MAX_KV_BYTES_PER_TOKEN = 16 * 1024 * 1024
KV_BYTES_NEEDS_ATTENTION = (
    "kvBytesPerToken needs attention mha or mla: the page geometry differs (mha: K and V "
    "parts of each rank's heads; mla: one latent part replicated on every rank), so auto "
    "cannot size it"
)
KV_HEADS_NEEDS_MHA = "kvHeads applies to attention mha with kvBytesPerToken only"


class EnvVar(ApiModel):
    """An environment variable for the engine container (core/v1 EnvVar)."""

    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name; names the operator owns (HICACHE_*, UMBP_*, POD_NAME, "
        "POD_NAMESPACE, SGLANG_DP_RANK, SGLANG_DP_SIZE, SGLANG_SET_CPU_AFFINITY, "
        "SGLANG_HICACHE_HOST_*) are rejected.",
    )
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Source for the value (core/v1 EnvVarSource)."
    )


class ModelSource(ApiModel):
    """Which model SGLang serves and where its weights come from."""

    model_config = cel_rules(
        (
            "!has(self.volume) || "
            + " + ".join(f"(has(self.volume.{k}) ? 1 : 0)" for k in MODEL_VOLUME_KINDS)
            + " == 1",
            "volume must hold exactly one volume source (" + ", ".join(MODEL_VOLUME_KINDS) + ")",
        ),
        (
            "!has(self.kvBytesPerToken) || (has(self.attention) && self.attention != 'auto')",
            KV_BYTES_NEEDS_ATTENTION,
        ),
        (
            "!has(self.kvHeads) || (has(self.kvBytesPerToken) && has(self.attention) && "
            "self.attention == 'mha')",
            KV_HEADS_NEEDS_MHA,
        ),
    )

    path: str = Field(
        min_length=1,
        max_length=1024,
        description="Model id or path handed to SGLang --model-path. With a volume, a path "
        "under mountPath (e.g. /models/DeepSeek-R1); without one, a Hugging Face id.",
    )
    volume: ModelVolumeSource | None = Field(
        default=None,
        description="Volume source holding the weights (one of persistentVolumeClaim, nfs, "
        "csi, hostPath, image, ephemeral), mounted read-only at mountPath. hostPath is accepted "
        "only under a prefix the operator's admin policy allows.",
    )
    mount_path: str = Field(
        default="/models",
        pattern=r"^/[^:]*$",
        max_length=512,
        description="Where the model volume is mounted in the engine container; not a path "
        "the operator mounts itself (/dev/shm, /var/run/hicache, /var/run/umbp, /mnt/umbp-ssd, "
        "/var/run/hicache-pod) nor inside or above one.",
    )
    attention: Literal["auto", "mha", "mla"] = Field(
        default="auto",
        description="The model's attention KV layout: mla (multi-head latent attention: "
        "DeepSeek-V2/V3/R1, Kimi K2; one latent KV cache replicated on every TP rank), mha "
        "(every other model; each TP rank holds its own heads) or auto (the engine finds out "
        "at start). With mla and attention tensor parallelism > 1 the L3 tier must be one "
        "store per pod (l3.mode standalone), which the operator then checks at admission; "
        "with auto the engine refuses to start in that case.",
    )
    kv_bytes_per_token: int | None = Field(
        default=None,
        ge=1,
        le=MAX_KV_BYTES_PER_TOKEN,
        description="KV cache bytes of one token for the whole model: every layer, every KV "
        "head, in the KV cache dtype (SGLang --kv-cache-dtype; auto is the model dtype unless "
        "the checkpoint quantizes the KV cache: bf16 2 B, fp8 1 B). mha: layers x KV heads x "
        "head dim x dtype bytes x 2 (K and V), e.g. Llama-3.1-70B bf16 80 x 8 x 128 x 2 x 2 = "
        "327680; mla: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes, e.g. "
        "DeepSeek-R1 bf16 61 x (512 + 64) x 2 = 70272. Needs attention mha or mla. With it "
        "the operator knows the page part each rank's host pool registers (mha: pageSize x "
        "kvBytesPerToken / 2 / attention-TP ranks, K and V parts; mla: pageSize x "
        "kvBytesPerToken, one part replicated on every rank), sizes the L3 staging memory and "
        "the umbp-ssd sidecar's slots from it and refuses a pageSize no L3 tier can hold; "
        "without it staging is sized for 8 MiB page parts.",
    )
    kv_heads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="mha only: the model's KV heads (num_key_value_heads). Needed when they "
        "are fewer than the attention tensor-parallel ranks: SGLang then keeps one whole head "
        "on every rank, so a page part is pageSize x kvBytesPerToken / 2 / kvHeads (e.g. "
        "Qwen3-235B-A22B, 4 KV heads at TP 8); unset, the heads are taken to split evenly "
        "over the attention-TP ranks.",
    )
    weights_size: Quantity | None = Field(
        default=None,
        description="Size of the model's weights as loaded on the GPUs, all ranks together "
        "(e.g. 132Gi for Llama-3.1-70B bf16, 642Gi for DeepSeek-R1 FP8). With "
        "kvBytesPerToken it lets the operator estimate the GPU's KV pool per rank (HBM x "
        "--mem-fraction-static - weights / TP) and warn when the host pool per rank is "
        "smaller, with the size that fits.",
    )


class Engine(ApiModel):
    """SGLang server parallelism and serving options."""

    model_config = cel_rules(
        (
            "!has(self.enableDpAttention) || !self.enableDpAttention || "
            "(has(self.dataParallelSize) && self.dataParallelSize >= 2 && "
            "(has(self.tensorParallelSize) ? self.tensorParallelSize : 1) "
            "% self.dataParallelSize == 0)",
            "enableDpAttention needs dataParallelSize >= 2 dividing tensorParallelSize (DP "
            "attention splits the TP group)",
        ),
        (
            "!has(self.gpusPerPod) || self.gpusPerPod == "
            "((has(self.tensorParallelSize) ? self.tensorParallelSize : 1) * "
            "((has(self.enableDpAttention) && self.enableDpAttention) || "
            "!has(self.dataParallelSize) ? 1 : self.dataParallelSize))",
            "gpusPerPod must equal tensorParallelSize (with DP attention) or "
            "tensorParallelSize x dataParallelSize",
        ),
    )

    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="SGLang --tp-size.")
    data_parallel_size: int = Field(default=1, ge=1, le=64, description="SGLang --dp-size.")
    enable_dp_attention: bool = Field(
        default=False,
        description="SGLang --enable-dp-attention: DP ranks share the TP GPUs "
        "(GPUs per pod = tensorParallelSize instead of tensorParallelSize x dataParallelSize).",
    )
    gpus_per_pod: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs per pod; derived from the parallelism when "
        "unset, and must match it when set.",
    )
    page_size: int = Field(
        default=64, ge=1, le=4096, description="SGLang --page-size (tokens per KV page)."
    )
    port: int = Field(default=30000, ge=1024, le=65535, description="SGLang HTTP port.")
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Extra SGLang arguments; flags the operator owns (--tp-size, --page-size, "
        "--hicache-*, --model-path, --port, ...) are rejected with the conflicting name.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Extra environment variables for the engine container.",
    )


class HostAllocator(ApiModel):
    """How each rank's L2 host KV pool is allocated in the pod."""

    huge_page_size: HugePageSize = Field(
        default="2Mi",
        description="Hugepage size backing the host pool (requested as "
        "hugepages-<size>); none uses 4 KiB pages counted in the memory limit.",
    )
    prefault: bool = Field(
        default=True, description="Touch the pool at start so serving does not pay page faults."
    )
    prefault_threads: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Threads touching the pool (0: one per CPU of the pod).",
    )
    numa: Literal["auto", "none"] = Field(
        default="auto",
        description="auto: the launcher binds each rank's pool to its GPU's NUMA "
        "node; none: no binding.",
    )


class Prefetch(ApiModel):
    """SGLang's L3 prefetch; each field unset keeps the engine's measured default
    (hicache_umbp.contract.settings, docs/performance.md "One L3 hit")."""

    policy: Literal["best_effort", "wait_complete", "timeout"] | None = Field(
        default=None, description="--hicache-storage-prefetch-policy: when a request waiting "
        "for its L3 prefetch is admitted (best_effort: at once, with what arrived; "
        "wait_complete: when all arrived; timeout: all, or what arrived by the deadline).")
    threshold: int | None = Field(
        default=None, ge=0, le=1 << 20, description="Tokens: shorter L3 hits are recomputed "
        "instead (SGLang's prefetch_threshold).")
    timeout_base: float | None = Field(
        default=None, ge=0.0, le=3600.0, description="Seconds the timeout policy waits for a "
        "prefetch, plus timeoutPerKiToken per 1024 tokens (SGLang's prefetch_timeout_base).")
    timeout_per_ki_token: float | None = Field(
        default=None, ge=0.0, le=3600.0, description="Seconds per 1024 prefetched tokens "
        "(SGLang's prefetch_timeout_per_ki_token).")


class HiCache(ApiModel):
    """SGLang HiCache: the L2 host pool per rank and its policies."""

    model_config = cel_rules(
        (
            "has(self.hostPoolPerRank) != has(self.hostPoolRatio)",
            "set exactly one of hostPoolPerRank or hostPoolRatio",
        ),
        (
            "!has(self.memLayout) || self.memLayout != 'layer_first'",
            "memLayout layer_first is not allowed: the UMBP store needs a page-first layout "
            "(page_first or page_first_direct)",
        ),
        (
            "!has(self.writePolicy) || self.writePolicy == 'write_back' || "
            "(has(self.allowWriteThrough) && self.allowWriteThrough)",
            "writePolicy write_through needs allowWriteThrough: true (a detokenizer deadlock was "
            "seen with write-through policies)",
        ),
        (
            "!has(self.hostPoolRatio) || (has(self.hostAllocator) && "
            "has(self.hostAllocator.hugePageSize) && self.hostAllocator.hugePageSize == 'none')",
            "hostPoolRatio sizes the pool from the GPU KV cache, which the operator cannot know, "
            "so hugepages cannot be requested: use hostPoolPerRank or hostAllocator.hugePageSize "
            "none",
        ),
    )

    host_pool_per_rank: Quantity | None = Field(
        default=None,
        description="Host KV pool per rank (e.g. 200Gi); rendered in bytes to "
        "--hicache-size. Exactly one of hostPoolPerRank and hostPoolRatio.",
    )
    host_pool_ratio: float | None = Field(
        default=None,
        ge=1.0,
        le=100.0,
        description="Host pool as a multiple of the GPU KV pool "
        "(--hicache-ratio); needs hostAllocator.hugePageSize none and explicit "
        "resources.memory.",
    )
    mem_layout: Literal["page_first", "page_first_direct", "layer_first"] = Field(
        default="page_first",
        description="--hicache-mem-layout; layer_first is rejected (UMBP needs "
        "page-first layouts).",
    )
    write_policy: Literal["write_back", "write_through", "write_through_selective"] = Field(
        default="write_back",
        description="--hicache-write-policy; write-through policies need allowWriteThrough.",
    )
    allow_write_through: bool = Field(
        default=False, description="Explicitly allow write-through policies."
    )
    io_backend: Literal["kernel", "direct"] = Field(
        default="kernel", description="--hicache-io-backend (GPU <-> host copies)."
    )
    host_allocator: HostAllocator = Field(
        default_factory=HostAllocator,
        description="Host pool allocation (hugepages, prefault, NUMA).",
    )
    prefetch: Prefetch = Field(
        default_factory=Prefetch,
        description="SGLang's L3 prefetch policy, threshold and timeouts.",
    )


class Placement(ApiModel):
    """Where pods run."""

    gpu_model: GpuModelName = Field(
        default="MI355X",
        description="AMD Instinct model; nodes are selected by its PCI device id "
        "through the AMD node labeller's labels.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels to match."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Extra tolerations (the GPU taint is tolerated already; amd-gpu-unhealthy "
        "never is by default).",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Pod affinity (core/v1 Affinity); required node terms are combined "
        "with the GPU model terms.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="PriorityClass (a DNS-1123 subdomain: lower-case letters, digits, '-', '.').",
    )


class Resources(ApiModel):
    """Engine container resources; always Guaranteed QoS with integer CPUs."""

    cpu: AutoCpu = Field(default="auto", description="Whole CPUs for the engine, or auto.")
    memory: AutoQuantity = Field(
        default="auto",
        description="Engine memory (the non-hugepage part, incl. /dev/shm), or auto.",
    )
    shm_size: AutoQuantity = Field(
        default="auto", description="/dev/shm size (memory-backed), or auto."
    )


class Security(ApiModel):
    """Privileges requested for the engine; each needs the admin policy's permission."""

    capabilities: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Capabilities to add beyond the defaults (IPC_LOCK, and SYS_NICE with "
        "hostAllocator.numa auto, where the policy allows them); each must be in the policy's "
        "allowedCapabilities. The engine runs as a non-root user, which Kubernetes gives no "
        "ambient capabilities: a capability is never held by the process, it only shapes the "
        "RuntimeDefault seccomp profile the runtime generates (SYS_NICE admits mbind).",
    )
    privileged: bool = Field(default=False, description="Privileged container (policy must allow).")
    host_ipc: bool = Field(
        default=False, alias="hostIPC", description="Host IPC namespace (policy must allow)."
    )
    host_network: bool = Field(default=False, description="Host network (policy must allow).")


class SGLangHiCacheSpec(ApiModel):
    """Desired state: one SGLang server per pod with HiCache L2 and UMBP L3."""

    model_config = cel_rules(
        (
            "!has(self.l3) || !has(self.l3.backend) || self.l3.backend != 'sglang-mori' || "
            "!has(self.hiCache.hostAllocator) || !has(self.hiCache.hostAllocator.prefaultThreads)"
            " || self.hiCache.hostAllocator.prefaultThreads == 0",
            BUILTIN_PREFAULT_THREADS_MESSAGE,
        ),
    )

    model: ModelSource = Field(description="Model to serve.")
    image: str = Field(
        default="", max_length=512, description="Engine image; empty uses the operator's default."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy; empty uses the operator's default."
    )
    replicas: int = Field(
        default=1, ge=0, le=1024, description="Pods; each pod is one SGLang server."
    )
    update_strategy: UpdateStrategy = Field(
        default_factory=UpdateStrategy,
        description="How running pods are replaced when the pod template changes.",
    )
    engine: Engine = Field(default_factory=Engine, description="Parallelism and serving.")
    hi_cache: HiCache = Field(description="L2 host pool and HiCache policies.")
    l3: L3 = Field(default_factory=L3, description="UMBP L3 tiers.")
    placement: Placement = Field(default_factory=Placement, description="Node selection.")
    resources: Resources = Field(default_factory=Resources, description="CPU and memory.")
    security: Security = Field(default_factory=Security, description="Requested privileges.")
    router: Router = Field(
        default_factory=Router,
        description="The cache-aware router in front of the pods (on by default from 2 "
        "replicas).",
    )
