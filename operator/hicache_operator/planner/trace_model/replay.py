"""Replay a trace through N pods' tiers behind a router: hit tokens per tier.

``replay`` is the whole model: each request, in arrival order, is routed (:mod:`.routing`) and
served by its pod (:mod:`.pod`). ``theoretical_hit`` is the bound the Mooncake paper plots as
"max": an unbounded cache shared by everything, at block granularity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .pod import PodCache
from .routing import Router, RouterConfig
from .tiers import TIERS, Policy, TierTokens
from .trace import Trace


@dataclass(frozen=True)
class ReplayResult:
    trace: str
    requests: int
    prompt_tokens: int
    duration_s: float
    pods: int
    capacity: TierTokens  # per pod
    policy: Policy
    router: str
    hit_tokens: dict[str, int]  # per tier, all pods
    evicted_tokens: dict[str, int]  # per tier, all pods
    requests_per_pod: tuple[int, ...]
    ttft_inputs: tuple[tuple[int, int, int, int, int], ...] = field(repr=False, default=())

    @property
    def hits(self) -> int:
        return sum(self.hit_tokens.values())

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.prompt_tokens if self.prompt_tokens else 0.0

    def tier_ratio(self, tier: str) -> float:
        return self.hit_tokens[tier] / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def miss_tokens(self) -> int:
        return self.prompt_tokens - self.hits


def block_sizes(input_length: int, blocks: int, block_tokens: int) -> list[int]:
    """Tokens of each of a request's blocks: all whole but the last."""
    sizes = [block_tokens] * blocks
    sizes[-1] = input_length - block_tokens * (blocks - 1)
    return sizes


def replay(trace: Trace, capacity: TierTokens, policy: Policy, *, pods: int = 1,
           router: RouterConfig | None = None, prefill_tokens_per_s: float = 50_000.0,
           keep_requests: bool = False, routes: Sequence[int] | None = None) -> ReplayResult:
    """``capacity`` per pod; ``keep_requests`` keeps each request's (device, host, DRAM, SSD,
    input) tokens for a per-request TTFT estimate (:mod:`.estimate`); ``routes``: the pod of
    each request as a real router chose it, instead of the model's router
    (``bench/router_replay.py``)."""
    if pods < 1:
        raise ValueError("pods must be >= 1")
    if routes is not None and (len(routes) != len(trace.requests)
                               or any(not 0 <= r < pods for r in routes)):
        raise ValueError(f"routes must name one of {pods} pods for each of "
                         f"{len(trace.requests)} requests")
    caches = [PodCache(capacity, policy) for _ in range(pods)]
    route = Router(router or RouterConfig(policy="round_robin"), pods)
    totals = [0, 0, 0, 0]
    per_pod = [0] * pods
    kept: list[tuple[int, int, int, int, int]] = []
    bt = trace.block_tokens
    t0 = trace.requests[0].timestamp_ms if trace.requests else 0
    for i, req in enumerate(trace.requests):
        sizes = block_sizes(req.input_length, len(req.blocks), bt)
        now = (req.timestamp_ms - t0) / 1000
        pod = route.route(req.blocks, sizes, req.input_length, now) if routes is None \
            else routes[i]
        hit = caches[pod].serve(req.blocks, sizes, req.input_length)
        per_pod[pod] += 1
        for k in range(4):
            totals[k] += hit[k]
        route.finished(pod, now, req.input_length - sum(hit), req.output_length,
                       prefill_tokens_per_s)
        if keep_requests:
            kept.append((*hit, req.input_length))
    evicted = {t: sum(getattr(c, t).evicted_tokens for c in caches) for t in TIERS}
    return ReplayResult(
        trace=trace.name, requests=len(trace.requests), prompt_tokens=trace.prompt_tokens,
        duration_s=trace.duration_s, pods=pods, capacity=capacity, policy=policy,
        router=("given routes" if routes is not None else route.config.policy) if pods > 1
        else "single pod",
        hit_tokens=dict(zip(TIERS, totals, strict=True)), evicted_tokens=evicted,
        requests_per_pod=tuple(per_pod), ttft_inputs=tuple(kept),
    )


def single_lru(trace: Trace, tokens: int, *, page_size: int = 1) -> ReplayResult:
    """One LRU cache of ``tokens`` (the paper's "local cache"): the device tier alone."""
    return replay(trace, TierTokens(tokens, 0, 0, 0),
                  Policy(page_size=page_size, prefetch_threshold=0))


def theoretical_hit(trace: Trace) -> float:
    """Hit ratio of an unbounded cache: every block seen before hits (block granularity; the
    last partial block counts its own tokens, and a whole-prompt hit keeps its last token)."""
    seen: set[int] = set()
    hits = 0
    bt = trace.block_tokens
    for req in trace.requests:
        k = 0
        for key in req.blocks:
            if key not in seen:
                break
            k += 1
        hits += min(k * bt, req.input_length - 1)
        seen.update(req.blocks)
    return hits / trace.prompt_tokens


def footprint_tokens(trace: Trace) -> int:
    """Tokens of all distinct blocks: the working set an unbounded cache would end up holding."""
    sizes: dict[int, int] = {}
    bt = trace.block_tokens
    for req in trace.requests:
        for key, size in zip(req.blocks, block_sizes(req.input_length, len(req.blocks), bt),
                             strict=True):
            sizes.setdefault(key, size)
    return sum(sizes.values())
