"""The router in front of the engine pods (``spec.router``): whether it runs, and its arguments.

Pure. The gateway is SGLang's model gateway ``smg`` (1.13.0): it polls each worker's
``/v1/loads``, which SGLang 0.5.23 serves (``sglang-router`` 0.3.2 polls ``/get_load``, which
0.5.23 no longer has). It discovers the CR's engine pods itself (``--service-discovery`` with the
pods' selector, in the CR's namespace only: a namespaced Role), registers a worker per ready pod
at ``<pod IP>:<engine port>`` and drops it when the pod goes away or terminates.

Default: on when ``replicas > 1``. With one pod there is nothing to route between and the extra
hop and pod buy nothing; from two, a Service without the router loses the hits HiCache exists
for. Set ``router.enabled: true`` where an autoscaler may scale to 1 and back, so the router and
its tree survive the dip.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.router import ROUTER_OWNED_FLAGS
from ..api.spec import SGLangHiCacheSpec
from .engine import attention_tp_size
from .errors import Problems
from .router_sizing import RouterSizing, shutdown_timing, size_router
from .sizing import PodSizing

#: Label of the engine pods' selector that router pods must not carry (builders.context).
ROUTER_APP_NAME = "sglang-hicache-router"


def router_pod_labels(name: str) -> dict[str, str]:
    """The router pods' selector (``BuildInput.router_selector``), which the mesh discovers."""
    return {"app.kubernetes.io/name": ROUTER_APP_NAME, "app.kubernetes.io/instance": name}


def router_enabled(spec: SGLangHiCacheSpec) -> bool:
    enabled = spec.router.enabled
    return spec.replicas > 1 if enabled is None else enabled


@dataclass(frozen=True)
class RouterPlan:
    sizing: RouterSizing
    args: tuple[str, ...]
    selector: dict[str, str]  # the engine pods it discovers
    termination_grace_s: int = 30  # the router pod's terminationGracePeriodSeconds


def _owned(arg: str) -> str:
    flag = arg.split("=", 1)[0]
    return flag if flag in ROUTER_OWNED_FLAGS else ""


def plan_router(
    spec: SGLangHiCacheSpec, namespace: str, engine_selector: dict[str, str], pod: PodSizing,
    problems: Problems, router_selector: dict[str, str] | None = None,
) -> RouterPlan | None:
    """The router's sizing and command line; ``None`` when it is off."""
    r = spec.router
    for i, arg in enumerate(r.extra_args):
        flag = _owned(arg)
        if flag:
            problems.add(f"spec.router.extraArgs[{i}]",
                         f"{flag} is set by the operator from spec.router; remove it")
    if not router_enabled(spec):
        return None
    sizing = size_router(
        pod, attention_tp_size(spec), spec.model.attention == "mla", replicas=spec.replicas,
        max_pods=r.tree.max_pods, chars_per_token=r.tree.chars_per_token,
        max_size=r.tree.max_size, memory=r.resources.memory, cpu=r.resources.cpu,
        problems=problems, request_chars=r.tree.request_chars)
    hc = r.health_check
    shutdown_s, grace_s = shutdown_timing(r.max_stream_seconds, r.pre_stop_seconds)
    args = [
        "launch",
        "--host", "0.0.0.0",
        "--port", str(r.port),
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(r.metrics_port),
        "--service-discovery",
        "--selector", *(f"{k}={v}" for k, v in sorted(engine_selector.items())),
        "--service-discovery-namespace", namespace,
        "--service-discovery-port", str(spec.engine.port),
        "--policy", r.policy,
        "--cache-threshold", f"{r.cache_threshold:g}",
        "--balance-abs-threshold", str(r.balance_abs_threshold),
        "--balance-rel-threshold", f"{r.balance_rel_threshold:g}",
        "--max-tree-size", str(sizing.tree_chars),
        "--eviction-interval-secs", str(r.tree.eviction_interval_seconds),
        "--health-check-endpoint", hc.endpoint,
        "--health-check-interval-secs", str(hc.interval_seconds),
        "--health-check-timeout-secs", str(hc.timeout_seconds),
        "--health-failure-threshold", str(hc.failure_threshold),
        "--health-success-threshold", str(hc.success_threshold),
        *_load_guards(spec),
        *_mesh(spec, router_selector),
        "--shutdown-grace-period-secs", str(shutdown_s),
        *r.extra_args,
    ]
    return RouterPlan(sizing=sizing, args=tuple(args), selector=dict(engine_selector),
                      termination_grace_s=grace_s)


def mesh_enabled(spec: SGLangHiCacheSpec) -> bool:
    enabled = spec.router.mesh.enabled
    return spec.router.replicas > 1 if enabled is None else enabled


def _mesh(spec: SGLangHiCacheSpec, router_selector: dict[str, str] | None) -> list[str]:
    """smg's mesh between the router pods (measured, tests/e2e/test_router_mesh.py: follow-ups
    sent to a second router reach the first one's choice 16/16 with it, at chance without; a
    replaced router gets only what is routed after it joined). Each pod finds its peers with
    its pod watch (``--router-selector``: the router pods' labels; the Role already allows
    it) and must name itself as its pod is named, or it counts itself as a peer and shares
    nothing. ``$(POD_NAME)``/``$(POD_IP)`` are the kubelet's
    expansion of the container's env (``builders.deployment``)."""
    if not mesh_enabled(spec) or not router_selector:
        return []
    return ["--enable-mesh", "--mesh-server-name", "$(POD_NAME)", "--mesh-host", "0.0.0.0",
            "--mesh-advertise-host", "$(POD_IP)", "--mesh-port", str(spec.router.mesh.port),
            "--router-selector", *(f"{k}={v}" for k, v in sorted(router_selector.items()))]


def _load_guards(spec: SGLangHiCacheSpec) -> list[str]:
    """smg 1.13.0's two load rules that override cache affinity, pinned either way.

    Worker overload protection (smg: on, 8 queued requests or 0.8 KV use) skips the pod that
    holds a prefix as soon as it is busy; off by default here, because a long-context workload
    keeps the holder busy exactly when its hits matter, and ``--balance-*-threshold`` (the
    spill gate, relative to the fleet's mean) still moves load off an outlier. The warm-up
    diversion (smg: one hit in 8 to a thin worker) is pinned to 0: a new pod gets cache
    misses through the warm-up slice, which costs no hit. ``make bench-router-load`` measures
    both against smg's defaults.
    """
    r = spec.router
    guards = ["--worker-warmup-divert-every", str(r.warmup_divert_every)]
    if not r.overload.protection:
        return ["--disable-worker-overload-protection", *guards]
    return ["--worker-overload-waiting-requests", str(r.overload.waiting_requests),
            "--worker-overload-token-usage", f"{r.overload.token_usage:g}", *guards]


def router_warnings(spec: SGLangHiCacheSpec, plan: RouterPlan | None) -> list[str]:
    out: list[str] = []
    if plan is None:
        return out
    s = plan.sizing
    if s.pod_tokens is None and spec.router.tree.max_size is None \
            and spec.router.policy == "cache_aware":
        out.append(
            "router: model.kvBytesPerToken is not set, so the pods' cache capacity in tokens is "
            f"unknown and the prefix tree keeps smg's default of {s.tree_chars} characters: "
            "prefixes the pods still hold in host memory or L3 may be routed elsewhere; set "
            "model.kvBytesPerToken (or router.tree.maxSize)")
    if s.capped:
        out.append(
            f"router: the prefix tree is cut to {s.tree_chars} characters to fit "
            f"router.resources.memory {spec.router.resources.memory}; prefixes beyond it are "
            "forgotten before the pods evict them")
    if spec.router.replicas == 1:
        out.append("router: one router pod: every request stops while it restarts or moves "
                   "(no PodDisruptionBudget protects it); use router.replicas >= 2")
    if s.pods < spec.replicas:
        out.append(
            f"router: the prefix tree is sized for router.tree.maxPods {s.pods} engine pods, "
            f"below replicas {spec.replicas}: the pods' caches hold more prefixes than it keeps")
    if spec.replicas == 1 and spec.router.enabled:
        out.append("router: one engine pod; the router has nothing to choose between until "
                   "replicas > 1 (kept on as asked)")
    return out
