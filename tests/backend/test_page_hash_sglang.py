"""SGLang's page-hash extension is built and loaded before an engine with an L3 tier serves
(hicache_umbp.sglang.page_hash), in the real SGLang 0.5.23 of the engine environment.

Real: SGLang's native-hash module and its JIT build (torch cpp_extension, g++, ninja) into a
fresh ``TORCH_EXTENSIONS_DIR``, the host-allocator hook, a real host pool built the way a
scheduler builds it. Each case runs in a fresh interpreter, as a scheduler process starts (the
loaded extension is cached per process). Nothing is faked; no time is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from . import sglang_env as E

pytestmark = pytest.mark.sglang

TESTS_DIR = Path(__file__).resolve().parents[1]

SCHEDULER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from backend import sglang_env as E
    from hicache_umbp.sglang import hook, page_hash
    from sglang.srt.mem_cache.cpp_utils import native_hash
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type

    hook.install()
    E.publish_scheduler(Path({model!r}), {extra!r}, backend={backend!r})
    loaded_before = native_hash._load_native_hash_module.cache_info().currsize
    pool = E.host_pool(E.mha_device_pool(), allocator_type=get_allocator_type())
    print(json.dumps({{
        "loaded_before": loaded_before,
        "loaded_after": native_hash._load_native_hash_module.cache_info().currsize,
        "ready_s": page_hash.ready_seconds(),
        "records": [a.page_hash_s for a in getattr(pool.allocator, "allocations", [])],
    }}))
    """
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


def scheduler(model_dir: Path, ext_dir: Path, backend: str | None,
              extra: dict[str, object] | None) -> subprocess.CompletedProcess[str]:
    code = SCHEDULER.format(tests=str(TESTS_DIR), model=str(model_dir), extra=extra,
                            backend=backend)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_")}
    env["TORCH_EXTENSIONS_DIR"] = str(ext_dir)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=env)


def test_a_scheduler_with_an_l3_backend_loads_the_page_hash_before_it_serves(
        model_dir: Path, tmp_path: Path) -> None:
    ext = tmp_path / "torch-extensions"
    extra = {"backend_name": "umbp", "module_path": "hicache_umbp.sglang_adapter",
             "class_name": "UMBPHiCacheStorage", "interface_v1": 1,
             "umbp_dram_bytes": 1 << 26, "host_hugepage_bytes": 0}
    for build in ("built", "cached"):  # a fresh directory, then the same one (a restart)
        out = scheduler(model_dir, ext, "dynamic", extra)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["loaded_before"] == 0 and got["loaded_after"] == 1, (build, got)
        assert got["ready_s"] is not None and got["records"] == [round(got["ready_s"], 4)]
        assert list(ext.rglob("hicache_hash_cpp*.so")), f"{build}: no build in {ext}"


def test_an_engine_without_an_l3_tier_builds_nothing(model_dir: Path, tmp_path: Path) -> None:
    ext = tmp_path / "torch-extensions"
    out = scheduler(model_dir, ext, None, None)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["loaded_after"], got["ready_s"]) == (0, None)
    assert not list(ext.rglob("*.so"))


def test_a_page_hash_that_cannot_be_built_fails_the_start_naming_what_is_missing(
        model_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    out = scheduler(model_dir, blocker, "dynamic",
                    {"backend_name": "umbp", "module_path": "hicache_umbp.sglang_adapter",
                     "class_name": "UMBPHiCacheStorage", "interface_v1": 1,
                     "umbp_dram_bytes": 1 << 26, "host_hugepage_bytes": 0})
    assert out.returncode != 0
    assert "PageHashUnavailableError" in out.stderr
    assert "TORCH_EXTENSIONS_DIR" in out.stderr and str(blocker) in out.stderr
