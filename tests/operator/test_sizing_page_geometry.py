"""The L3 staging memory from the model's page geometry (``spec.model.kvBytesPerToken``), the
umbp-ssd sidecar's slots, and the pageSize values the pod's store would refuse.

The examples' SSD tiers run here on the mori engine (``spec.l3.ssd.engine: mori``), whose
staging and sidecar these tests work out by hand; the hicache engine's sizing is in
test_sizing_ssd_engine.py (and the refusal check below runs on both engines).

Everything is real: the planner, the env it renders and the backend's own loader, staging
formulas and page check (``hicache_umbp.build.page_size_problems``). No fakes. Expected numbers
are worked out by hand in each docstring.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hicache_operator.api.config import OperatorConfig
from hicache_operator.plan import Plan, SpecError, plan
from hicache_operator.plan.summary import render_summary
from hicache_operator.planner.engine import attention_tp_size, check_parallelism, contract_values
from hicache_operator.planner.errors import Problems
from hicache_operator.planner.page_geometry import page_geometry
from hicache_operator.planner.sizing import size_pod
from hicache_operator.planner.ssd import plan_ssd
from hicache_operator.planner.validate import parse_cr
from hicache_umbp.contract.load import load_launch_config, render_env
from hicache_umbp.contract.page_limits import page_size_problems
from hicache_umbp.contract.settings import BY_KEY
from hicache_umbp.contract.staging import SSD_STAGING_SLOTS, ssd_keys_per_call
from shc_testlib import all_containers, mori_ssd
from shc_testlib import example_cr as _example_cr

GI = 1024**3
MI = 1024**2
CONFIG = OperatorConfig()
SLOT_ENV = BY_KEY["umbp_ssd_slot_bytes"].env
R1 = "deepseek-r1-mi355x.yaml"  # MLA, TP8, standalone, kvBytesPerToken 70,272
L70 = "llama-3.1-70b-mi355x.yaml"  # MHA, TP4, standalone, kvBytesPerToken 327,680
L405 = "llama-3.1-405b-mi355x.yaml"  # MHA, TP8, embedded, kvBytesPerToken 516,096

Mutation = Callable[[dict[str, Any]], Any]


def _cr(example: str, *mutations: Mutation) -> dict[str, Any]:
    """The example on the mori SSD engine (module docstring), then ``mutations``."""
    return _example_cr(example, mori_ssd, *mutations)


def hicache_ssd(spec: dict[str, Any]) -> None:
    """Mutation: back to the hicache engine (after :func:`_cr`'s mori)."""
    spec["l3"]["ssd"]["engine"] = "hicache"


def _plan(example: str, *mutations: Mutation) -> Plan:
    return plan(_cr(example, *mutations), CONFIG)


def page_size(n: int) -> Mutation:
    return lambda s: s["engine"].update(pageSize=n)


def queue(size: str | int) -> Mutation:
    return lambda s: s["l3"].setdefault("tiering", {}).update(queueSize=size)


def dram(size: str) -> Mutation:
    return lambda s: s["l3"]["dram"].update(capacity=size)


def ssd_capacity(size: str) -> Mutation:
    return lambda s: s["l3"]["ssd"].update(capacity=size)


def model(**fields: Any) -> Mutation:
    return lambda s: s["model"].update(fields)


def _env(p: Plan) -> dict[str, str]:
    data: dict[str, str] = next(o for o in p.objects if o["kind"] == "ConfigMap")["data"]
    return data


def _container(p: Plan, name: str) -> dict[str, Any]:
    return next(c for c in all_containers(p.objects) if c["name"] == name)


def _sidecar_env(p: Plan) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(p, "umbp-ssd")["env"]}


def _page_problems(err: SpecError) -> list[str]:
    return [m for path, m in err.problems if path == "spec.engine.pageSize"]


# --------------------------------------------------------------------------- by hand: MLA


def test_mla_standalone_by_hand() -> None:
    """DeepSeek-R1 bf16, TP8, standalone, pageSize 64: one part per page, the same on every
    rank: p = 64 x 70,272 = 4,497,408 B (a multiple of 4 KiB: slot = p).
    Ring per rank = floor(1 GiB / p) x p = 238 x 4,497,408 = 1,070,383,104 B; 8 ranks:
    8,563,064,832 B. umbp-ssd: 2 x 16 x 8 = 256 slots x 4,497,408 = 1,151,336,448 B of
    staging; memory roundup_GiB(2 GiB + 1,151,336,448 B = 3,298,820,096 B) = 4 GiB. Engine
    memory roundup_GiB(1.1 x 112 GiB + 32 GiB + 8,563,064,832 B) = 163.17 -> 164 GiB."""
    p = _plan(R1)
    page = p.sizing.page
    assert page is not None
    assert (page.part_bytes, page.parts, page.page_bytes) == (4_497_408, 1, 4_497_408)
    assert p.sizing.ring_total == 8 * 1_070_383_104 == 8_563_064_832
    assert p.sizing.ssd_staging_total == 0  # standalone: the sidecar stages
    assert p.sizing.ssd_slot_bytes == 4_497_408
    assert p.sizing.ssd_sidecar_slots == 256
    assert p.sizing.ssd_sidecar_staging == 1_151_336_448
    assert _container(p, "umbp-ssd")["resources"]["limits"]["memory"] == "4Gi"
    assert _container(p, "engine")["resources"]["limits"]["memory"] == "164Gi"
    # The engine's store and the sidecar are told the same slot, and it stages one part each.
    sidecar = _sidecar_env(p)
    assert _env(p)[SLOT_ENV] == sidecar["UMBP_DISTRIBUTED_DRAM_PAGE_SIZE"] == "4497408"
    assert sidecar["UMBP_DISTRIBUTED_SSD_STAGING_BUFFER_SLOTS"] == "256"
    assert sidecar["UMBP_DISTRIBUTED_SSD_STAGING_BUFFER_SIZE"] == "1151336448"
    assert sidecar["UMBP_DRAM_CAPACITY"] == "1151336448"  # mori carves the slots from it
    assert ssd_keys_per_call(page.part_bytes, p.sizing.ssd_slot_bytes) == SSD_STAGING_SLOTS


def test_mla_page_of_128_tokens_gets_its_own_slot_size() -> None:
    """The issue's page: 128 x 70,272 = 8,994,816 B > 8 MiB. Slot 8,994,816 B (2,196 x 4 KiB),
    so one 16-slot batch stages 16 pages (an 8 MiB slot would stage 8: two slots each).
    Staging 256 x 8,994,816 = 2,302,672,896 B; memory roundup_GiB(2 GiB + that = 4.14 GiB) =
    5 GiB. Ring floor(1 GiB / 8,994,816) = 119 parts = 1,070,383,104 B per rank."""
    p = _plan(R1, page_size(128))
    assert p.sizing.page is not None and p.sizing.page.part_bytes == 8_994_816
    assert p.sizing.ssd_slot_bytes == 8_994_816
    assert ssd_keys_per_call(8_994_816, p.sizing.ssd_slot_bytes) == 16
    assert ssd_keys_per_call(8_994_816, 8 * MI) == 8
    assert p.sizing.ssd_sidecar_staging == 2_302_672_896
    assert _container(p, "umbp-ssd")["resources"]["limits"]["memory"] == "5Gi"
    assert p.sizing.ring_total == 8 * 119 * 8_994_816
    assert _env(p)[SLOT_ENV] == "8994816"


def test_an_odd_part_rounds_the_slot_up_to_whole_4_kib() -> None:
    """pageSize 3: p = 3 x 70,272 = 210,816 B = 51.47 x 4 KiB -> slot 52 x 4,096 = 212,992 B."""
    p = _plan(R1, page_size(3))
    assert p.sizing.page is not None and p.sizing.page.part_bytes == 210_816
    assert p.sizing.ssd_slot_bytes == 212_992
    assert _sidecar_env(p)["UMBP_DISTRIBUTED_DRAM_PAGE_SIZE"] == _env(p)[SLOT_ENV] == "212992"


# --------------------------------------------------------------------------- by hand: MHA


def test_mha_standalone_by_hand() -> None:
    """Llama-3.1-70B bf16, TP4, standalone, pageSize 64: K and V parts of
    64 x 327,680 / 2 / 4 = 2,621,440 B per rank (page 5,242,880 B).
    Ring per rank floor(1 GiB / 2,621,440) = 409 parts = 1,072,168,960 B; 4 ranks
    4,288,675,840 B. umbp-ssd: 2 x 16 x 4 = 128 slots x 2,621,440 = 335,544,320 B; memory
    roundup_GiB(2 GiB + 320 MiB) = 3 GiB. Engine memory roundup_GiB(1.1 x 64 GiB + 16 GiB +
    4,288,675,840 B) = 90.39 -> 91 GiB."""
    p = _plan(L70)
    page = p.sizing.page
    assert page is not None
    assert (page.part_bytes, page.parts, page.page_bytes) == (2_621_440, 2, 5_242_880)
    assert p.sizing.ring_total == 4 * 1_072_168_960 == 4_288_675_840
    assert (p.sizing.ssd_slot_bytes, p.sizing.ssd_sidecar_slots) == (2_621_440, 128)
    assert p.sizing.ssd_sidecar_staging == 335_544_320
    assert _container(p, "umbp-ssd")["resources"]["limits"]["memory"] == "3Gi"
    assert _container(p, "engine")["resources"]["limits"]["memory"] == "91Gi"
    assert _env(p)[SLOT_ENV] == _sidecar_env(p)["UMBP_DISTRIBUTED_DRAM_PAGE_SIZE"] == "2621440"
    # one 16-slot batch of a rank: 16 parts = 8 whole pages
    assert ssd_keys_per_call(page.part_bytes, p.sizing.ssd_slot_bytes) // page.parts == 8


def test_mha_embedded_by_hand() -> None:
    """Llama-3.1-405B (bf16 KV), TP8, embedded: p = 64 x 516,096 / 2 / 8 = 2,064,384 B.
    Ring floor(1 GiB / p) = 520 parts = 1,073,479,680 B per rank; embedded SSD staging
    16 x p = 33,030,144 B per rank; 8 ranks: 8,587,837,440 + 264,241,152 = 8,852,078,592 B."""
    p = _plan(L405)
    assert p.sizing.page is not None and p.sizing.page.part_bytes == 2_064_384
    assert p.sizing.ring_total == 8 * 1_073_479_680 == 8_587_837_440
    assert p.sizing.ssd_staging_total == 8 * 16 * 2_064_384 == 264_241_152
    assert SLOT_ENV not in _env(p)  # embedded: the store sizes its SSD node's slots itself
    assert not any(c.name == "umbp-ssd" for c in p.sizing.containers)


def test_mha_with_fewer_kv_heads_than_ranks_keeps_one_head_per_rank() -> None:
    """A model of 40 layers, 2 KV heads of 128 (bf16): K = 40 x 2 x 128 x 2 x 2 = 40,960.
    At TP4 SGLang gives every rank one whole head: p = 64 x 40,960 / 2 / 2 = 655,360 B; taken
    as split over 4 ranks it would be half that (kvHeads unset)."""
    with_heads = _plan(L70, model(kvBytesPerToken=40_960, kvHeads=2))
    assert with_heads.sizing.page is not None
    assert with_heads.sizing.page.part_bytes == 655_360
    even = _plan(L70, model(kvBytesPerToken=40_960))
    assert even.sizing.page is not None and even.sizing.page.part_bytes == 327_680
    more_heads = _plan(L70, model(kvHeads=8))  # 8 heads over 4 ranks: 2 per rank, as unset
    assert more_heads.sizing.page is not None and more_heads.sizing.page.part_bytes == 2_621_440
    assert "/ 2 KV heads (one per rank: fewer than the 4 attention-TP ranks)" in "\n".join(
        with_heads.sizing.arithmetic
    )


def test_mha_with_dp_attention_shards_over_the_attention_tp_group() -> None:
    """405B at TP8 with DP attention 2: attention TP = 4, p = 64 x 516,096 / 2 / 4."""
    p = _plan(L405, lambda s: s["engine"].update(enableDpAttention=True, dataParallelSize=2))
    assert p.sizing.page is not None and p.sizing.page.part_bytes == 4_128_768


def test_the_summary_shows_the_page_and_the_staging_formulas() -> None:
    text = render_summary(_plan(L70))
    assert (
        "page = 2 part(s) x 2621440 B = 5242880 B per rank (part = pageSize 64 x "
        "kvBytesPerToken 327680 B / 2 (K, V) / 4 attention-TP ranks)" in text
    )
    assert (
        "write-back ring = 4 ranks x floor(queueSize 1073741824 B / part 2621440 B) x "
        "2621440 B = 4 x 1072168960 B = 4288675840 B (memory)" in text
    )
    assert (
        "umbp-ssd staging = 32 slots x 4 ranks x slot roundup(part 2621440 B, 4Ki) = "
        "128 x 2621440 B = 335544320 B" in text
    )
    assert "umbp-ssd memory = roundup_GiB(2Gi + staging 335544320 B) = 3Gi" in text
    assert "L3 ring and SSD staging 4288675840 B" in text
    assert "kvBytesPerToken is not set" not in text
    embedded = render_summary(_plan(L405))
    assert "SSD staging = 8 ranks x 16 slots x part 2064384 B = 264241152 B (memory)" in embedded
    mla = render_summary(_plan(R1))
    assert (
        "page = 1 part(s) x 4497408 B = 4497408 B per rank (part = pageSize 64 x "
        "kvBytesPerToken 70272 B; mla: one latent part, the same on every rank)" in mla
    )


# --------------------------------------------------------------------------- refusals


def test_a_ring_smaller_than_one_page_refuses_the_page_size() -> None:
    """405B, pageSize 4096: p = 4096 x 32,256 = 132,120,576 B, page 264,241,152 B; a 200 MiB
    ring (209,715,200 B) holds pages of at most 2 x n x 32,256 B: n <= 3,250."""
    with pytest.raises(SpecError) as err:
        _plan(L405, page_size(4096), queue("200Mi"))
    [msg] = _page_problems(err.value)
    assert msg.startswith(
        "a page of 2 part(s) x 132120576 B = 264241152 B per rank (part = pageSize 4096 x "
        "kvBytesPerToken 516096 B / 2 (K, V) / 8 attention-TP ranks): the pod would refuse it "
        "when SGLang registers the host pool: umbp_tier_queue_bytes "
        "(HICACHE_UMBP_TIER_QUEUE_BYTES)=209715200 bytes is smaller than one page"
    ), msg
    assert msg.endswith(
        "lower spec.engine.pageSize to at most 3250, or raise spec.l3.tiering.queueSize"
    ), msg
    _plan(L405, page_size(3250), queue("200Mi"))  # the largest one fits
    with pytest.raises(SpecError):
        _plan(L405, page_size(3251), queue("200Mi"))


def test_a_ring_of_one_byte_fits_no_page_size() -> None:
    with pytest.raises(SpecError) as err:
        _plan(L405, queue(1))
    [msg] = _page_problems(err.value)
    assert msg.endswith("no pageSize fits (even 1 token), or raise spec.l3.tiering.queueSize")


def test_an_embedded_dram_tier_smaller_than_one_page_refuses_the_page_size() -> None:
    """405B, pageSize 4096 (page 264,241,152 B per rank), DRAM 1600 MiB / 8 = 209,715,200 B
    per rank: at most 3,250 tokens."""
    with pytest.raises(SpecError) as err:
        _plan(L405, page_size(4096), dram("1600Mi"))
    [msg] = _page_problems(err.value)
    assert (
        "umbp_dram_bytes (HICACHE_UMBP_DRAM_BYTES) of rank 0 = 209715200 bytes cannot hold a "
        "page of 2 part(s) x 132120576 bytes = 264241152 bytes" in msg
    ), msg
    assert msg.endswith(
        "lower spec.engine.pageSize to at most 3250, or raise spec.l3.dram.capacity"
    ), msg


def test_an_embedded_ssd_tier_smaller_than_one_page_refuses_the_page_size() -> None:
    with pytest.raises(SpecError) as err:
        _plan(L405, page_size(4096), ssd_capacity("1600Mi"))
    [msg] = _page_problems(err.value)
    assert "umbp_ssd_bytes (HICACHE_UMBP_SSD_BYTES) of rank 0 = 209715200 bytes" in msg, msg
    assert msg.endswith(
        "lower spec.engine.pageSize to at most 3250, or raise spec.l3.ssd.capacity"
    ), msg


def test_every_tier_that_cannot_hold_the_page_is_named_once() -> None:
    """DRAM and SSD both too small: two problems (rank 0 speaks for all 8 ranks)."""
    with pytest.raises(SpecError) as err:
        _plan(L405, page_size(4096), dram("1600Mi"), ssd_capacity("1600Mi"))
    msgs = _page_problems(err.value)
    assert len(msgs) == 2
    assert [m.rsplit("raise ", 1)[1] for m in msgs] == [
        "spec.l3.dram.capacity", "spec.l3.ssd.capacity"
    ]


def test_kv_bytes_per_token_with_auto_attention_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        _plan(L70, model(attention="auto"))
    assert err.value.problems == [(
        "spec.model.kvBytesPerToken",
        "kvBytesPerToken needs attention mha or mla: the page geometry differs (mha: K and V "
        "parts of each rank's heads; mla: one latent part replicated on every rank), so auto "
        "cannot size it",
    )]


def test_kv_heads_outside_mha_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        _plan(R1, model(kvHeads=8))
    assert err.value.problems == [
        ("spec.model.kvHeads", "kvHeads applies to attention mha with kvBytesPerToken only")
    ]


def test_kv_heads_that_cannot_be_sharded_are_refused() -> None:
    with pytest.raises(SpecError) as err:
        _plan(L70, model(kvHeads=6))  # 6 over 4 ranks
    assert err.value.problems == [(
        "spec.model.kvHeads",
        "6 KV heads cannot be sharded over 4 attention-TP ranks: SGLang needs one of the two "
        "to divide the other",
    )]


def test_an_mha_size_that_does_not_split_into_k_and_v_per_rank_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        _plan(L70, model(kvBytesPerToken=327_681))
    [(path, msg)] = err.value.problems
    assert path == "spec.model.kvBytesPerToken"
    assert msg.startswith(
        "327681 B is not a multiple of 2 (K and V) x 4 (the KV heads' shards over the "
        "attention-TP ranks) = 8"
    ), msg
    assert "set model.kvHeads" in msg


def test_the_built_in_backend_is_not_held_to_our_stores_page_rules() -> None:
    """l3.backend sglang-mori: SGLang's own store (DRAM only) takes the page, not ours. A page
    of 4096 x 70,272 = 287,834,112 B with 64 MiB of DRAM, which our store refuses, is planned
    for it, and no staging is counted (no SSD tier, no ring)."""
    builtin = "cpu/tiny-llama-builtin.yaml"
    geometry = model(attention="mla", kvBytesPerToken=70_272)
    small = dram("64Mi")
    p = _plan(builtin, geometry, page_size(4096), small)
    assert p.sizing.page is not None and p.sizing.page.part_bytes == 4096 * 70_272
    assert p.sizing.ring_total == p.sizing.ssd_staging_total == 0
    with pytest.raises(SpecError) as err:  # the same pod on our store: refused
        _plan(builtin, geometry, page_size(4096), small,
              lambda s: s["l3"].update(backend="umbp"))
    assert _page_problems(err.value)


@pytest.mark.parametrize("bad", [0, 16 * MI + 1, True, "x"])
def test_kv_bytes_per_token_is_a_positive_bounded_integer(bad: Any) -> None:
    with pytest.raises(SpecError) as err:
        _plan(R1, model(kvBytesPerToken=bad))
    assert [p for p, _ in err.value.problems] == ["spec.model.kvBytesPerToken"]


# --------------------------------------------------------------------------- agreement


def _backend_verdict(cr: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """What the pod's store says about the page, from the planner's own env rendering path:
    parse, size, render the contract values, load them with the backend's loader and run
    ``page_size_problems`` for every rank (first refusing rank). Works for CRs the planner
    refuses, which have no ConfigMap to read."""
    problems = Problems()
    parsed = parse_cr(cr, problems)
    assert parsed is not None
    spec = parsed.spec
    ranks = check_parallelism(spec, problems)
    ssd = plan_ssd(spec, ranks, CONFIG.policy, problems)
    page = page_geometry(spec, attention_tp_size(spec), problems)
    assert page is not None
    sizing = size_pod(spec, ranks, ssd.capacity if ssd.enabled else 0, CONFIG, problems,
                      page=page)
    env = render_env(contract_values(spec, parsed.namespace, parsed.name, sizing, ssd))
    store = load_launch_config(env).store
    for r in range(store.umbp_local_ranks):
        reasons = page_size_problems(store.rank(r), page.part_bytes, page.parts)
        if reasons:
            return reasons, env
    return [], env


CASES = [
    (example, n, extra)
    for example, extras in (
        (R1, [[], [queue("16Mi")], [queue("5Mi")]]),
        (L70, [[], [queue("16Mi")], [queue("12Mi")]]),
        (L405, [[], [queue("200Mi")], [dram("1600Mi")], [ssd_capacity("1600Mi")],
                [dram("0")], [dram("1600Mi"), ssd_capacity("1600Mi"), queue("100Mi")]]),
    )
    for n, extra in itertools.product([1, 16, 64, 128, 1024, 3250, 4096], extras)
]
#: The same on the hicache engine (its tier holds the pod's pages on its drives, one 4 KiB-
#: aligned slot per part; no staging, no sidecar), for small, usual and huge pages.
OURS = [(example, n, [hicache_ssd, *extra]) for example, n, extra in CASES
        if n in (1, 64, 4096)]


@pytest.mark.parametrize(
    ("example", "n", "extra"), CASES + OURS,
    ids=[f"{e.split('-mi')[0]}-p{n}-{i % 6}{'-hicache' if i >= len(CASES) else ''}"
         for i, (e, n, _) in enumerate(CASES + OURS)],
)
def test_the_planner_refuses_exactly_what_the_pods_store_refuses(
    example: str, n: int, extra: list[Mutation]
) -> None:
    cr = _cr(example, page_size(n), *extra)
    reasons, env = _backend_verdict(cr)
    try:
        p = plan(cr, CONFIG)
    except SpecError as err:
        planner = _page_problems(err)
        assert reasons, f"planner refused a page the store accepts: {err.problems}"
        assert len(planner) == len(reasons)
        for reason, msg in zip(reasons, planner, strict=True):
            assert reason in msg
        return
    assert reasons == [], f"planner accepted a page the store refuses: {reasons}"
    assert _env(p) == env  # the env checked is the env the pod gets
    if example != L405 and hicache_ssd not in extra:  # standalone mori SSD: the sidecar
        # stages one whole page per batch
        page = p.sizing.page
        assert page is not None
        assert int(_sidecar_env(p)["UMBP_DISTRIBUTED_DRAM_PAGE_SIZE"]) == int(env[SLOT_ENV])
        assert ssd_keys_per_call(page.part_bytes, int(env[SLOT_ENV])) >= page.parts
