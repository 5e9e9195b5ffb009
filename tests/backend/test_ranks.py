"""Rank position and DP-rank parsing (``hicache_umbp.sglang.ranks``), and the house rules around
them.

Everything is real: the module under test and the source files of the package (read as text /
AST, so no sglang or torch is imported here).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import hicache_umbp
import pytest
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.sglang.ranks import DP_RANK_ENV, RankPosition, parse_dp_rank_env, rank_position

PACKAGE = Path(hicache_umbp.__file__).parent


def test_local_rank_orders_dp_then_pp_then_tp() -> None:
    seen = {
        RankPosition(tp_rank=t, tp_size=2, dp_rank=d, pp_rank=p, pp_size=3).local_rank
        for d in range(2) for p in range(3) for t in range(2)
    }
    assert seen == set(range(12))
    assert RankPosition(tp_rank=1, tp_size=2, dp_rank=1, pp_rank=2, pp_size=3).local_rank == 11


@pytest.mark.parametrize(("raw", "want"), [(None, None), ("", None), (" ", None), ("3", 3)])
def test_dp_rank_env_is_optional(raw: str | None, want: int | None) -> None:
    env = {} if raw is None else {DP_RANK_ENV: raw}
    assert parse_dp_rank_env(env) == want


@pytest.mark.parametrize("raw", ["-1", "one", "1.0", "٣"])
def test_bad_dp_rank_env_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match=f"{DP_RANK_ENV}=.*non-negative integer"):
        parse_dp_rank_env({DP_RANK_ENV: raw})


def test_dp_rank_env_overrides_sglangs_dp_rank() -> None:
    kw = {"tp_rank": 1, "tp_size": 2, "dp_rank": 0, "pp_rank": 0, "pp_size": 1}
    assert rank_position({}, **kw).local_rank == 1
    assert rank_position({DP_RANK_ENV: "1"}, **kw).local_rank == 3


def test_the_test_double_is_not_shipped_in_the_product_package() -> None:
    assert not (PACKAGE / "memory_client.py").exists()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hicache_umbp.memory_client")
