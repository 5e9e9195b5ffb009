"""SGLang's real HiCacheController drives backup and prefetch through the UMBP backend.

Real: the published SGLang server config (ServerArgs resolution for a tiny local model config,
no weights), HiCacheController with its prefetch / prefetch-io / sync / backup threads,
StorageBackendFactory loading the backend from the extra-config, MHA and MLA device and host
pools on CPU, SGLang's page-hash chain. The test plays the scheduler's part between the hit
query and the transfer (allocating host pages), exactly as UnifiedRadixCache does. Faked: the
UMBP client is the in-process double (no mori wheel for Python 3.11; the ``mori`` tier
validates it against the real client), used for fault injection.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.sglang_adapter import UMBPHiCacheStorage, dynamic_extra_config, use_client_opener
from support.memory_client import MemoryUMBPClient

from . import sglang_env as E

pytestmark = pytest.mark.sglang

MIB = 1 << 20
EXTRA = dynamic_extra_config(umbp_dram_bytes=64 * MIB, umbp_namespace="ns/ctrl",
                             host_hugepage_bytes=0)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The process state of a scheduler started by ``python -m hicache_umbp.serve``."""
    from hicache_umbp import sglang_hook

    model = E.tiny_model_dir(tmp_path_factory.mktemp("model"))
    E.publish_scheduler(model, EXTRA)
    sglang_hook.install()
    return model


@pytest.fixture
def rig(request: pytest.FixtureRequest, published: Path) -> Iterator[tuple[Any, Any, Any]]:
    kind = getattr(request, "param", "mha")
    client = MemoryUMBPClient(64 * MIB)
    from hicache_umbp.sglang_hook import UMBPHostTensorAllocator
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type

    dev = E.mla_device_pool() if kind == "mla" else E.mha_device_pool()
    # The allocator type SGLang's pool assembler asks for under this published config.
    host = E.host_pool(dev, allocator_type=get_allocator_type())
    assert isinstance(host.allocator, UMBPHostTensorAllocator)
    with use_client_opener(lambda rank_config: client):
        ctrl = E.controller(dev, host, EXTRA)
    yield ctrl, host, client
    ctrl.detach_storage_backend()


def tokens(n_pages: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n_pages * E.PAGE)]


def threads_alive(ctrl: Any) -> bool:
    return all(
        t.is_alive()
        for t in (ctrl.prefetch_thread, ctrl.prefetch_io_aux_thread,
                  ctrl.prefetch_sync_thread, ctrl.backup_thread)
    )


@pytest.mark.parametrize("rig", ["mha", "mla"], indirect=True)
def test_backup_then_prefetch_round_trips_byte_exact(rig: tuple[Any, Any, Any]) -> None:
    ctrl, host, _client = rig
    assert isinstance(ctrl.storage_backend, UMBPHiCacheStorage)
    assert ctrl.page_get_func == ctrl._page_get_zero_copy  # interface_v1 took effect
    toks = tokens(7, seed=1)
    hashes = E.page_hashes(toks)
    assert all(len(h) == 64 for h in hashes)
    idx = host.alloc(len(toks))
    E.fill_random(host, seed=2)
    before = E.page_bytes(host, idx)
    assert E.backup(ctrl, idx, toks, hashes) == len(toks)
    host.free(idx)
    E.wipe(host)
    fetched, new_idx, op = E.prefetch(ctrl, "req-1", toks)
    assert fetched == len(toks)
    assert op.hash_value == hashes
    assert E.page_bytes(host, new_idx) == before
    assert threads_alive(ctrl)


def test_prefetch_stops_at_the_first_missing_page(rig: tuple[Any, Any, Any]) -> None:
    ctrl, host, _ = rig
    toks = tokens(6, seed=3)
    hashes = E.page_hashes(toks)
    idx = host.alloc(3 * E.PAGE)
    E.fill_random(host, seed=4)
    before = E.page_bytes(host, idx)
    assert E.backup(ctrl, idx, toks[: 3 * E.PAGE], hashes[:3]) == 3 * E.PAGE
    host.free(idx)
    E.wipe(host)
    fetched, new_idx, op = E.prefetch(ctrl, "req-2", toks)
    assert fetched == 3 * E.PAGE
    assert op.hash_value == hashes[:3]
    assert E.page_bytes(host, new_idx) == before
    miss, none_idx, _ = E.prefetch(ctrl, "req-3", tokens(2, seed=99))
    assert (miss, none_idx) == (0, None)


@pytest.mark.parametrize("fault", ["raise", "false", "none", "partial"])
def test_faults_mid_batch_leave_threads_alive_and_data_intact(
    rig: tuple[Any, Any, Any], fault: str
) -> None:
    ctrl, host, client = rig
    good = tokens(4, seed=5)
    good_hashes = E.page_hashes(good)
    idx = host.alloc(len(good))
    E.fill_random(host, seed=6)
    good_bytes = E.page_bytes(host, idx)
    assert E.backup(ctrl, idx, good, good_hashes) == len(good)

    # A failing backup: the controller records no completed tokens for the failed batch.
    bad = tokens(4, seed=7)
    bad_idx = host.alloc(len(bad))
    client.inject("batch_put_from_ptr", fault)  # type: ignore[arg-type]
    assert E.backup(ctrl, bad_idx, bad, E.page_hashes(bad)) == 0
    # A failing prefetch of stored pages: zero (or a prefix for "partial") pages, no crash.
    client.inject("batch_get_into_ptr", fault)  # type: ignore[arg-type]
    E.wipe(host)
    fetched, f_idx, _ = E.prefetch(ctrl, "req-fault", good)
    assert fetched < len(good)
    if f_idx is not None:
        host.free(f_idx)
    client.inject("batch_exists_consecutive", fault)  # type: ignore[arg-type]
    missed, _, _ = E.prefetch(ctrl, "req-exists-fault", good)
    assert missed == 0 or fault == "partial"
    assert threads_alive(ctrl)

    # The same threads keep serving; the stored pages were not corrupted by the faults.
    host.free(idx)
    host.free(bad_idx)
    E.wipe(host)
    fetched, new_idx, _ = E.prefetch(ctrl, "req-after", good)
    assert fetched == len(good)
    assert E.page_bytes(host, new_idx) == good_bytes
    assert threads_alive(ctrl)
    errors = ctrl.storage_backend.umbp_stats()["errors"]
    assert errors, "the faults were counted"
