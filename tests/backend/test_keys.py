"""The page key scheme: namespaced, injective, page-major. Everything here is real (no doubles)."""

from __future__ import annotations

import pytest
from hicache_umbp.keys import MHA_PARTS, MLA_PARTS, KeyScheme, parse_key
from hypothesis import given
from hypothesis import strategies as st

# Any text mori can carry (UTF-8 encodable: no lone surrogates), slashes and percents included.
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
part_names = st.lists(text.filter(bool), min_size=1, max_size=3, unique=True).map(tuple)
schemes = st.builds(
    KeyScheme,
    namespace=text,
    model_id=text,
    tp_size=st.integers(1, 64),
    rank=st.integers(0, 511),
    parts=part_names,
)
hashes = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=70)


def _fields(s: KeyScheme) -> tuple[str, str, int, int]:
    return (s.namespace, s.model_id, s.tp_size, s.rank)


@given(a=schemes, b=schemes, ha=hashes, hb=hashes)
def test_keys_collide_only_when_every_field_is_equal(
    a: KeyScheme, b: KeyScheme, ha: str, hb: str
) -> None:
    for ia, ka in enumerate(a.page_keys(ha)):
        for ib, kb in enumerate(b.page_keys(hb)):
            same = _fields(a) == _fields(b) and a.parts[ia] == b.parts[ib] and ha == hb
            assert (ka == kb) == same, (ka, kb)


@given(s=schemes, h=hashes)
def test_key_parses_back_to_its_fields(s: KeyScheme, h: str) -> None:
    for part, key in zip(s.parts, s.page_keys(h), strict=False):
        assert parse_key(key) == (s.namespace, s.model_id, s.tp_size, s.rank, part, h)


@given(s=schemes, hs=st.lists(hashes, max_size=8))
def test_batch_keys_are_page_major(s: KeyScheme, hs: list[str]) -> None:
    expected = [k for h in hs for k in s.page_keys(h)]
    assert s.batch_keys(hs) == expected
    assert len(expected) == len(hs) * s.parts_per_page


def test_namespaces_with_slashes_do_not_collide() -> None:
    """'a/b' + model 'c' vs 'a' + model 'b/c': a naive join would give the same key."""
    one = KeyScheme("a/b", "c", 8, 0, MLA_PARTS)
    two = KeyScheme("a", "b/c", 8, 0, MLA_PARTS)
    assert one.page_keys("h") != two.page_keys("h")


def test_key_shape_is_documented_one() -> None:
    s = KeyScheme("prod/deepseek", "deepseek-ai/DeepSeek-R1", 8, 3, MHA_PARTS)
    assert s.page_keys("ab" * 32) == [
        "hicache/v1/prod%2Fdeepseek/deepseek-ai%2FDeepSeek-R1/tp8/r3/k/" + "ab" * 32,
        "hicache/v1/prod%2Fdeepseek/deepseek-ai%2FDeepSeek-R1/tp8/r3/v/" + "ab" * 32,
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 0}, "tp_size=0"),
        ({"rank": -1}, "rank=-1"),
        ({"parts": ()}, "parts must name"),
        ({"parts": ("k", "k")}, "distinct"),
        ({"parts": ("k", "")}, "distinct"),
    ],
)
def test_bad_scheme_is_refused_naming_the_field(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"namespace": "", "model_id": "m", "tp_size": 1, "rank": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        KeyScheme(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["plain", "hicache/v1/a/b/tp1/r0/k", "hicache/v2/a/b/tp1/r0/k/h"])
def test_parse_key_refuses_foreign_keys(key: str) -> None:
    with pytest.raises(ValueError, match="not a hicache/v1 page key"):
        parse_key(key)
