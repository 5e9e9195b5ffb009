"""The plan's sizes and the curve around them: each tier at 0.5x, 2x and 4x, the others as
planned, replayed on the same trace; plus each tier's cumulative share (host pool only, then
with DRAM, then with SSD) that says what adding a tier buys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .replay import ReplayResult
from .tiers import TierTokens

CURVE_FACTORS = (0.5, 2.0, 4.0)
CURVE_TIERS = ("host", "l3_dram", "l3_ssd")
Replay = Callable[[TierTokens], ReplayResult]


@dataclass(frozen=True)
class CurvePoint:
    tier: str
    factor: float
    capacity: int  # tokens per pod of that tier at this point
    hit_ratio: float  # all tiers
    tier_ratio: float  # that tier's own share


@dataclass(frozen=True)
class Curve:
    base: ReplayResult
    points: tuple[CurvePoint, ...]
    stacked: tuple[tuple[str, float], ...]  # (tiers up to, hit ratio)


def curve(capacity: TierTokens, run: Replay, *, base: ReplayResult | None = None,
          factors: tuple[float, ...] = CURVE_FACTORS) -> Curve:
    base = base or run(capacity)
    points = []
    for tier in CURVE_TIERS:
        if not capacity.get(tier):
            continue
        for f in factors:
            scaled = capacity.scaled(tier, f)
            r = run(scaled)
            points.append(CurvePoint(tier, f, scaled.get(tier), r.hit_ratio, r.tier_ratio(tier)))
    stacked = [("device + host pool", run(capacity.without("l3_dram", "l3_ssd")).hit_ratio)]
    if capacity.l3_dram:
        with_dram = run(capacity.without("l3_ssd")) if capacity.l3_ssd else base
        stacked.append(("+ UMBP DRAM", with_dram.hit_ratio))
    if capacity.l3_ssd:
        stacked.append(("+ UMBP SSD", base.hit_ratio))
    return Curve(base, tuple(points), tuple(stacked))
