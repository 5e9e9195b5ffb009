"""From hit tokens to what they buy: bytes per second, prefill saved, a TTFT estimate, verdicts.

Bandwidths are measurements of this project (``docs/performance.md``, the line each default
comes from is in :data:`MEASURED_BANDWIDTH`); a user overrides them with their node's numbers.
A hit of ``n`` tokens from a tier costs ``n / rate`` seconds, where the rate in tokens per second
follows from the bytes a hit reads (:mod:`.capacity`); a miss costs ``n / prefill`` seconds. The
TTFT estimate is that sum for each request, averaged: no queueing, no decode, no overlap of
loading with compute (SGLang overlaps host loads with the forward pass layer by layer, so the
host term is an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from .replay import ReplayResult

GB = 1e9


@dataclass(frozen=True)
class Bandwidth:
    gb_per_s: float
    source: str


#: GB/s a hit moves, per tier, as measured (docs/performance.md, the section named).
MEASURED_BANDWIDTH: dict[str, Bandwidth] = {
    "host": Bandwidth(55.2, "docs/performance.md, Host pool <-> GPU transfers (DESIGN §7): "
                            "registered host memory -> GPU, 55.2 GB/s (H200, PCIe Gen5; no "
                            "MI355X measured yet)"),
    "l3_dram": Bandwidth(16.10, "docs/performance.md, Backends side by side: MLA prefetch from "
                                "the UMBP DRAM tier through SGLang's controller, 16.10 GB/s"),
    "l3_ssd": Bandwidth(0.71, "docs/performance.md, The SSD tier at the disk's speed: our SSD "
                              "tier reads DeepSeek-R1 pages through SGLang's controller at "
                              "0.71-1.97 GB/s on the test machine's one virtio disk (the "
                              "slowest run; give a node's drives with --bandwidth)"),
}
#: ``spec.l3.ssd.engine: mori``: mori 1.2.4's SSD node, whatever the drives.
MORI_SSD_BANDWIDTH = Bandwidth(0.10, "docs/performance.md, Backends side by side: reads back "
                                     "from mori 1.2.4's SSD tier, 0.04-0.10 GB/s (its staging "
                                     "leases bound it)")


def measured_bandwidth(ssd_engine: str) -> dict[str, Bandwidth]:
    """The measured bandwidth of each tier for a CR whose SSD tier is ``ssd_engine``."""
    return MEASURED_BANDWIDTH | ({"l3_ssd": MORI_SSD_BANDWIDTH} if ssd_engine == "mori" else {})
NEGLIGIBLE_SHARE = 0.005  # of prompt tokens: below it a tier "buys nothing"


@dataclass(frozen=True)
class TierEstimate:
    tier: str
    hit_tokens: int
    hit_ratio: float
    tokens_per_s: float  # what the tier must deliver at the trace's rate (all pods)
    read_gb_per_s: float  # bytes it reads for that, per pod
    rate_tokens_per_s: float  # how fast one pod can load a hit from it (0: device, free)
    saved_s: float  # prefill seconds the hits save, minus the time to load them


@dataclass(frozen=True)
class Estimate:
    tiers: tuple[TierEstimate, ...]
    prefill_tokens_per_s: float
    ttft_s: float  # mean estimated TTFT with the cache
    ttft_cold_s: float  # mean with every token computed
    ttft_skip_slow_s: float  # mean if hits from tiers slower than recompute were recomputed
    prefill_saved: float  # share of prefill compute the hits avoid


def tier_rates(bandwidth: dict[str, float], token_bytes: int,
               l3_read_bytes: int) -> dict[str, float]:
    """Tokens per second one pod loads a hit from each tier (host: per rank in parallel)."""
    host = bandwidth["host"] * GB / token_bytes
    rates = {"device": 0.0, "host": host}
    for tier in ("l3_dram", "l3_ssd"):
        l3 = bandwidth[tier] * GB / l3_read_bytes
        rates[tier] = 1 / (1 / l3 + 1 / host)
    return rates


def estimate(result: ReplayResult, *, prefill_tokens_per_s: float,
             bandwidth: dict[str, float], token_bytes: int, l3_read_bytes: int) -> Estimate:
    rates = tier_rates(bandwidth, token_bytes, l3_read_bytes)
    duration = result.duration_s
    tiers = []
    for tier, hits in result.hit_tokens.items():
        rate = rates[tier]
        per_token_bytes = {"device": 0, "host": token_bytes}.get(tier, l3_read_bytes)
        load_s = hits / rate if rate else 0.0
        tiers.append(TierEstimate(
            tier=tier, hit_tokens=hits, hit_ratio=result.tier_ratio(tier),
            tokens_per_s=hits / duration,
            read_gb_per_s=hits / duration / result.pods * per_token_bytes / GB,
            rate_tokens_per_s=rate,
            saved_s=hits / prefill_tokens_per_s - load_s))
    requests = max(result.requests, 1)
    cold = result.prompt_tokens / prefill_tokens_per_s / requests
    warm = (result.miss_tokens / prefill_tokens_per_s
            + sum(t.hit_tokens / t.rate_tokens_per_s for t in tiers if t.rate_tokens_per_s)
            ) / requests
    skip = (result.miss_tokens / prefill_tokens_per_s + sum(
        min(t.hit_tokens / t.rate_tokens_per_s, t.hit_tokens / prefill_tokens_per_s)
        for t in tiers if t.rate_tokens_per_s)) / requests
    return Estimate(tuple(tiers), prefill_tokens_per_s, warm, cold, skip,
                    result.hits / result.prompt_tokens if result.prompt_tokens else 0.0)


def verdicts(result: ReplayResult, est: Estimate, footprint: int) -> list[str]:
    """Tiers that buy nothing, and why: the working set fits above them, they hit (almost)
    nothing beyond the tiers above, or they load slower than the GPU recomputes."""
    out = []
    above = 0
    for t in est.tiers:
        cap = result.capacity.get(t.tier)
        if t.tier != "device" and cap:
            if footprint <= above:
                out.append(f"{t.tier}: buys nothing: the trace's working set ({footprint:,} "
                           f"tokens) fits in the tiers above it ({above:,} tokens)")
            elif t.hit_ratio < NEGLIGIBLE_SHARE:
                out.append(f"{t.tier}: buys nothing: {t.hit_ratio:.2%} of prompt tokens hit "
                           f"there (below {NEGLIGIBLE_SHARE:.1%})")
            if t.rate_tokens_per_s and t.rate_tokens_per_s < est.prefill_tokens_per_s:
                out.append(f"{t.tier}: reads slower than recompute: a hit loads at "
                           f"{t.rate_tokens_per_s:,.0f} tokens/s per pod, the GPUs prefill "
                           f"{est.prefill_tokens_per_s:,.0f}: each hit costs more than it saves"
                           f" (at the bandwidth given)")
        above += cap
    return out
