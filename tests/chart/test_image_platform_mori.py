"""The engine image's Python and glibc can carry the wheels the engine environment really runs.

Real: this test runs in the test engine environment (scripts/build-engine-env.sh: the pins of
scripts/engine-env.lock, installed with pip) and reads the installed wheels' own metadata --
amd-mori's WHEEL tags, sglang's Requires-Python -- and the interpreter that runs them. It checks
the image pins (backend/hicache_umbp/versions.py) and the Dockerfile's build arguments against
them. The image itself cannot be built here (no Docker engine); its first RUN repeats the check.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from hicache_umbp.contract import versions

pytestmark = pytest.mark.mori

ROOT = Path(__file__).resolve().parents[2]


def _tags(dist: str) -> list[str]:
    wheel = metadata.distribution(dist).read_text("WHEEL") or ""
    return [line.split(":", 1)[1].strip() for line in wheel.splitlines()
            if line.startswith("Tag:")]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_the_engine_environment_runs_the_image_python_and_pins() -> None:
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" == versions.ENGINE_PYTHON
    assert metadata.version("sglang") == versions.SGLANG_VERSION
    assert metadata.version("amd-mori") == versions.AMD_MORI_VERSION


def test_the_image_glibc_and_python_fit_the_installed_wheel_tags() -> None:
    py_tag = "cp" + versions.ENGINE_PYTHON.replace(".", "")
    (tag,) = _tags("amd-mori")
    python, abi, platform = tag.split("-")
    assert python == py_tag == abi
    glibc = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
    assert glibc, platform
    assert (int(glibc[1]), int(glibc[2])) <= _version(versions.ENGINE_MIN_GLIBC)
    requires = metadata.metadata("sglang")["Requires-Python"]
    from packaging.specifiers import SpecifierSet

    assert versions.ENGINE_PYTHON in SpecifierSet(requires), requires


def test_the_dockerfile_builds_on_that_platform_and_checks_it() -> None:
    text = (ROOT / "images" / "engine" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    assert args["PYTHON_VERSION"] == versions.ENGINE_PYTHON
    assert args["MIN_GLIBC"] == versions.ENGINE_MIN_GLIBC
    assert f"FROM {versions.ENGINE_BASE_IMAGE}\n" in text
    assert "CS_GNU_LIBC_VERSION" in text and "'${PYTHON_VERSION}'" in text
    script = (ROOT / "scripts" / "build-engine-env.sh").read_text()
    assert f"version_info[:2] != ({versions.ENGINE_PYTHON.replace('.', ', ')})" in script
