"""The router's prefix tree and resources, from the pods' cache capacity (``spec.router``).

Part of the sizing rules (:mod:`.sizing` sizes the pod; this module what the router in front of
the pods needs to know about it): the formulas are in :func:`size_router`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache_umbp.contract.units import round_up

from ..api.quantity import format_bytes, parse_bytes
from .errors import Problems
from .sizing import PodSizing

# ---------------------------------------------------------------------------- the router's tree
#: smg 1.13.0's --max-tree-size default (characters), used when the pods' capacity is unknown.
ROUTER_TREE_DEFAULT_CHARS = 67_108_864
#: Memory of the smg process besides its prefix tree (measured: 55 MiB RSS idle, 2 workers).
ROUTER_BASE_MEMORY = 256 * 1024**2
#: Tree memory, smg 1.13.0 measured on multi-turn chat (``bench/router_memory.py``, a fit over
#: 240 and 2,147 new characters per request): 2.68 B per character plus 3,861 B per request
#: (a tree node). In thousandths of a byte: per character, and per request.
ROUTER_MILLIBYTES_PER_CHAR = 2_700
ROUTER_MILLIBYTES_PER_REQUEST = 3_900_000
ROUTER_MEMORY_HEADROOM = (5, 4)  # x 1.25: growth between two evictions
ROUTER_CPU = 2
MIB = 1024**2
#: Engine pods the tree is sized for at least when router.tree.maxPods is unset.
ROUTER_MIN_TREE_PODS = 4
#: The router stops after the longest stream it lets finish plus this (process exit).
ROUTER_EXIT_MARGIN_S = 5


def tree_pods(replicas: int, max_pods: int | None) -> int:
    """Engine pods the tree is sized for: ``maxPods`` when set, else the smallest power of two
    ``>= max(replicas, 4)``.

    The tree size is an argument of the router, so a value that followed ``replicas`` restarted
    every router pod (and emptied its tree) at each scale of the engines, an autoscaler's
    included. Rounded up to a power of two it changes only when ``replicas`` crosses one
    (4 -> 5, 8 -> 9, ...), at most doubling the tree's memory; ``maxPods`` (an autoscaler's
    ``maxReplicas``) fixes it for good.
    """
    if max_pods is not None:
        return max_pods
    pods = ROUTER_MIN_TREE_PODS
    while pods < replicas:
        pods *= 2
    return pods


def shutdown_timing(max_stream_s: int, pre_stop_s: int) -> tuple[int, int]:
    """(``--shutdown-grace-period-secs``, ``terminationGracePeriodSeconds``) of a router pod.

    On deletion the kubelet runs the preStop sleep (``S = preStopSeconds``: Endpoints and
    kube-proxy drop the pod meanwhile, while it still serves), then sends SIGTERM; smg stops
    accepting and waits up to its grace ``G = maxStreamSeconds`` for requests in flight. The
    pod's grace covers both plus the process exit: ``T = S + G + 5``; past ``T`` the kubelet
    kills it, so a stream shorter than ``G`` that started before the endpoints dropped the pod
    finishes.
    """
    return max_stream_s, pre_stop_s + max_stream_s + ROUTER_EXIT_MARGIN_S


@dataclass(frozen=True)
class PodTokens:
    """Tokens one engine pod can serve a prefix hit from, per tier (``size_router``)."""

    host: int
    l3_dram: int
    l3_ssd: int

    @property
    def l3(self) -> int:
        return max(self.l3_dram, self.l3_ssd)

    @property
    def total(self) -> int:
        return self.host + self.l3


@dataclass(frozen=True)
class RouterSizing:
    tree_chars: int  # --max-tree-size
    memory_bytes: int
    cpu: int
    pod_tokens: PodTokens | None  # None: the model's geometry is unknown
    pods: int  # engine pods the tree is sized for
    arithmetic: tuple[str, ...]
    capped: bool = False  # the tree was cut to the memory the user gave


def pod_tokens(s: PodSizing, attention_tp: int, mla: bool) -> PodTokens | None:
    """Tokens per tier of one pod (``size_router``); ``None`` without the page geometry."""
    if s.page is None:
        return None
    rank_bytes = s.page.page_bytes // s.page.page_size  # one token in one rank's pool
    groups = max(s.ranks // max(attention_tp, 1), 1)
    l3_bytes = rank_bytes if mla else rank_bytes * attention_tp
    return PodTokens(
        host=groups * (s.host_pool_per_rank // rank_bytes),
        l3_dram=s.dram_total // l3_bytes,
        l3_ssd=s.ssd_total // l3_bytes,
    )


def tree_millibytes_per_char(request_chars: int) -> int:
    """Router memory per tree character, in thousandths of a byte: ``2.7 + 3,900 / c`` B for
    requests adding ``c = router.tree.requestChars`` characters each (every request is a
    node of about 3.9 KB besides its text)."""
    return ROUTER_MILLIBYTES_PER_CHAR + -(-ROUTER_MILLIBYTES_PER_REQUEST // request_chars)


def size_router(
    s: PodSizing, attention_tp: int, mla: bool, *, replicas: int, max_pods: int | None,
    chars_per_token: int, max_size: int | None, memory: int | str, cpu: int | str,
    problems: Problems, request_chars: int = 2048,
) -> RouterSizing:
    """The cache_aware router's prefix tree and resources, from the pods' cache capacity.

    The gateway (smg) keeps one approximate prefix tree per model holding the request text it
    sent to each pod, and evicts the least recently used prefixes every interval until the sum
    of every pod's characters is at most ``--max-tree-size``. Sized to the GPU alone (its
    default, 64 Mi characters), it forgets prefixes that a pod still holds in its host pool or
    L3, and sends their next turn to a pod that has to prefill them again. Sized to the whole
    cache, a prefix stays routed to its pod as long as the pod can still serve it.

    With ``b`` the bytes one token takes in one rank's pool (``page_bytes / pageSize``: mha
    ``K / min(T, h)``, mla ``K``), ``G = R / T`` data-parallel groups (each serves its own
    requests) and the tiers of :func:`size_pod`:

    * host tokens ``T_h = G * floor(H_r / b)`` (every rank of a group holds the same tokens:
      its own heads under mha, the replicated latent cache under mla);
    * L3 bytes per token ``b_3 = T * b`` (mha: every attention-TP rank stores its part) or
      ``b`` (mla: one writer rank backs up); ``T_dram = floor(D / b_3)``,
      ``T_ssd = floor(S / b_3)``; ``T_L3 = max(T_dram, T_ssd)``: the store writes every DRAM
      page through to SSD, so the SSD tier holds what DRAM holds;
    * per pod ``T_pod = T_h + T_L3``. The GPU's KV cache is not added: SGLang keeps the host
      pool at least as large as the device pool and writes every page that leaves the GPU to
      it, so device-only pages are within ``T_h``;
    * tree ``= T_pod * charsPerToken * P`` characters, ``P = maxPods``, unset the smallest
      power of two ``>= max(replicas, 4)`` (:func:`tree_pods`: scaling the engines within it
      leaves the router's arguments, and so its pods and trees, alone); without
      ``kvBytesPerToken`` the gateway's default, 67,108,864;
    * bytes per tree character ``m = 2.7 + 3,900 / c`` for requests that add ``c =
      requestChars`` characters each (:func:`tree_millibytes_per_char`, smg 1.13.0 measured:
      18 B at 240, 4.4 B at 2,147); memory (auto) ``= roundup_MiB(256 MiB + 1.25 * m * tree)``
      (1.25: growth between evictions); an explicit memory ``M`` caps the tree at
      ``floor((M - 256 MiB) / (1.25 m))``; CPUs (auto) 2.

    Example (DeepSeek-R1 bf16 on MI355X, ``examples/deepseek-r1-mi355x.yaml``): mla, b = 70,272
    B, 200 GiB host pool per rank: ``T_h = 3,055,959``; 3 TiB SSD: ``T_ssd = 46,939,533``;
    ``T_pod`` = 50.0 M tokens, 200 M characters per pod.
    """
    lines: list[str] = []
    pods = tree_pods(replicas, max_pods)
    tokens = pod_tokens(s, attention_tp, mla)
    if max_size is not None:
        tree = max_size
        lines.append(f"router tree = router.tree.maxSize {tree} characters")
    elif tokens is None:
        tree = ROUTER_TREE_DEFAULT_CHARS
        lines.append(f"router tree = smg default {tree} characters (model.kvBytesPerToken "
                     f"unset: the pods' capacity in tokens is unknown)")
    else:
        b = s.page.page_bytes // s.page.page_size if s.page else 0
        tree = tokens.total * chars_per_token * pods
        lines.append(
            f"router tree = (host {tokens.host} + L3 max(DRAM {tokens.l3_dram}, SSD "
            f"{tokens.l3_ssd})) tokens per pod (b = {b} B per token and rank) x "
            f"{chars_per_token} characters x {pods} pods = {tree} characters")
    num, den = ROUTER_MEMORY_HEADROOM
    milli = tree_millibytes_per_char(request_chars)
    per_char, den = milli * num, den * 1000  # bytes per character: per_char / den
    capped = False
    if memory == "auto":
        mem = round_up(ROUTER_BASE_MEMORY + -(-tree * per_char // den), MIB)
        lines.append(f"router memory = roundup_MiB(256 MiB + 1.25 x {milli / 1000:g} B (2.7 B + "
                     f"3,900 B / {request_chars} characters per request) x {tree}) = "
                     f"{format_bytes(mem)}")
    else:
        mem = parse_bytes(memory, field="router.resources.memory")
        fits = max((mem - ROUTER_BASE_MEMORY) * den // per_char, 0)
        if fits < 1024:
            problems.add("spec.router.resources.memory",
                         f"{memory} ({mem} B) leaves no room for the prefix tree beside the "
                         f"router's {format_bytes(ROUTER_BASE_MEMORY)}: give it at least "
                         f"{format_bytes(round_up(ROUTER_BASE_MEMORY + 1024 * per_char, MIB))}")
        elif fits < tree:
            if max_size is not None:
                need = round_up(ROUTER_BASE_MEMORY + -(-tree * per_char // den), MIB)
                problems.add("spec.router.tree.maxSize",
                             f"{max_size} characters need {format_bytes(need)} of router "
                             f"memory; router.resources.memory {memory} holds {fits}")
            else:
                lines.append(f"router tree capped by memory {memory}: floor(({mem} - 256 MiB) / "
                             f"{per_char / den:g} B) = {fits} characters (of {tree})")
                tree, capped = fits, True
    cpus = ROUTER_CPU if cpu == "auto" else int(cpu)
    return RouterSizing(tree_chars=tree, memory_bytes=mem, cpu=cpus, pod_tokens=tokens,
                        pods=pods, arithmetic=tuple(lines), capped=capped)
