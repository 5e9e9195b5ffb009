"""``spec.router``: the cache-aware router (SGLang's model gateway ``smg``) in front of the pods.

With more than one engine pod a plain Service spreads a conversation's turns over random pods,
so the device, host and L3 hits fall roughly by the number of replicas. The router keeps an
approximate prefix tree of what it sent where and sends a request to the pod that holds its
prefix. It discovers the CR's pods through the Kubernetes API (get/list/watch pods in the CR's
namespace only), so scaling, a pod going unready or a rollout change its workers with no one
editing its arguments. The planner sizes the tree from each pod's cache capacity in tokens
(``planner.sizing``, "Router tree").
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .types import ApiModel, AutoCpu, AutoQuantity

#: The gateway's policies (smg 1.13.0 ``--policy``) a CR may select; manual and passthrough need
#: routing keys or a single worker the operator does not provide.
RouterPolicy = Literal[
    "cache_aware", "round_robin", "random", "power_of_two", "prefix_hash",
    "consistent_hashing", "least_load",
]
#: smg flags the operator renders; extraArgs may not set them.
ROUTER_OWNED_FLAGS = (
    "--host", "--port", "--worker-urls", "--policy", "--service-discovery",
    "--discovery-provider", "--selector", "--service-discovery-namespace",
    "--service-discovery-port", "--prometheus-port", "--prometheus-host", "--max-tree-size",
    "--eviction-interval-secs", "--cache-threshold", "--cache-match-threshold",
    "--balance-abs-threshold", "--spill-abs-threshold", "--balance-rel-threshold",
    "--spill-rel-threshold", "--health-check-endpoint", "--health-check-interval-secs",
    "--health-check-timeout-secs", "--health-failure-threshold",
    "--health-success-threshold", "--disable-health-check", "--health-check-port",
    "--pd-disaggregation", "--epd-disaggregation", "--log-dir", "--enable-mesh",
    "--router-selector", "--worker-overload-protection", "--disable-worker-overload-protection",
    "--worker-overload-waiting-requests", "--worker-overload-token-usage",
    "--worker-warmup-divert-every", "--shutdown-grace-period-secs", "--mesh-server-name",
    "--mesh-host", "--mesh-advertise-host", "--mesh-port", "--mesh-peer-urls",
)


class RouterTree(ApiModel):
    """The approximate prefix tree of the cache_aware policy, sized to the pods' real cache."""

    max_size: int | None = Field(
        default=None,
        ge=1024,
        le=2**40,
        description="--max-tree-size in characters (the gateway counts the characters of "
        "HTTP requests; a prefix sent to two pods counts twice). Unset: sized from the pods' "
        "cache capacity when model.kvBytesPerToken is known (tokens a pod holds in its host "
        "pool and L3 x charsPerToken x maxPods, planner/router_sizing.py), else the gateway's "
        "default 67108864; always capped by the router's memory.",
    )
    chars_per_token: int = Field(
        default=4,
        ge=1,
        le=16,
        description="Characters of request text per token of the model's tokenizer, to turn "
        "the pods' capacity in tokens into the tree's characters (4 is the gateway's own "
        "assumption for English text; code and CJK text have fewer).",
    )
    request_chars: int = Field(
        default=2048,
        ge=64,
        le=1 << 20,
        description="Characters a request adds to the tree on average (its text beyond the "
        "previous turn of its conversation). The router's memory per tree character is "
        "2.7 B plus 3,900 B per request over this (smg 1.13.0 measured, make "
        "bench-router-memory): 2048 (long-context and agentic turns) gives 4.6 B, 256 (short "
        "chat turns) 18 B per character.",
    )
    max_pods: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Engine pods the tree is sized for. Unset: the smallest power of two at "
        "or above spec.replicas, at least 4, so scaling within it (an autoscaler) leaves the "
        "router's arguments and its tree alone; set it to the autoscaler's maximum so no "
        "scale ever restarts the router (a change of the tree size changes the router's "
        "arguments, which restarts it with an empty tree).",
    )
    eviction_interval_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="--eviction-interval-secs: how often the tree is cut back to its size "
        "(least recently used prefixes first). Between two evictions it grows by what the "
        "pods prefill; the router's memory has headroom for that.",
    )


class RouterHealthCheck(ApiModel):
    """How the router checks each discovered pod before and while routing to it."""

    endpoint: str = Field(
        default="/ready",
        pattern=r"^/[-a-zA-Z0-9_/.]*$",
        max_length=256,
        description="Path on the engine's HTTP port. /ready (SGLang answers at once: 200 "
        "when it serves, 503 while not) mirrors the pods' readiness probe; /health runs a "
        "1-token generation when the engine is idle (after a 1 s pause), so its timeout must "
        "be above 1 s.",
    )
    interval_seconds: int = Field(default=10, ge=1, le=3600, description="Seconds between checks.")
    timeout_seconds: int = Field(default=5, ge=1, le=600, description="Time limit of one check.")
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="Failed checks before a pod stops receiving requests."
    )
    success_threshold: int = Field(
        default=2, ge=1, le=100, description="Passed checks before it receives them again."
    )


class RouterOverload(ApiModel):
    """smg's worker overload protection: a worker whose queue or KV use is at a threshold is
    left out of routing while another worker is below both."""

    protection: bool = Field(
        default=False,
        description="Leave a busy worker out of routing (smg 1.13.0 turns it on by default: "
        ">= 8 queued requests or >= 0.8 KV use). Off: the pod that holds a conversation's "
        "prefix keeps its turns while it is busy, which is when its hits save the most "
        "prefill; cache_aware's own spill gate (balanceAbsThreshold and balanceRelThreshold, "
        "relative to the fleet's mean) still moves requests off a pod far above the others "
        "(docs/performance.md, bench-router-load).",
    )
    waiting_requests: int = Field(
        default=8,
        ge=1,
        le=100000,
        description="--worker-overload-waiting-requests, with protection on: queued "
        "requests at or above which a worker is skipped.",
    )
    token_usage: float = Field(
        default=0.8,
        ge=0.01,
        le=1,
        description="--worker-overload-token-usage, with protection on: KV-cache use at or "
        "above which a worker is skipped (SGLang's token_usage: a full device pool is the "
        "normal state of a busy engine whose host pool holds the rest).",
    )


class RouterMesh(ApiModel):
    """smg's mesh: router pods gossip their state, the cache-aware tree included, so every
    router routes a follow-up to the pod that holds its prefix, whichever router saw it first,
    and a restarted router gets the tree back from its peers."""

    enabled: bool | None = Field(
        default=None,
        description="Join the router pods in a mesh (--enable-mesh; peers found by their "
        "labels through the router's pod watch, --router-selector). Unset: on from 2 router "
        "pods. The mesh speaks clear text to any peer that reaches its port: restrict the "
        "port to the router pods with a NetworkPolicy (docs/operations.md).",
    )
    port: int = Field(default=39527, ge=1024, le=65535, description="--mesh-port.")


class RouterResources(ApiModel):
    """The router container's resources (requests == limits)."""

    cpu: AutoCpu = Field(default="auto", description="Whole CPUs, or auto (2).")
    memory: AutoQuantity = Field(
        default="auto",
        description="Memory, or auto: 256 MiB plus the tree's characters x (2.7 B + 3,900 B / "
        "tree.requestChars) with 25 % headroom (measured on smg 1.13.0: 2.7 bytes per "
        "character of request text and 3.9 KB per request's tree node). An explicit value caps "
        "the tree to what it holds.",
    )


class Router(ApiModel):
    """The cache-aware router the operator deploys in front of the engine pods."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.port) || !has(self.metricsPort) || self.port != self.metricsPort",
        "message": "port and metricsPort must differ",
    }, {
        "rule": "!has(self.port) || self.port != 29000 || has(self.metricsPort)",
        "message": "port 29000 is the default metricsPort: set metricsPort to another port",
    }, {
        "rule": "!has(self.mesh) || !has(self.mesh.port) || "
                "((!has(self.port) || self.port != self.mesh.port) && "
                "(!has(self.metricsPort) || self.metricsPort != self.mesh.port))",
        "message": "mesh.port must differ from port and metricsPort",
    }]})

    enabled: bool | None = Field(
        default=None,
        description="Deploy the router. Unset: on when replicas > 1 (one pod needs no "
        "routing). When on, the CR's Service (<name>) sends requests to the router; "
        "<name>-headless still reaches every pod directly.",
    )
    replicas: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Router pods (2: one can restart, be evicted or lose its node while "
        "the other serves; a PodDisruptionBudget keeps one available). With more than one "
        "they share their prefix tree through smg's mesh (router.mesh), and the Service uses "
        "ClientIP session affinity too (a client's turns meet the router that saw them even "
        "before the mesh has gossiped them).",
    )
    max_stream_seconds: int = Field(
        default=600,
        ge=10,
        le=86400,
        description="The longest request (a stream included) the router must let finish "
        "when its pod stops: --shutdown-grace-period-secs, and the pod's "
        "terminationGracePeriodSeconds is this plus preStopSeconds plus 5.",
    )
    pre_stop_seconds: int = Field(
        default=10,
        ge=0,
        le=300,
        description="A stopping router pod keeps serving this long before smg is told to "
        "stop (a preStop sleep), so Endpoints, kube-proxy and the clients' connection pools "
        "drop it first and no new request reaches a router that refuses it.",
    )
    mesh: RouterMesh = Field(
        default_factory=RouterMesh,
        description="The router pods' mesh (on from 2 router pods): one shared prefix tree.",
    )
    overload: RouterOverload = Field(
        default_factory=RouterOverload,
        description="Worker overload protection (off by default: it undoes cache-aware "
        "routing exactly when a pod is busy).",
    )
    warmup_divert_every: int = Field(
        default=0,
        ge=0,
        le=1000000,
        description="--worker-warmup-divert-every: one cache hit in this many goes to a thin "
        "(new or emptied) worker although another holds its prefix (smg's default 8; 0 "
        "never diverts a hit). New pods still get their share of cache misses (smg's "
        "warm-up slice), which costs no hit.",
    )
    image: str = Field(
        default="", max_length=512, description="Router image; empty uses the operator's default."
    )
    policy: RouterPolicy = Field(
        default="cache_aware",
        description="--policy: cache_aware (the pod whose tree shares the longest prefix, "
        "unless loads are unbalanced), round_robin, random, power_of_two, prefix_hash, "
        "consistent_hashing or least_load.",
    )
    cache_threshold: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="--cache-threshold: the share of a request's prefix a pod must already "
        "hold for cache_aware to send it there rather than to the least loaded pod.",
    )
    balance_abs_threshold: int = Field(
        default=64,
        ge=0,
        le=100000,
        description="--balance-abs-threshold: cache_aware leaves a pod that holds the prefix "
        "when it has this many more requests in flight than the mean (and balanceRelThreshold).",
    )
    balance_rel_threshold: float = Field(
        default=1.5,
        ge=1,
        le=100,
        description="--balance-rel-threshold: ... and this multiple of the mean.",
    )
    port: int = Field(default=30000, ge=1024, le=65535, description="Router HTTP port.")
    metrics_port: int = Field(
        default=29000, ge=1024, le=65535, description="Prometheus metrics port (smg_* series)."
    )
    tree: RouterTree = Field(default_factory=RouterTree, description="The prefix tree's size.")
    health_check: RouterHealthCheck = Field(
        default_factory=RouterHealthCheck, description="Health checks of the engine pods."
    )
    resources: RouterResources = Field(
        default_factory=RouterResources, description="CPU and memory of the router."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Extra smg arguments; flags the operator renders (--policy, --selector, "
        "--max-tree-size, ...) are rejected with the conflicting name.",
    )
