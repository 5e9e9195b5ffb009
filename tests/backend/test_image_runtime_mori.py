"""The engine image's build-time mori check, run against the engine environment (issue finding 3).

No Docker engine exists here, so the image's ``RUN images/engine/check-mori-runtime.sh`` cannot
be built; the same script runs against the test engine environment, which carries mori's
runtime libraries the way the image must (scripts/engine-runtime.lock). Real: the installed
amd-mori 1.2.4 wheel, its ELF files, the dynamic loader, ``import mori.umbp`` and
``umbp_standalone_server``. The second test takes libraries away (a copy of the library
directory without them) and the script must fail naming them, as the image build would on a
base without them (the upstream build removes ``libabsl20220623``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hicache_umbp.clients.runtime import LOADER_ENV, mori_loader_prefix

pytestmark = pytest.mark.mori

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "engine" / "check-mori-runtime.sh"


def _run(loader: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, LOADER_ENV: shlex.join(loader)}
    return subprocess.run(["bash", str(SCRIPT), sys.executable], env=env, capture_output=True,
                          text=True, timeout=300)


def test_mori_runtime_is_complete_in_the_engine_environment() -> None:
    r = _run(mori_loader_prefix())
    assert r.returncode == 0, r.stderr
    assert "umbp_standalone_server starts" in r.stderr


def test_a_missing_runtime_library_fails_the_check(tmp_path: Path) -> None:
    loader = mori_loader_prefix()
    if "--library-path" not in loader:
        pytest.skip("mori runs under the system loader here: no library directory to thin out")
    libdir = Path(loader[loader.index("--library-path") + 1])
    thin = tmp_path / "lib"
    thin.mkdir()
    gone = ("libgrpc++.so.1.51", "libabsl_hash.so.20220623")
    for entry in libdir.iterdir():
        if not entry.name.startswith(gone):
            (thin / entry.name).symlink_to(entry.resolve())
    ld = thin / Path(loader[0]).name
    r = _run([str(ld), "--library-path", str(thin)])
    assert r.returncode == 1, r.stderr
    assert "umbp_standalone_server needs libgrpc++.so.1.51" in r.stderr
    assert "does not start" in r.stderr
