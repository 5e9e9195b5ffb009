"""Our SSD tier (``umbp_ssd_engine=hicache``) under SGLang's own controller, over real mori.

Real: SGLang 0.5.23's scheduler stack (``HybridCacheController`` with its backup and prefetch
threads, the host pool from our allocator hook), our adapter and store, the real mori DRAM tier
(embedded, or a real ``umbp_standalone_server`` DRAM sidecar) in front of our SSD tier on the
machine's disk (O_DIRECT on ext4). Played by the test: the scheduler's part between the
controller's threads (:mod:`.sglang_stack`), as in test_controller_sglang.py; an "engine
restart" is a second stack (its own controller, host pool and clients) on the same directories.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.disk import DiskStore

from . import sglang_env as E
from . import sglang_stack as S
from .conftest import StandaloneServers
from .test_controller_sglang import backed_up_pages, extra

pytestmark = pytest.mark.sglang

MIB = 1 << 20


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


def ours(tmp_path: Path, dram: int, drives: int = 2) -> dict[str, Any]:
    dirs = [tmp_path / f"nvme{i}" for i in range(drives)]
    for d in dirs:
        d.mkdir(exist_ok=True)
    return dict(umbp_dram_bytes=dram, umbp_ssd_enabled=True, umbp_ssd_engine="hicache",
                umbp_ssd_dir=",".join(map(str, dirs)), umbp_ssd_bytes=128 * MIB,
                umbp_tier_queue_bytes=4 * MIB)


def aligned_device_pool(kind: str) -> Any:
    """Page parts that are whole 4 KiB pages, as real models' are (MHA: 4 layers x 8 KV heads
    x 128 x bf16 x 64 tokens = 512 KiB; MLA: 2 layers x 576 x bf16 x 64 = 144 KiB); the tiny
    model's own parts (1.5-2.3 KiB) are not, and would go through the page cache."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    common = dict(size=16 * E.PAGE, page_size=E.PAGE, dtype=torch.bfloat16, device="cpu",
                  enable_memory_saver=False)
    if kind == "mla":
        return MLATokenToKVPool(kv_lora_rank=512, qk_rope_head_dim=64, layer_num=2, **common)
    return MHATokenToKVPool(head_num=8, head_dim=128, layer_num=4, **common)


def disk_of(stack: S.Stack) -> DiskStore:
    client = stack.backend.stores[0].client
    disk = getattr(client, "ssd", client)
    assert isinstance(disk, DiskStore)
    return disk


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("dram", [0, 1 * MIB], ids=["ssd-only", "small-dram+ssd"])
def test_a_restarted_engine_prefetches_every_page_from_our_ssd_tier(
    model: Path, tmp_path: Path, stacks: list[S.Stack], kind: str, dram: int
) -> None:
    """Back up 40 pages through the controller, close the engine; a new engine on the same
    drives prefetches all of them byte-exact from the SSD tier, every transfer O_DIRECT
    straight into the host pool's pages (no page-cache copy)."""
    cfg = extra(**ours(tmp_path, dram))
    first = S.scheduler_stack(model, kind, cfg, device_pool=aligned_device_pool(kind))
    toks, _, want = backed_up_pages(first, 40, seed=21)
    assert first.backend.flush()
    assert disk_of(first).disk_stats().pages >= 40
    first.close()
    second = S.scheduler_stack(model, kind, cfg, device_pool=aligned_device_pool(kind))
    stacks.append(second)
    got = S.prefetch(second.ctrl, "after-restart", toks)
    assert (got.hit_tokens, got.tokens) == (len(toks), len(toks))
    assert E.page_bytes(second.host, got.host_indices) == want
    stats = second.backend.umbp_stats()
    assert stats["tier_pages"].get("ssd") == 40, stats["tier_pages"]
    assert stats["disk"]["hits"] == stats["disk"]["direct_ios"] > 0
    assert stats["disk"]["buffered_ios"] == 0


def test_ranks_share_one_copy_of_an_mla_page(model: Path, tmp_path: Path,
                                             stacks: list[S.Stack]) -> None:
    """Two schedulers open the same drives at once (two ranks of one pod): an MLA page backed up
    by one is found by the other, and stored once."""
    cfg = extra(**ours(tmp_path, 0, drives=1))
    writer = S.scheduler_stack(model, "mla", cfg)
    stacks.append(writer)
    reader = S.scheduler_stack(model, "mla", cfg)
    stacks.append(reader)
    toks, _, want = backed_up_pages(writer, 8, seed=5)
    got = S.prefetch(reader.ctrl, "other-rank", toks)
    assert got.tokens == len(toks)
    assert E.page_bytes(reader.host, got.host_indices) == want
    assert disk_of(reader).drives[0].index.counts() == (8, 0)


def test_our_ssd_tier_behind_the_dram_sidecar(
    model: Path, tmp_path: Path, standalone_servers: StandaloneServers, stacks: list[S.Stack]
) -> None:
    """Standalone: the real DRAM sidecar (2 MiB: most pages evicted) in front of our SSD tier in
    the engine; the sidecar restarts (a pod restart) and every page still comes back, from our
    SSD tier."""
    dram = standalone_servers.start(
        "dram", standalone_server_env("dram", capacity_bytes=2 * MIB), "dram")
    settings = ours(tmp_path, 0)
    settings.pop("umbp_dram_bytes")
    cfg = extra(umbp_mode="standalone", umbp_socket_dir=str(standalone_servers.workdir),
                umbp_standalone_wait_s=30, **settings)
    first = S.scheduler_stack(model, "mha", cfg)
    toks, _, want = backed_up_pages(first, 24, seed=9)
    assert first.backend.flush()
    first.close()
    standalone_servers.restart(dram)
    second = S.scheduler_stack(model, "mha", cfg)
    stacks.append(second)
    got = S.prefetch(second.ctrl, "after-pod-restart", toks)
    assert got.tokens == len(toks)
    assert E.page_bytes(second.host, got.host_indices) == want
    assert second.backend.umbp_stats()["tier_pages"]["ssd"] == 24
