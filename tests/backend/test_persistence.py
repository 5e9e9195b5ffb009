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


@pytest.mark.parametrize(
    ("mode", "dram", "engine", "pod"),
    [
        ("embedded", False, "kept", "kept"),
        ("embedded", True, "DRAM pages lost", "DRAM pages lost"),
        ("standalone", True, "DRAM pages kept", "DRAM pages lost"),
    ],
)
def test_the_hicache_ssd_tier_keeps_its_pages_across_restarts(
        mode: str, dram: bool, engine: str, pod: str) -> None:
    """The hicache engine's SSD pages survive an engine and a pod restart on the same volume
    (the disk room's restart tests measure it); an emptyDir is a new volume for a new pod."""
    w = warm_cache_survival(mode, dram=dram, ssd=True, ssd_engine="hicache")
    assert w.engine_restart.startswith(engine) and w.pod_restart.startswith(pod)
    assert "SSD tier's slot files and index stay on the volume" in w.engine_restart
    assert "SSD tier's slot files and index stay on the volume" in w.pod_restart
    assert "discards" not in w.summary() and w.reschedule.startswith("lost")
    fresh = warm_cache_survival(mode, dram=dram, ssd=True, ssd_engine="hicache",
                                ssd_volume_kept=False)
    assert "emptyDir SSD volume is new for every pod" in fresh.pod_restart
    assert fresh.engine_restart == w.engine_restart


@pytest.mark.parametrize(("mode", "dram", "ssd"), [("distributed", True, False),
                                                   ("embedded", False, False)])
def test_unknown_combinations_are_refused(mode: str, dram: bool, ssd: bool) -> None:
    with pytest.raises(ValueError):
        warm_cache_survival(mode, dram=dram, ssd=ssd)
