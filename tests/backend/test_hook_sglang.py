"""Our host allocator is the one behind SGLang's real host pools, in every process that builds one.

Real: SGLang 0.5.23's plugin HookRegistry, get_allocator_from_storage / get_allocator_type,
the published server config, MHATokenToKVPoolHost and MLATokenToKVPoolHost built through their
constructors, multiprocessing spawn (as SGLang's engine uses it), the kernel's view of the
buffer (/proc/self/smaps), our config parsing and the core allocator on mori's
``UMBPHostMemAllocator`` (mori and SGLang share the engine environment's Python). Nothing is
faked except the model (a tiny local config.json, no weights).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.names import dynamic_extra_config
from hicache_umbp.hostmem.allocator import HugepagesUnavailableError, hugepages_free
from hicache_umbp.sglang import hook as sglang_hook
from hicache_umbp.sglang import host_allocator

from . import sglang_env as E

pytestmark = pytest.mark.sglang

MIB = 1 << 20
TESTS_DIR = Path(__file__).resolve().parents[1]


def smaps_entry(ptr: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds ``ptr``."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= ptr < hi
                if inside:
                    fields["range"] = head
            elif inside and head.endswith(":"):
                fields[head[:-1]] = " ".join(line.split()[1:])
    return fields


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


def build_pool(model_dir: Path, kind: str, **settings: Any) -> Any:
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type

    extra = dynamic_extra_config(umbp_dram_bytes=64 * MIB, **settings)
    E.publish_scheduler(model_dir, extra)
    sglang_hook.install()
    dev = E.mla_device_pool() if kind == "mla" else E.mha_device_pool()
    return E.host_pool(dev, allocator_type=get_allocator_type())


def numa_policy(ptr: int) -> str:
    """The memory policy /proc/self/numa_maps reports for the mapping that holds ``ptr``."""
    best = ""
    with open("/proc/self/numa_maps") as f:
        for line in f:
            start, policy = line.split()[:2]
            if int(start, 16) <= ptr:
                best = policy  # lines are sorted by start address
    return best


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_real_host_pool_is_backed_by_our_allocator(model_dir: Path, kind: str) -> None:
    pool = build_pool(model_dir, kind, host_hugepage_bytes=0, host_prefault=True, host_numa=0)
    allocator = pool.allocator
    assert isinstance(allocator, host_allocator.UMBPHostTensorAllocator)
    record = allocator.allocations[-1]
    ptr = pool.kv_buffer.data_ptr()
    assert ptr == record.ptr
    assert record.nbytes == pool.kv_buffer.numel() * pool.kv_buffer.element_size()
    assert record in host_allocator.host_pool_status()
    lo, hi = (int(x, 16) for x in smaps_entry(ptr)["range"].split("-"))
    assert lo <= ptr and ptr + record.nbytes <= hi
    # The kernel's view: 4 KiB pages as asked, and the NUMA binding only our allocator applies
    # (SGLang's default allocator leaves the default policy).
    assert smaps_entry(ptr)["KernelPageSize"] == "4 kB"
    assert numa_policy(ptr) == "bind:0"
    # mori's UMBPHostMemAllocator makes the buffer, as in the engine image (SGLang and mori in
    # one Python).
    assert record.backing == "mori/4KiB" and not record.demoted and record.numa_node == 0
    pool.kv_buffer.view(-1)[:8] = 1  # SGLang writes through the tensor into our buffer


def test_hugepage_demotion_is_logged_flagged_and_reported(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    report = tmp_path / "launch-report.json"
    monkeypatch.setenv("HICACHE_REPORT_PATH", str(report))
    free = hugepages_free(2 * MIB)
    with caplog.at_level(logging.INFO, logger="hicache_umbp.sglang.host_allocator"):
        pool = build_pool(model_dir, "mha", host_hugepage_bytes=2 * MIB,
                          host_allow_4k_fallback=True, host_prefault=False)
    record = pool.allocator.allocations[-1]
    status = json.loads((tmp_path / "host-pool-rank0.json").read_text())
    assert status["ptr"] == record.ptr and status["demoted"] == record.demoted
    page_kb = smaps_entry(record.ptr)["KernelPageSize"]
    if free * 2 * MIB >= record.nbytes:  # this machine had hugepages for it
        assert not record.demoted and page_kb == "2048 kB"
        return
    assert record.demoted and host_allocator.any_demoted()
    assert page_kb == "4 kB" and record.page_bytes == 4096
    assert any("HUGEPAGES DEMOTED" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)


def test_missing_hugepages_fail_the_pool_without_fallback(model_dir: Path) -> None:
    if hugepages_free(2 * MIB) > 0:
        pool = build_pool(model_dir, "mha", host_hugepage_bytes=2 * MIB, host_prefault=False)
        assert not pool.allocator.allocations[-1].demoted
        return
    with pytest.raises(HugepagesUnavailableError, match="hugepages"):
        build_pool(model_dir, "mha", host_hugepage_bytes=2 * MIB, host_prefault=False)


def test_other_backends_keep_sglangs_allocator(model_dir: Path) -> None:
    from sglang.srt.mem_cache.pool_host.common import HostTensorAllocator, get_allocator_type

    E.publish_scheduler(model_dir, None, backend="file")
    sglang_hook.install()
    pool = E.host_pool(E.mha_device_pool(), allocator_type=get_allocator_type())
    assert type(pool.allocator) is HostTensorAllocator
    sglang_hook.check_pool_allocator(pool)  # chosen through the hook: no error


def test_pool_built_around_the_hook_is_detected() -> None:
    from sglang.srt.mem_cache.pool_host.common import HostTensorAllocator

    sglang_hook.install()

    class Pool:
        allocator = HostTensorAllocator()  # never asked get_allocator_from_storage

    with pytest.raises(RuntimeError, match="internals changed"):
        sglang_hook.check_pool_allocator(Pool())


def test_install_refuses_another_sglang_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang

    monkeypatch.setattr(sglang_hook, "_installed", False)
    monkeypatch.setattr(sglang, "__version__", "0.5.24")
    with pytest.raises(RuntimeError, match=r"supports SGLang 0\.5\.23, found 0\.5\.24"):
        sglang_hook.install()


def test_the_hook_reaches_every_module_binding_the_function() -> None:
    import importlib

    from sglang.srt.mem_cache.pool_host import common

    sglang_hook.install()
    for name in sglang_hook.BINDING_MODULES:
        assert sglang_hook._answers_probe(importlib.import_module(name)), name
    original = common.get_allocator_from_storage.__wrapped__
    assert not sglang_hook._answers_probe(type("M", (), {"get_allocator_from_storage":
                                                         staticmethod(original)}))


CHILD = textwrap.dedent(
    """
    import json, multiprocessing as mp, sys
    sys.path.insert(0, {tests!r})
    # What `python -m hicache_umbp.serve` does: import the module as the main module.
    import hicache_umbp.serve as serve
    sys.modules["__main__"] = serve
    from backend.sglang_env import spawn_probe
    ctx = mp.get_context("spawn")  # SGLang's engine: mp.set_start_method("spawn")
    with ctx.Pool(1) as pool:
        print(json.dumps(pool.apply(spawn_probe, ({model!r},))))
    """
)


def test_spawned_sglang_children_install_the_hook_before_building_pools(model_dir: Path) -> None:
    code = CHILD.format(tests=str(TESTS_DIR), model=str(model_dir))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["main_module"] == "hicache_umbp.serve"
    assert result["installed_before_target"] is True
    assert result["allocator"] == "UMBPHostTensorAllocator"
    assert result["ptr_matches"] is True


def test_sglang_dp_rank_picks_the_host_pool_settings_of_that_rank(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_DP_RANK", "1")
    pool = build_pool(model_dir, "mha", umbp_local_ranks=2, host_numa="-1,0",
                      host_hugepage_bytes=0, host_prefault=False)
    record = pool.allocator.allocations[-1]
    assert (record.local_rank, record.numa_node) == (1, 0)
    assert numa_policy(record.ptr) == "bind:0"
