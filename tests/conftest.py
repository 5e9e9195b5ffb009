"""Test tiers.

A tier is a pytest marker. Tests that need a heavy environment live in files named
``test_*_<tier>.py`` for the tiers with their own interpreter (``mori``, ``sglang`` and ``pod``:
the engine environment, Python 3.12 with the real amd-mori 1.2.4, SGLang 0.5.23 and torch, see
scripts/build-engine-env.sh). Those files set ``pytestmark`` themselves. Running ``-m mori``
or ``-m sglang`` collects only such files (the other test modules import packages that
environment does not carry); every other run skips them. Tests without a tier marker are
``unit``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

VENV_TIERS = ("mori", "sglang", "pod")
TIERS = ("unit", "mori", "sglang", "pod", "e2e", "chart")


def _selected_venv_tier(config: pytest.Config) -> str | None:
    expr = (config.getoption("markexpr") or "").strip()
    return expr if expr in VENV_TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    if _selected_venv_tier(config) == "sglang":
        # SGLang's CPU mode, read once at SGLang's import (memory_pool._is_cpu, is_cpu()): set
        # before any test module imports sglang, as the pod tier's engine env sets it.
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    tier = _selected_venv_tier(config)
    if collection_path.is_dir():
        # A venv tier's interpreter lacks the other tiers' packages: skip directories (and so
        # their conftest.py) that hold no test file of that tier.
        if tier is not None and not any(collection_path.rglob(f"test_*_{tier}.py")):
            return True
        return None
    if not collection_path.name.startswith("test_"):
        return None
    stem = collection_path.stem
    file_tier = next((t for t in VENV_TIERS if stem.endswith(f"_{t}")), None)
    if file_tier != tier:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(pytest.mark.unit)
