"""Where one SGLang worker sits in the pod: the per-rank index both the adapter and the host
allocator hook need (one definition, so the store and the host pool of a rank always agree).

No torch, no sglang: callers hand in the fields they read from SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..contract.settings import ConfigError

#: Set by the launcher when DP attention is on (SGLang itself never sets it).
DP_RANK_ENV = "SGLANG_DP_RANK"


@dataclass(frozen=True)
class RankPosition:
    """Where this SGLang worker sits: the fields the key scheme and per-rank config need."""

    tp_rank: int
    tp_size: int
    dp_rank: int
    pp_rank: int
    pp_size: int

    @property
    def local_rank(self) -> int:
        """Index into the per-rank configuration lists (one entry per GPU of the pod):
        ``(dp_rank * pp_size + pp_rank) * tp_size + tp_rank``."""
        return (self.dp_rank * self.pp_size + self.pp_rank) * self.tp_size + self.tp_rank


def parse_dp_rank_env(env: Mapping[str, str]) -> int | None:
    """``SGLANG_DP_RANK`` as a non-negative integer, ``None`` when unset or empty."""
    raw = env.get(DP_RANK_ENV)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip()
    if not (value.isascii() and value.isdigit()):
        raise ConfigError([f"{DP_RANK_ENV}={raw!r} must be a non-negative integer"])
    return int(value)


def rank_position(
    env: Mapping[str, str], *, tp_rank: int, tp_size: int, dp_rank: int, pp_rank: int,
    pp_size: int,
) -> RankPosition:
    """The position from SGLang's view, with ``SGLANG_DP_RANK`` (when set) as the DP rank."""
    dp_env = parse_dp_rank_env(env)
    return RankPosition(
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank if dp_env is None else dp_env,
        pp_rank=pp_rank,
        pp_size=pp_size,
    )
