"""docs/env.md is the settings table, generated (``make env-doc``), like the CRD from the API.

Real: the settings table, its parser and the generator; nothing is faked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hicache_umbp.contract import mori_env
from hicache_umbp.contract.envdoc import ALSO, FROM_CR, render_env_doc
from hicache_umbp.contract.settings import BY_KEY, SETTINGS

pytestmark = pytest.mark.unit

ENV_DOC = Path(__file__).resolve().parents[2] / "docs" / "env.md"


def test_the_committed_env_reference_is_the_generated_one() -> None:
    assert ENV_DOC.read_text() == render_env_doc(), "run `make env-doc` and commit docs/env.md"


def test_every_setting_says_where_it_comes_from() -> None:
    assert set(FROM_CR) == set(BY_KEY)
    assert set(ALSO) <= set(BY_KEY)
    doc = render_env_doc()
    for s in SETTINGS:
        assert f"| `{s.env}` | `{s.key}` |" in doc


def test_one_row_answers_which_variable_sets_the_dram_capacity() -> None:
    """The embedded store's variable, the standalone sidecar's mori variable, the built-in
    backend's key and the CR field are one row."""
    (row,) = [line for line in render_env_doc().splitlines()
              if line.startswith("| `HICACHE_UMBP_DRAM_BYTES` |")]
    for name in (mori_env.DRAM_CAPACITY, "dram_capacity_bytes", "spec.l3.dram.capacity"):
        assert name in row
