"""The page key scheme (v2): namespaced, versioned, injective, page-major, and carrying every
field that changes a page's bytes. Everything here is real (no doubles)."""

from __future__ import annotations

from typing import Any

import pytest
from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS
from hicache_umbp.store.keys import SCHEME, SCHEME_VERSION, KeyScheme, PageFormat, parse_key
from hypothesis import given
from hypothesis import strategies as st

# Any text mori can carry (UTF-8 encodable: no lone surrogates), slashes and percents included.
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20)
part_names = st.lists(text.filter(bool), min_size=1, max_size=3, unique=True).map(tuple)
formats = st.builds(PageFormat, layout=text, kv_dtype=text, page_tokens=st.integers(0, 4096),
                    format_tag=text)
schemes = st.builds(
    KeyScheme,
    namespace=text,
    model_id=text,
    tp_size=st.integers(1, 64),
    rank=st.integers(0, 511),
    parts=part_names,
    page_format=formats,
    backend_tag=text,
)
hashes = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=70)


def _fields(s: KeyScheme) -> tuple[object, ...]:
    return (s.namespace, s.backend_tag, s.model_id, s.page_format, s.tp_size, s.rank)


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
        f = parse_key(key)
        assert (f.namespace, f.backend_tag, f.model_id, f.page_format, f.tp_size, f.rank) == (
            _fields(s)
        )
        assert (f.part, f.page_hash) == (part, h)


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


@pytest.mark.parametrize(
    "change",
    [
        {"page_format": PageFormat("page_first_direct", "bfloat16", 64)},
        {"page_format": PageFormat("page_first", "float16", 64)},
        {"page_format": PageFormat("page_first", "uint8:fp8_e5m2", 64)},
        {"page_format": PageFormat("page_first", "bfloat16", 128)},
        {"page_format": PageFormat("page_first", "bfloat16", 64, "unified-token-major")},
        {"backend_tag": "blue"},
    ],
    ids=["layout", "dtype", "fp8-variant", "page-size", "format-tag", "backend-tag"],
)
def test_each_page_format_field_separates_keys(change: dict[str, Any]) -> None:
    base: dict[str, Any] = dict(namespace="ns", model_id="m", tp_size=8, rank=0, parts=MHA_PARTS,
                                page_format=PageFormat("page_first", "bfloat16", 64))
    one = KeyScheme(**base)
    two = KeyScheme(**{**base, **change})
    assert set(one.page_keys("h")).isdisjoint(two.page_keys("h"))


def test_key_shape_is_the_documented_one() -> None:
    fmt = PageFormat("page_first", "bfloat16", 64, "unified-token-major")
    s = KeyScheme("prod/deepseek", "deepseek-ai/DeepSeek-R1", 8, 3, MHA_PARTS, fmt, "blue")
    head = ("hicache/v2/prod%2Fdeepseek/blue/deepseek-ai%2FDeepSeek-R1/unified-token-major/"
            "page_first/bfloat16/p64/tp8/r3")
    assert s.page_keys("ab" * 32) == [f"{head}/k/{'ab' * 32}", f"{head}/v/{'ab' * 32}"]
    assert f"hicache/v{SCHEME_VERSION}" == SCHEME and SCHEME_VERSION == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 0}, "tp_size=0"),
        ({"rank": -1}, "rank=-1"),
        ({"parts": ()}, "parts must name"),
        ({"parts": ("k", "k")}, "distinct"),
        ({"parts": ("k", "")}, "distinct"),
        ({"page_format": "page_first"}, "page_format="),
    ],
)
def test_bad_scheme_is_refused_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"namespace": "", "model_id": "m", "tp_size": 1, "rank": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        KeyScheme(**args)


def test_bad_page_format_is_refused() -> None:
    with pytest.raises(ValueError, match="page_tokens=-1"):
        PageFormat("page_first", "bfloat16", -1)


@pytest.mark.parametrize(
    "key",
    [
        "plain",
        "hicache/v1/a/b/tp1/r0/k/h",  # a v1 key: never read by v2
        "hicache/v2/a//m//page_first/bf16/p64/tp1/r0/k",  # no hash
        "hicache/v2/a//m//page_first/bf16/x64/tp1/r0/k/h",  # bad page field
        "hicache/v3/a//m//page_first/bf16/p64/tp1/r0/k/h",
    ],
)
def test_parse_key_refuses_foreign_keys(key: str) -> None:
    with pytest.raises(ValueError, match="not a hicache/v2 page key"):
        parse_key(key)
