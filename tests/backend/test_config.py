"""Property-based tests of the env contract's parsers (``hicache_umbp.contract.settings``).

Everything is real: the SETTINGS table, the parsers and renderers, ``load_store_config``.
Properties: every accepted value of every setting round-trips through ``render_value`` /
``parse_value`` (and through ``render_env`` / ``load_store_config``); every rejected input
raises ``ValueError`` naming the key or variable it came from.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hicache_umbp.contract.load import load_store_config, render_env, render_value
from hicache_umbp.contract.parsing import parse_bool, parse_int
from hicache_umbp.contract.settings import (
    BY_KEY,
    MAX_MEMORY_BYTES,
    SETTINGS,
    STORE_KEYS,
    ConfigError,
    Setting,
    ssd_dirs_of,
)
from hicache_umbp.contract.values import parse_value
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

BOOL_SPELLINGS = {"true": True, "1": True, "yes": True, "on": True,
                  "false": False, "0": False, "no": False, "off": False}
BIG = 2**62


def _bounds(s: Setting, lo: int = -BIG, hi: int = BIG) -> tuple[int, int]:
    low = lo if s.minimum is None else int(s.minimum)
    high = hi if s.maximum is None else int(s.maximum)
    return low, high


def valid_value(s: Setting, ranks: int) -> st.SearchStrategy[Any]:
    """Values of setting ``s`` that ``parse_value`` must accept."""
    if s.kind == "bool":
        return st.booleans()
    if s.kind in ("int", "bytes"):
        return st.integers(*_bounds(s))
    if s.kind == "float":
        lo = -1e12 if s.minimum is None else s.minimum
        hi = 1e12 if s.maximum is None else s.maximum
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False)
    if s.kind == "str":
        return st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)
    if s.kind == "enum":
        return st.sampled_from(s.choices)
    low, high = _bounds(s)
    if s.kind == "rank_port":
        high -= ranks  # a scalar port auto-increments per rank
    return st.lists(st.integers(low, high), min_size=ranks, max_size=ranks).map(tuple)


@st.composite
def setting_and_value(draw: st.DrawFn) -> tuple[Setting, int, Any]:
    s = draw(st.sampled_from(SETTINGS))
    ranks = draw(st.integers(1, 8))
    return s, ranks, draw(valid_value(s, ranks))


@given(setting_and_value())
def test_every_accepted_value_round_trips(case: tuple[Setting, int, Any]) -> None:
    s, ranks, value = case
    text = render_value(s, value)
    assert parse_value(s, s.env, text, ranks) == value


@given(st.sampled_from(sorted(BOOL_SPELLINGS)), st.data())
def test_every_boolean_spelling_in_any_case_is_accepted(word: str, data: st.DataObject) -> None:
    mixed = "".join(data.draw(st.sampled_from([c.lower(), c.upper()])) for c in word)
    pad = data.draw(st.sampled_from(["", " ", "\t"]))
    assert parse_bool("HICACHE_X", pad + mixed + pad) is BOOL_SPELLINGS[word]


@given(st.text(max_size=12))
def test_anything_else_is_not_a_boolean(text: str) -> None:
    assume(text.strip().lower() not in BOOL_SPELLINGS)
    with pytest.raises(ValueError, match=r"^HICACHE_FLAG=.*is not a boolean"):
        parse_bool("HICACHE_FLAG", text)


def test_false_is_never_true() -> None:
    for word in ("false", "False", "FALSE", "0", "no", "off", " off "):
        assert parse_bool("k", word) is False


@given(
    st.integers(0, 10**15),
    st.sampled_from(["Ki", "Mi", "Gi", "Ti", "K", "M", "G", "k", "kb", "MB", "GiB", "e3", "_0"]),
)
def test_byte_sizes_with_units_are_rejected_naming_the_key(number: int, unit: str) -> None:
    s = BY_KEY["umbp_dram_bytes"]
    with pytest.raises(ValueError, match=r"umbp_dram_bytes.*plain byte count.*std::stoull"):
        parse_value(s, "umbp_dram_bytes", f"{number}{unit}", 1)


@example("--1")
@example("-")
@example("+5")
@example(" 7 ")
@example("1_000")
@example("\u0663")  # ARABIC-INDIC DIGIT THREE: isdigit() but not base-10 ASCII
@example("0x10")
@given(st.text(max_size=10))
def test_integers_accept_only_plain_base10(text: str) -> None:
    plain = re.fullmatch(r"-?[0-9]+", text.strip()) is not None
    if plain:
        assert parse_int("HICACHE_N", text) == int(text.strip())
    else:
        with pytest.raises(ValueError, match=r"^HICACHE_N="):
            parse_int("HICACHE_N", text)


@st.composite
def out_of_range(draw: st.DrawFn) -> tuple[Setting, int]:
    s = draw(st.sampled_from([x for x in SETTINGS if x.kind in ("int", "bytes", "float")
                              and (x.minimum is not None or x.maximum is not None)]))
    options = []
    if s.minimum is not None:
        options.append(draw(st.integers(-BIG, int(s.minimum) - 1)))
    if s.maximum is not None:
        options.append(draw(st.integers(int(s.maximum) + 1, BIG)))
    return s, draw(st.sampled_from(options))


@given(out_of_range())
def test_out_of_range_numbers_are_rejected_naming_the_variable(case: tuple[Setting, int]) -> None:
    s, value = case
    with pytest.raises(ValueError, match=rf"^{s.env}=.*(below the minimum|above the maximum)"):
        parse_value(s, s.env, str(value), 1)


@given(st.sampled_from([s for s in SETTINGS if s.kind == "enum"]), st.text(max_size=12))
@example(BY_KEY["umbp_dram_hugepage_bytes"], "\u00b9")  # SUPERSCRIPT ONE: isdigit(), not ASCII
@example(BY_KEY["umbp_dram_hugepage_bytes"], "2Mi")
def test_enums_reject_other_values_listing_the_allowed_ones(s: Setting, text: str) -> None:
    allowed = {str(c) for c in s.choices}
    assume(text.strip() not in allowed)
    if all(isinstance(c, int) for c in s.choices) and re.fullmatch(r"-?[0-9]+", text.strip()):
        assume(int(text.strip()) not in s.choices)  # "00" is the integer 0
    with pytest.raises(ValueError, match=rf"^{s.env}=.*allowed values: "):
        parse_value(s, s.env, text, 1)


@given(
    st.sampled_from([s for s in SETTINGS if s.kind.startswith("rank_")]),
    st.integers(2, 8),
    st.data(),
)
def test_per_rank_lists_of_the_wrong_length_are_rejected(
    s: Setting, ranks: int, data: st.DataObject
) -> None:
    n = data.draw(st.integers(2, 12).filter(lambda k: k != ranks))
    text = ",".join(["1"] * n)
    which = "shorter" if n < ranks else "longer"
    with pytest.raises(ValueError, match=rf"^{s.env} has {n} entries, {which} than the {ranks}"):
        parse_value(s, s.env, text, ranks)


def test_a_scalar_port_auto_increments_per_rank() -> None:
    s = BY_KEY["umbp_peer_port"]
    assert parse_value(s, s.env, "18500", 4) == (18500, 18501, 18502, 18503)
    assert parse_value(s, s.env, [20000, 20007], 2) == (20000, 20007)


# ----------------------------------------------------------------------------- whole configs

EMBEDDED_STORE = [
    s for s in SETTINGS
    if s.key in STORE_KEYS and "embedded" in s.modes
    and s.key not in ("umbp_mode", "umbp_local_ranks", "umbp_ssd_enabled", "umbp_dram_bytes")
]


@st.composite
def embedded_configs(draw: st.DrawFn) -> tuple[int, dict[str, Any]]:
    ranks = draw(st.integers(1, 4))
    chosen = draw(st.lists(st.sampled_from(EMBEDDED_STORE), unique=True, max_size=12))
    values: dict[str, Any] = {s.key: draw(valid_value(s, ranks)) for s in chosen}
    values["umbp_local_ranks"] = ranks
    values["umbp_dram_bytes"] = draw(st.lists(st.integers(1, MAX_MEMORY_BYTES), min_size=ranks,
                                              max_size=ranks).map(tuple))
    if len(ssd_dirs_of(values.get("umbp_ssd_dir") or "")) > 1:
        # several drives are valid only with our SSD engine (mori's node takes one directory)
        values["umbp_ssd_engine"] = "hicache"
    return ranks, values


@settings(max_examples=60)
@given(embedded_configs())
def test_rendered_env_loads_back_to_the_same_values(case: tuple[int, dict[str, Any]]) -> None:
    _, values = case
    env = render_env(values)
    assert all(name.startswith("HICACHE_") for name in env)
    cfg = load_store_config(env=env)
    for key, value in values.items():
        assert getattr(cfg, key) == value, key
        assert cfg.sources[key] == BY_KEY[key].env


@given(st.sampled_from(sorted(STORE_KEYS)), st.integers(0, 30))
def test_a_mistyped_key_is_rejected_with_the_closest_valid_key(key: str, cut: int) -> None:
    typo = key[: cut % len(key)] + key[cut % len(key) + 1 :]  # drop one character
    assume(typo not in BY_KEY)
    with pytest.raises(ConfigError) as err:
        load_store_config({typo: "1", "umbp_dram_bytes": "1024"}, env={})
    assert f"unknown extra-config key {typo!r}" in str(err.value)
    assert f"did you mean {key!r}" in str(err.value)


def test_unknown_environment_variables_are_errors() -> None:
    with pytest.raises(ConfigError, match=r"unknown variable HICACHE_UMBP_DRAM_BYTE .*did you"):
        load_store_config(env={"HICACHE_UMBP_DRAM_BYTE": "1", "HICACHE_UMBP_DRAM_BYTES": "1"})


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"umbp_mode": "standalone", "umbp_dram_bytes": "1"}, "only applies in umbp_mode embedded"),
        ({"umbp_socket_dir": "/x", "umbp_dram_bytes": "1"}, "only applies in umbp_mode standalone"),
        ({"umbp_mode": "embedded", "umbp_master_address": "m:1", "umbp_dram_bytes": "1"},
         "only applies in umbp_mode distributed"),
    ],
)
def test_keys_of_another_mode_are_errors(extra: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_store_config(extra, env={})


def test_extra_config_wins_over_env_which_wins_over_defaults() -> None:
    cfg = load_store_config(
        {"umbp_dram_bytes": "2048"},
        env={"HICACHE_UMBP_DRAM_BYTES": "1024", "HICACHE_UMBP_NAMESPACE": "ns/a"},
    )
    assert cfg.umbp_dram_bytes == (2048,)
    assert cfg.umbp_namespace == "ns/a"
    assert cfg.umbp_tier_write_policy == BY_KEY["umbp_tier_write_policy"].default
    assert cfg.sources["umbp_dram_bytes"] == "extra-config 'umbp_dram_bytes'"
    assert cfg.sources["umbp_namespace"] == "HICACHE_UMBP_NAMESPACE"
    assert cfg.sources["umbp_log_interval_s"] == "default"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"umbp_mode": "foo"}, "'umbp_mode'='foo' is not allowed; allowed values: embedded"),
        ({"umbp_local_ranks": "x"}, "'umbp_local_ranks'='x' is not an integer"),
    ],
)
def test_a_bad_mode_or_rank_count_is_reported_once(extra: dict[str, str], needle: str) -> None:
    """Mode and rank count are parsed first (other settings depend on them): one problem each."""
    with pytest.raises(ConfigError) as err:
        load_store_config({**extra, "umbp_dram_bytes": "1024"}, env={})
    assert [p for p in err.value.problems if needle in p] == [err.value.problems[0]]
    assert len(err.value.problems) == 1


def test_a_size_without_digits_is_not_claimed_to_parse() -> None:
    """std::stoull throws on 'abc' (no leading digits); the message must not say '0 bytes'."""
    with pytest.raises(ConfigError, match=r"HICACHE_UMBP_DRAM_BYTES='abc'.*cannot parse 'abc'"):
        load_store_config(env={"HICACHE_UMBP_DRAM_BYTES": "abc"})


# ----------------------------------------------------------------------------- issue 11, item 6e/6i


@pytest.mark.parametrize("raw", [float("inf"), float("-inf"), float("nan"), "Infinity", "NaN",
                                 "inf", "1e999"])
def test_non_finite_numbers_are_rejected_naming_the_key(raw: Any) -> None:
    """``json.loads`` turns the literals ``Infinity``/``NaN`` into floats; they used to pass and
    fail later (``umbp_standalone_wait_s=Infinity`` -> OverflowError)."""
    with pytest.raises(ConfigError, match=r"umbp_standalone_wait_s.*finite"):
        load_store_config({"umbp_mode": "standalone", "umbp_standalone_wait_s": raw}, env={})


def test_json_infinity_from_sglangs_extra_config_is_rejected() -> None:
    import json

    extra = json.loads('{"umbp_log_interval_s": Infinity}')
    with pytest.raises(ConfigError, match="umbp_log_interval_s"):
        load_store_config(extra, env={})


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.kind in ("bytes", "rank_bytes")],
                         ids=lambda s: s.key)
def test_byte_sizes_have_an_upper_bound_naming_the_key(s: Setting) -> None:
    """2**70 used to pass and fail inside mori without naming the key."""
    with pytest.raises(ValueError, match=rf"{s.key}.*above the maximum"):
        parse_value(s, s.key, 2**70, 1)
    assert parse_value(s, s.key, str(2**40), 1) in (2**40, (2**40,))


def test_numa_nodes_have_an_upper_bound() -> None:
    with pytest.raises(ConfigError, match=r"host_numa.*above the maximum"):
        load_store_config({"host_numa": 2**40, "umbp_dram_bytes": 1 << 30}, env={})


def test_an_invalid_env_value_is_reported_even_when_extra_config_sets_the_key() -> None:
    env = {"HICACHE_UMBP_DRAM_BYTES": "10Gi"}
    with pytest.raises(ConfigError) as err:
        load_store_config({"umbp_dram_bytes": 1 << 30}, env=env)
    assert "HICACHE_UMBP_DRAM_BYTES" in str(err.value) and "10Gi" in str(err.value)
    assert "extra-config" in str(err.value)  # says which source won
    # a valid env value under an extra-config key stays silent
    cfg = load_store_config({"umbp_dram_bytes": 1 << 30}, env={"HICACHE_UMBP_DRAM_BYTES": "5"})
    assert cfg.umbp_dram_bytes == (1 << 30,)


def test_sglangs_extra_backend_tag_is_accepted() -> None:
    cfg = load_store_config({"umbp_dram_bytes": 1 << 30, "extra_backend_tag": "blue"}, env={})
    assert cfg.umbp_dram_bytes == (1 << 30,)
