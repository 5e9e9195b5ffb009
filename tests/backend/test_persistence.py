"""The per-mode warm-cache statement (``hicache_umbp.contract.persistence``) the operator prints.

Pure; each statement is measured on real mori by test_warm_cache_mori.py.
"""

from __future__ import annotations

import pytest
from hicache_umbp.contract.persistence import warm_cache_survival


@pytest.mark.parametrize(
    ("mode", "dram", "ssd", "engine"),
    [
        ("embedded", True, False, "lost"),
        ("embedded", False, True, "lost"),
        ("embedded", True, True, "lost"),
        ("standalone", True, False, "kept"),
        ("standalone", True, True, "kept"),
    ],
)
def test_what_survives_each_restart(mode: str, dram: bool, ssd: bool, engine: str) -> None:
    w = warm_cache_survival(mode, dram=dram, ssd=ssd)
    assert w.engine_restart.startswith(engine)
    assert w.pod_restart.startswith("lost") and w.reschedule.startswith("lost")
    assert ("discards" in w.summary()) == ssd
    assert w.summary().startswith("engine restart: ")


@pytest.mark.parametrize(("mode", "dram", "ssd"), [("distributed", True, False),
                                                   ("embedded", False, False)])
def test_unknown_combinations_are_refused(mode: str, dram: bool, ssd: bool) -> None:
    with pytest.raises(ValueError):
        warm_cache_survival(mode, dram=dram, ssd=ssd)
