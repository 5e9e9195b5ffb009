"""The planner's owned-flag rule against SGLang's real command-line parser.

Real: SGLang 0.5.23's ``ServerArgs.add_cli_args`` parser (the one ``sglang serve`` uses) and the
launcher's ``owned_flag`` (shared with the planner). Nothing is faked.
"""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p


def _owned_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    from hicache_umbp.launch.command import OWNED_FLAGS

    return [parser._option_string_actions[f] for f in sorted(OWNED_FLAGS)]


def test_every_spelling_of_an_owned_flag_is_rejected(parser: argparse.ArgumentParser) -> None:
    from hicache_umbp.launch.command import owned_flag

    spellings = {s for a in _owned_actions(parser) for s in a.option_strings}
    assert "--model" in spellings  # the alias the planner must know about
    assert [s for s in sorted(spellings) if owned_flag(s) is None] == []


def test_abbreviations_reach_owned_flags_and_no_real_flag_is_caught(
    parser: argparse.ArgumentParser,
) -> None:
    """argparse's allow_abbrev makes prefixes dangerous; the prefix rule must never hit a real,
    non-owned SGLang flag (exact option strings win over abbreviations in argparse)."""
    from hicache_umbp.launch.command import owned_flag

    assert parser.allow_abbrev
    assert parser.parse_args(["--model-path", "m", "--page-s", "32"]).page_size == 32
    assert owned_flag("--page-s") is not None
    owned = {s for a in _owned_actions(parser) for s in a.option_strings}
    real = [f for f in parser._option_string_actions if f.startswith("--") and f not in owned]
    caught = [f for f in real if owned_flag(f) is not None and not f.startswith("--hicache-")]
    assert caught == []
