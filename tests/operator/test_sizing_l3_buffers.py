"""The L3 client's host buffers in the engine's memory: write-back ring and embedded SSD staging,
without the model's page geometry (``model.kvBytesPerToken`` unset: 8 MiB page parts assumed;
the examples' geometry is removed here). With the geometry: test_sizing_page_geometry.py.
The examples' SSD tiers run on the mori engine here (its embedded staging and sidecar); the
hicache engine's memory: test_sizing_ssd_engine.py.

Everything is real: the planner, the backend's env contract it renders and parses back, the
backend's constants it sizes with. No fakes. Expected numbers are worked out by hand.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import Plan, SpecError, plan
from hicache_operator.plan.summary import render_summary
from hicache_umbp.contract.settings import BY_KEY
from hicache_umbp.contract.staging import SSD_STAGING_SLOTS, SSD_VALUE_BYTES_DEFAULT
from shc_testlib import load_example, mori_ssd

GI = 1024**3
MI = 1024**2
CONFIG = OperatorConfig()
QUEUE_ENV = BY_KEY["umbp_tier_queue_bytes"].env


def _plan(example: str, mutate: Callable[[dict[str, Any]], Any] | None = None) -> Plan:
    cr = copy.deepcopy(load_example(example))
    cr["spec"]["model"].pop("kvBytesPerToken", None)
    if "ssd" in cr["spec"]["l3"]:
        mori_ssd(cr["spec"])
    if mutate:
        mutate(cr["spec"])
    return plan(cr, CONFIG)


def _queue(size: str) -> Callable[[dict[str, Any]], None]:
    def set_queue(s: dict[str, Any]) -> None:
        s["l3"].setdefault("tiering", {})["queueSize"] = size

    return set_queue


def _env(p: Plan) -> dict[str, str]:
    cm = next(o for o in p.objects if o["kind"] == "ConfigMap")
    data: dict[str, str] = cm["data"]
    return data


@pytest.mark.parametrize(
    ("example", "ranks"),
    [("llama-3.1-405b-mi355x.yaml", 8), ("llama-3.1-70b-mi355x.yaml", 4)],  # embedded, standalone
)
def test_the_ring_is_counted_per_rank_when_dram_and_ssd_tiers_are_on(
    example: str, ranks: int
) -> None:
    small, big = _plan(example), _plan(example, _queue("9Gi"))
    assert small.sizing.ring_total == ranks * GI
    assert big.sizing.ring_total == ranks * 9 * GI
    # The ring is whole GiB per rank, so the GiB rounding of the memory keeps the delta exact.
    assert big.sizing.engine.memory_bytes - small.sizing.engine.memory_bytes == ranks * 8 * GI
    assert _env(big)[QUEUE_ENV] == str(9 * GI)  # plain bytes: mori-style parsers need them
    assert _env(small)[QUEUE_ENV] == str(GI)


def test_no_ring_without_both_tiers() -> None:
    dram_only = _plan("minimal-dram-only.yaml"), _plan("minimal-dram-only.yaml", _queue("9Gi"))
    assert [p.sizing.ring_total for p in dram_only] == [0, 0]
    assert dram_only[0].sizing.engine.memory_bytes == dram_only[1].sizing.engine.memory_bytes

    def ssd_only(s: dict[str, Any]) -> None:
        s["l3"]["dram"]["capacity"] = 0

    p = _plan("llama-3.1-405b-mi355x.yaml", ssd_only)
    assert p.sizing.ring_total == 0
    assert p.sizing.ssd_staging_total == 8 * SSD_STAGING_SLOTS * SSD_VALUE_BYTES_DEFAULT


def test_embedded_ssd_staging_is_counted_in_the_engine_standalone_in_the_sidecar() -> None:
    embedded = _plan("llama-3.1-405b-mi355x.yaml")
    assert embedded.sizing.ssd_staging_total == 8 * 16 * 8 * MI == GI
    assert _plan("llama-3.1-70b-mi355x.yaml").sizing.ssd_staging_total == 0
    assert _plan("minimal-dram-only.yaml").sizing.ssd_staging_total == 0


def test_a_queue_size_below_one_page_is_rejected_with_the_arithmetic() -> None:
    with pytest.raises(SpecError) as err:
        _plan("llama-3.1-405b-mi355x.yaml", _queue("8Mi"))
    assert any(
        path == "spec.l3.tiering.queueSize" and "8388608 B" in msg and "16777216 B" in msg
        for path, msg in err.value.problems
    ), err.value.problems


def test_an_explicit_memory_must_cover_the_ring_and_the_staging() -> None:
    """llama-405b: shm 32Gi + 4 KiB DRAM 512Gi + rings 8Gi + staging 1Gi + process 4Gi = 557Gi."""

    def memory(m: str) -> Callable[[dict[str, Any]], None]:
        return lambda s: s.update(resources={"memory": m})

    with pytest.raises(SpecError) as err:
        _plan("llama-3.1-405b-mi355x.yaml", memory("556Gi"))
    assert any(
        path == "spec.resources.memory" and f"{9 * GI} B" in msg and f"{557 * GI} B" in msg
        for path, msg in err.value.problems
    ), err.value.problems
    assert _plan("llama-3.1-405b-mi355x.yaml", memory("557Gi")).sizing.engine.memory_bytes == (
        557 * GI
    )


def test_the_summary_shows_the_ring_and_staging_arithmetic() -> None:
    text = render_summary(_plan("llama-3.1-405b-mi355x.yaml"))
    assert f"write-back ring = 8 ranks x queueSize {GI} B = {8 * GI} B" in text
    assert (
        f"SSD staging = 8 ranks x {SSD_STAGING_SLOTS} slots x {SSD_VALUE_BYTES_DEFAULT} B" in text
    )
    assert f"L3 ring and SSD staging {9 * GI} B" in text


def test_without_the_geometry_the_plan_says_what_it_assumed() -> None:
    for example, where in (("llama-3.1-405b-mi355x.yaml", "the engine's SSD staging is"),
                           ("llama-3.1-70b-mi355x.yaml",
                            "the umbp-ssd sidecar's staging slots (16, shared by the 4 "
                            "ranks; 32 per rank with the geometry) are")):
        p = _plan(example)
        [warning] = [w for w in p.warnings if "kvBytesPerToken" in w
                         and not w.startswith("router:")]
        assert warning.startswith(f"model.kvBytesPerToken is not set: {where} sized")
        assert f"page parts of {SSD_VALUE_BYTES_DEFAULT} B (8 MiB)" in warning
        assert "set model.kvBytesPerToken (with model.attention mha or mla)" in warning
        assert f"  - {warning}" in render_summary(p)
    # No SSD tier, nothing staged, nothing assumed.
    assert not any("kvBytesPerToken" in w for w in _plan("minimal-dram-only.yaml").warnings)
    assert not any("kvBytesPerToken" in w for w in plan(load_example(
        "llama-3.1-405b-mi355x.yaml"), CONFIG).warnings)


def test_without_the_geometry_the_ssd_sidecar_is_what_it_always_was() -> None:
    """llama-70b, 4 ranks, no kvBytesPerToken: 16 slots of 8 MiB shared by the 4 ranks
    (128 MiB), 4 GiB, and no slot rendered (both sides' default): byte for byte the pod an
    earlier operator planned, so an upgrade restarts nothing."""
    p = _plan("llama-3.1-70b-mi355x.yaml")
    sidecar = next(c for c in p.sizing.containers if c.name == "umbp-ssd")
    assert (p.sizing.ssd_slot_bytes, p.sizing.ssd_sidecar_slots) == (8 * MI, 16)
    assert p.sizing.ssd_sidecar_staging == 16 * 8 * MI
    assert sidecar.memory_bytes == 4 * GI
    assert BY_KEY["umbp_ssd_slot_bytes"].env not in _env(p)
    assert (
        "umbp-ssd staging = 16 slots x 8388608 B (8 MiB page parts assumed; the 4 ranks share "
        "them) = 134217728 B; memory 4Gi" in render_summary(p)
    )
