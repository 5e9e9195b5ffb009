"""What SGLang 0.5.23's built-in ``mori`` backend really does on amd-mori 1.2.4: measured facts.

The operator's validation of ``spec.l3.backend: sglang-mori`` (hicache_umbp.contract.settings
``_builtin_rules``, planner) and the comparison in docs/architecture.md rest on these tests.

Real: SGLang's ``UMBPStore`` and its own host allocator (``--hicache-storage-backend mori``),
SGLang's host pools (MHA and MLA) and storage config, mori 1.2.4's clients, and
``umbp_standalone_server`` processes started with the env the operator renders for its sidecars
(:func:`hicache_umbp.contract.mori_env.standalone_server_env`). Nothing is faked; the model is a
tiny config (no weights).

Its SSD and restart facts (no SSD byte in-process, a standalone SSD server needs staging slots
for a whole batch, standalone DRAM serves the next engine) are pinned through SGLang's controller,
side by side with ours, in tests/backend/test_builtin_mori_sglang.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hicache_umbp.contract.mori_env import standalone_client_env, standalone_server_env

from . import sglang_env as E

pytestmark = pytest.mark.sglang

MIB = 1 << 20
PAGES = 32  # pages per batch below; SGLang sends up to 128 (STORAGE_BATCH_SIZE)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No UMBP_* from the machine; 4 KiB host pools (no hugepages are reserved here)."""
    for name in [n for n in os.environ if n.startswith(("UMBP_", "HICACHE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SGLANG_HICACHE_HOST_HUGEPAGE", "0")
    yield


def builtin_store(model_dir: Path, extra: dict[str, Any], *, mla: bool = False,
                  tp_rank: int = 0, tp_size: int = 1, model_name: str = "tiny-llama") -> Any:
    """SGLang's own ``UMBPStore`` for one rank over a host pool from SGLang's own allocator,
    built as ``StorageBackendFactory`` builds it (``UMBPStore(storage_config, host_pool)``)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type
    from sglang.srt.mem_cache.storage.umbp.umbp_host_allocator import UMBPHostTensorAllocator
    from sglang.srt.mem_cache.storage.umbp.umbp_store import UMBPStore

    E.publish_scheduler(model_dir, extra, backend="mori")
    assert get_allocator_type() == "mori"
    host = E.host_pool(E.mla_device_pool() if mla else E.mha_device_pool(),
                       allocator_type="mori")
    assert isinstance(host.allocator, UMBPHostTensorAllocator)
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model_name, extra_config=dict(extra))
    return UMBPStore(cfg, host)


def pages(n: int = PAGES) -> tuple[list[str], torch.Tensor]:
    keys = [f"{i:064x}" for i in range(n)]
    return keys, torch.arange(E.PAGE, (n + 1) * E.PAGE, dtype=torch.int64)


def page_part_bytes(store: Any, idx: torch.Tensor) -> int:
    _, sizes = store.mem_pool_host.get_page_buffer_meta(idx[: E.PAGE])
    return int(sizes[0]) if isinstance(sizes, list) else int(sizes)


def test_keys_carry_no_model_name(
    model_dir: Path, standalone_servers: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two models on one server: the second reads the first one's pages as its own (v1 keys are
    ``<page hash>_<tp rank>_<k|v>``; the model name only prefixes v2 side-pool keys)."""
    server = standalone_servers.start("dram", standalone_server_env("dram",
                                                                    capacity_bytes=64 * MIB))
    for k, v in standalone_client_env(server.socket_path).items():
        monkeypatch.setenv(k, v)
    keys, idx = pages()
    a = builtin_store(model_dir, {"ssd_enabled": False}, model_name="org/model-a")
    E.fill_random(a.mem_pool_host, seed=4)
    want = E.page_bytes(a.mem_pool_host, idx)
    assert all(a.batch_set_v1(keys, idx))
    b = builtin_store(model_dir, {"ssd_enabled": False, "extra_backend_tag": "other"},
                      model_name="org/model-b")
    E.wipe(b.mem_pool_host)
    assert b.batch_exists(keys) == PAGES
    assert all(b.batch_get_v1(keys, idx))
    assert E.page_bytes(b.mem_pool_host, idx) == want


def test_mla_with_tp2_embedded_follower_never_sees_the_leaders_pages(model_dir: Path) -> None:
    """Embedded MLA with TP > 1: rank 0 is the 'shared SSD' leader, rank 1 a read-only follower
    whose own DRAM stays empty (the shared SSD is never written on 1.2.4). SGLang's prefetch
    takes the MIN of ``batch_exists`` over the TP group, so no L3 hit is ever served."""
    extra = {"dram_capacity_bytes": 64 * MIB, "ssd_enabled": False}
    leader = builtin_store(model_dir, extra, mla=True, tp_rank=0, tp_size=2)
    follower = builtin_store(model_dir, extra, mla=True, tp_rank=1, tp_size=2)
    assert not leader.is_mla_follower and follower.is_mla_follower
    keys, idx = pages()
    E.fill_random(leader.mem_pool_host, seed=5)
    assert all(leader.batch_set_v1(keys, idx))
    assert all(follower.batch_set_v1(keys, idx))  # "stored": the follower never writes
    assert leader.batch_exists(keys) == PAGES
    assert follower.batch_exists(keys) == 0
    assert min(leader.batch_exists(keys), follower.batch_exists(keys)) == 0


def test_mla_with_tp2_standalone_ranks_share_the_servers_pages(
    model_dir: Path, standalone_servers: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Standalone MLA with TP > 1: MLA keys carry no rank, every rank asks the one server."""
    server = standalone_servers.start("dram", standalone_server_env("dram",
                                                                    capacity_bytes=64 * MIB))
    for k, v in standalone_client_env(server.socket_path).items():
        monkeypatch.setenv(k, v)
    ranks = [builtin_store(model_dir, {"ssd_enabled": False}, mla=True, tp_rank=r, tp_size=2)
             for r in (0, 1)]
    assert not any(r.is_mla_follower for r in ranks)
    keys, idx = pages()
    E.fill_random(ranks[0].mem_pool_host, seed=6)
    want = E.page_bytes(ranks[0].mem_pool_host, idx)
    assert all(ranks[0].batch_set_v1(keys, idx))
    assert [r.batch_exists(keys) for r in ranks] == [PAGES, PAGES]
    E.wipe(ranks[1].mem_pool_host)
    assert all(ranks[1].batch_get_v1(keys, idx))
    assert E.page_bytes(ranks[1].mem_pool_host, idx) == want


def test_client_of_a_restarted_sidecar_does_not_recover(
    model_dir: Path, standalone_servers: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DRAM sidecar restarts under a running engine: the new server listens on the same
    socket, but the built-in store's client never registers its host pool again, so every later
    write and read fails until the engine itself restarts."""
    server = standalone_servers.start("dram", standalone_server_env("dram",
                                                                    capacity_bytes=64 * MIB))
    for k, v in standalone_client_env(server.socket_path).items():
        monkeypatch.setenv(k, v)
    store = builtin_store(model_dir, {"ssd_enabled": False})
    keys, idx = pages()
    assert all(store.batch_set_v1(keys[:8], idx[: 8 * E.PAGE]))
    standalone_servers.restart(server)
    for attempt in range(3):  # every try after the restart, not only the first
        assert not any(store.batch_set_v1(keys[8:], idx[8 * E.PAGE:])), attempt
        assert store.batch_exists(keys[8:]) == 0
    fresh = builtin_store(model_dir, {"ssd_enabled": False})  # an engine restart heals it
    assert all(fresh.batch_set_v1(keys[8:], idx[8 * E.PAGE:]))


def test_unknown_extra_config_key_only_warns(
    model_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A typo (``dram_capacity`` for ``dram_capacity_bytes``) starts the store anyway, with
    mori's default DRAM tier (4 GiB per rank) instead of the size asked for."""
    with caplog.at_level(logging.INFO, logger="sglang.srt.mem_cache.storage.umbp.umbp_store"):
        store = builtin_store(model_dir, {"dram_capacity": 64 * MIB, "ssd_enabled": False})
    assert store.client is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any("unknown extra_config key 'dram_capacity' is ignored" in m for m in messages)
    assert any("UMBPStore initialized: dram=4096 MB" in m for m in messages), messages


def test_clear_is_forwarded_to_the_embedded_client(model_dir: Path) -> None:
    """``/clear_hicache_storage_backend`` reaches ``UMBPStore.clear()``, which calls mori's
    ``clear()``: the pages go, and on the embedded client of mori 1.2.4 every later write
    fails (ours never forwards it)."""
    store = builtin_store(model_dir, {"dram_capacity_bytes": 64 * MIB, "ssd_enabled": False})
    keys, idx = pages()
    E.fill_random(store.mem_pool_host, seed=7)
    assert all(store.batch_set_v1(keys[:8], idx[: 8 * E.PAGE]))
    store.clear()
    assert store.batch_exists(keys[:8]) == 0
    assert not any(store.batch_set_v1(keys[8:], idx[8 * E.PAGE:]))
