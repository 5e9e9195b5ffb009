"""``plan --trace``: the trace model run on a finished plan's tiers, as a table and a curve.

Reads a finished ``Plan`` (its sizing, router and spec) and hands the numbers to
:mod:`hicache_operator.planner.trace_model`; this module only chooses what to run and renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..planner.trace_model import (
    TIER_LABELS,
    Curve,
    Estimate,
    ReplayResult,
    Trace,
    curve,
    estimate,
    footprint_tokens,
    measured_bandwidth,
    pod_model,
    replay,
    router_config,
    theoretical_hit,
    verdicts,
)
from ..planner.trace_model.estimate import Bandwidth
from ..planner.trace_model.routing import RouterPolicy
from ..planner.trace_model.tiers import SGLANG_PREFETCH_THRESHOLD, TierTokens
from .orchestrate import Plan

#: LMSYS's published DeepSeek-R1 prefill, 52.3k input tokens/s on 8xH100 (DESIGN §12): the
#: default when the user gives none, and said so in the output.
DEFAULT_PREFILL_TOKENS_PER_S = 52_300.0


@dataclass(frozen=True)
class TraceOptions:
    pods: int | None = None  # default: spec.replicas
    router: RouterPolicy | None = None  # default: the CR's router policy, else round-robin
    prefill_tokens_per_s: float | None = None
    prefetch_threshold: int = SGLANG_PREFETCH_THRESHOLD
    bandwidth: dict[str, float] = field(default_factory=dict)  # GB/s overrides per tier
    with_curve: bool = True


@dataclass(frozen=True)
class TraceReport:
    result: ReplayResult
    estimate: Estimate
    curve: Curve | None
    theoretical: float
    footprint: int
    verdicts: tuple[str, ...]
    notes: tuple[str, ...]
    bandwidth: dict[str, float]
    prefill_assumed: bool
    measured: dict[str, Bandwidth] = field(default_factory=dict)  # the defaults and sources


def run_trace_model(p: Plan, trace: Trace, opts: TraceOptions) -> TraceReport:
    model = pod_model(p.spec, p.sizing, p.gpu_model, prefetch_threshold=opts.prefetch_threshold)
    pods = opts.pods or p.spec.replicas or 1
    router = router_config(p.spec, p.router, pods, opts.router)
    prefill = opts.prefill_tokens_per_s or DEFAULT_PREFILL_TOKENS_PER_S
    measured = measured_bandwidth(p.spec.l3.ssd.engine)
    bandwidth = {t: b.gb_per_s for t, b in measured.items()} | opts.bandwidth

    def run(capacity: TierTokens) -> ReplayResult:
        return replay(trace, capacity, model.policy, pods=pods, router=router,
                      prefill_tokens_per_s=prefill)

    base = run(model.capacity)
    est = estimate(base, prefill_tokens_per_s=prefill, bandwidth=bandwidth,
                   token_bytes=model.token_bytes, l3_read_bytes=model.l3_read_bytes_per_token)
    foot = footprint_tokens(trace)
    return TraceReport(
        result=base, estimate=est,
        curve=curve(model.capacity, run, base=base) if opts.with_curve else None,
        theoretical=theoretical_hit(trace), footprint=foot,
        verdicts=tuple(verdicts(base, est, foot)), notes=model.notes, bandwidth=bandwidth,
        measured=measured,
        prefill_assumed=opts.prefill_tokens_per_s is None)


def render_trace_report(p: Plan, trace: Trace, report: TraceReport) -> str:
    r, est = report.result, report.estimate
    out: list[str] = []
    add = out.append
    rate = r.prompt_tokens / r.duration_s
    add(f"Trace {trace.name}: {r.requests:,} requests over {r.duration_s:,.0f} s "
        f"({r.requests / r.duration_s:.2f}/s), {r.prompt_tokens:,} prompt tokens "
        f"({rate:,.0f} tokens/s), {trace.block_tokens}-token blocks")
    add(f"  working set {report.footprint:,} tokens; theoretical hit ratio (unbounded cache) "
        f"{report.theoretical:.1%}")
    pol = r.policy
    add(f"SGLangHiCache {p.namespace}/{p.name}: {r.pods} pod(s), router {r.router}; pageSize "
        f"{pol.page_size}, {pol.write_policy}, prefetch threshold {pol.prefetch_threshold} tokens"
        f", promote on hit {'on' if pol.promote_on_hit else 'off'}")
    assumed = (" (assumed: LMSYS's DeepSeek-R1 on 8xH100; set --prefill-tokens-per-s)"
               if report.prefill_assumed else "")
    add(f"Prefill: {est.prefill_tokens_per_s:,.0f} tokens/s per pod{assumed}")
    for note in report.notes:
        add(f"  note: {note}")
    add("")
    add(f"  {'tier':<17}{'tokens/pod':>14}{'hit tokens':>15}{'hit ratio':>10}"
        f"{'tokens/s':>11}{'GB/s/pod':>10}{'loads tok/s/pod':>17}")
    for t in est.tiers:
        loads = f"{t.rate_tokens_per_s:,.0f}" if t.rate_tokens_per_s else "-"
        add(f"  {TIER_LABELS[t.tier]:<17}{r.capacity.get(t.tier):>14,}{t.hit_tokens:>15,}"
            f"{t.hit_ratio:>10.1%}{t.tokens_per_s:>11,.0f}{t.read_gb_per_s:>10.3f}{loads:>17}")
    add(f"  {'miss (prefill)':<17}{'':>14}{r.miss_tokens:>15,}"
        f"{r.miss_tokens / r.prompt_tokens:>10.1%}{r.miss_tokens / r.duration_s:>11,.0f}")
    add(f"  {'all tiers':<17}{'':>14}{r.hits:>15,}{r.hit_ratio:>10.1%}"
        f"{r.hits / r.duration_s:>11,.0f}")
    add("")
    add(f"Prefill saved: {est.prefill_saved:.1%} of prompt tokens; mean TTFT estimate "
        f"{est.ttft_s:.3f} s with the cache vs {est.ttft_cold_s:.3f} s computing every token; "
        f"{est.ttft_skip_slow_s:.3f} s if hits slower than recompute were recomputed "
        f"(no queueing, loads not overlapped)")
    add("Bandwidths (GB/s; --bandwidth TIER=GBPS overrides): " + ", ".join(
        f"{t} {report.bandwidth[t]:g}" for t in ("host", "l3_dram", "l3_ssd")))
    for tier, bw in report.measured.items():
        if report.bandwidth[tier] == bw.gb_per_s:
            add(f"  {tier}: {bw.source}")
    if report.curve is not None:
        add("")
        add("Tiers added in turn: " + " | ".join(
            f"{name} {ratio:.1%}" for name, ratio in report.curve.stacked))
        add("Curve: hit ratio of all tiers (the tier's own share) with one tier scaled:")
        factors = sorted({pt.factor for pt in report.curve.points} | {1.0})
        add(f"  {'tier':<17}" + "".join(f"{f'{f:g}x':>22}" for f in factors))
        for tier in dict.fromkeys(pt.tier for pt in report.curve.points):
            cells = {pt.factor: f"{pt.hit_ratio:.1%} ({pt.tier_ratio:.1%})"
                     for pt in report.curve.points if pt.tier == tier}
            cells[1.0] = f"{r.hit_ratio:.1%} ({r.tier_ratio(tier):.1%})"
            add(f"  {TIER_LABELS[tier]:<17}" + "".join(f"{cells[f]:>22}" for f in factors))
    add("")
    add("Verdicts:" if report.verdicts else "Verdicts: every tier buys hits")
    for v in report.verdicts:
        add(f"  - {v}")
    return "\n".join(out) + "\n"
