"""The host-allocator hook with SGLang's built-in ``mori`` backend: its hugepage pool is
checked against hugepages, not host RAM, and each scheduler gets its own NUMA node.

Real: SGLang 0.5.23's host pool constructor and its ``host_memory_budget_bytes`` check (the
budget is narrowed with SGLang's own ``host_memory_budget_scope``, standing in for a tight
container memory limit, which the pod tier applies for real), SGLang's
``UMBPHostTensorAllocator`` over mori's allocator, hugepages reserved in the kernel, the
kernel's view of the buffer (/proc/self/smaps, /proc/self/numa_maps).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.sglang import hook as sglang_hook

from . import sglang_env as E
from .test_hook_sglang import numa_policy, smaps_entry

pytestmark = pytest.mark.sglang

TIGHT_BUDGET = 4096  # bytes of host RAM SGLang may book: far below any pool here


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith(("UMBP_", "HICACHE_", "SGLANG_HICACHE_"))]:
        monkeypatch.delenv(name)
    yield


def builtin_pool(model_dir: Path, budget: int | None = None) -> Any:
    """A host pool as SGLang builds it for ``--hicache-storage-backend mori``."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    E.publish_scheduler(model_dir, {"ssd_enabled": False}, backend="mori")
    sglang_hook.install()
    if budget is None:
        return E.host_pool(E.mha_device_pool(), allocator_type="mori")
    with host_memory_budget_scope(budget):
        return E.host_pool(E.mha_device_pool(), allocator_type="mori")


def test_builtin_hugepage_pool_passes_the_check_its_4k_twin_fails(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, hugepages_2m: Callable[[int], Any],
) -> None:
    hugepages_2m(4)
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE", "0")
    with pytest.raises(ValueError, match="Not enough host memory available"):
        builtin_pool(model_dir, TIGHT_BUDGET)  # SGLang's check for 4 KiB pools is unchanged
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE", "1")
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE_SIZE", str(2 << 20))
    pool = builtin_pool(model_dir, TIGHT_BUDGET)
    assert smaps_entry(pool.kv_buffer.data_ptr())["KernelPageSize"] == "2048 kB"


def test_builtin_pool_short_of_hugepages_keeps_sglangs_check(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the hugepages would not fit nothing is bypassed: SGLang's own check (and, were it to
    pass, its demotion to 4 KiB pages) applies; the launcher refuses such a start earlier. The
    shortage is the one fake here (this machine's free pages change with other jobs); the node
    check itself is the launcher's (tests/launcher/test_hugepages.py)."""
    seen: list[tuple[int, int, int]] = []

    def short(page: int, numa: int, nbytes: int, what: str) -> list[str]:
        seen.append((page, numa, nbytes))
        return [f"{what}: the node has 0 free 2 MiB pages"]

    monkeypatch.setattr(sglang_hook, "hugepage_problems", short)
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE", "1")
    monkeypatch.setenv("SGLANG_HICACHE_HOST_NUMA_NODE", "0")
    with pytest.raises(ValueError, match="Not enough host memory available"):
        builtin_pool(model_dir, TIGHT_BUDGET)
    assert len(seen) == 1 and seen[0][:2] == (2 << 20, 0) and seen[0][2] > TIGHT_BUDGET


def test_each_scheduler_binds_its_builtin_pool_to_its_ranks_node(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher leaves SGLANG_HICACHE_HOST_NUMA_NODE out when ranks span nodes; the hook
    sets this scheduler's (rank 0 here) from HICACHE_HOST_NUMA before SGLang's allocator reads
    it, and the kernel shows the binding."""
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE", "0")
    monkeypatch.setenv("HICACHE_UMBP_LOCAL_RANKS", "2")
    monkeypatch.setenv("HICACHE_HOST_NUMA", "0,-1")
    pool = builtin_pool(model_dir)
    assert pool.allocator._numa_node == 0
    assert os.environ["SGLANG_HICACHE_HOST_NUMA_NODE"] == "0"
    assert numa_policy(pool.kv_buffer.data_ptr()) == "bind:0"
