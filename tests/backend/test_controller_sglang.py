"""SGLang's scheduler stack (``HybridCacheController``) backs up and prefetches through the UMBP
backend over the REAL amd-mori 1.2.4, in every L3 mode the planner renders.

Real: the published server args (ServerArgs resolution for a tiny local model config, no
weights; ``--hicache-size`` 1 GB, page_first with the kernel I/O backend or page_first_direct
with direct), SGLang's plugin loading (our host-allocator hook: the host pool is our
allocator's memory, mori-shm-backed in standalone mode), the stack SGLang's assembler builds
(``_PlainKvStrategy``: ``build_kv_host_pool``, ``HostPoolGroup``, ``HybridCacheController`` with
v2 registration and layout leases) and its prefetch / prefetch-io / sync / backup threads,
``StorageBackendFactory`` loading our backend from the extra-config, MHA and MLA device and
host pools on CPU, SGLang's page-hash chain, and under the adapter mori's clients as the
configuration opens them: embedded DRAM, the embedded SSD node, DRAM in front of SSD, and real
``umbp_standalone_server`` processes (DRAM, SSD) started and killed by PID.

Played by the test: the scheduler's part between the controller's threads (what
``UnifiedRadixCache`` does: submit the prefetch, allocate host pages for the hit, hand the
operation to the io thread, drain the acks; :mod:`.sglang_stack`). ``prefetch_threshold`` is one
page (an SGLang extra-config key; its default of 256 tokens would make SGLang decline these
small test prefetches). The fault test wraps the real client in
:class:`support.faults.FaultyClient` to inject client failures; everything below the injected
fault is mori.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.names import dynamic_extra_config
from hicache_umbp.sglang.adapter import UMBPHiCacheStorage
from support.faults import FaultyClient, real_client_opener, use_client_opener

from . import sglang_env as E
from . import sglang_stack as S
from .conftest import StandaloneServers

pytestmark = pytest.mark.sglang

MIB = 1 << 20
SLOT = 64 * 1024  # the umbp-ssd sidecar's staging slot: >= the test pages' parts (1.5-2.3 KiB)
L3_MODES = ("embedded-dram", "embedded-ssd", "embedded-dram+ssd", "standalone-dram",
            "standalone-dram+ssd")


def l3_settings(mode: str, workdir: Path, servers: StandaloneServers) -> dict[str, Any]:
    """The backend's extra-config for one L3 mode; standalone modes start the sidecars (one
    ``umbp_standalone_server`` per medium, sockets ``<dir>/<medium>.sock``) as the pod runs
    them."""
    where, media = mode.split("-")
    ssd = "ssd" in media
    if where == "standalone":
        servers.start("dram", standalone_server_env("dram", capacity_bytes=64 * MIB), "dram")
        if ssd:
            servers.start("ssd", standalone_server_env(
                "ssd", capacity_bytes=256 * MIB, ssd_dir=str(workdir / "sidecar-ssd"),
                value_bytes=SLOT), "ssd")
        return dict(umbp_mode="standalone", umbp_socket_dir=str(servers.workdir),
                    umbp_standalone_wait_s=30, umbp_ssd_enabled=ssd, umbp_ssd_slot_bytes=SLOT)
    settings: dict[str, Any] = dict(umbp_dram_bytes=64 * MIB if "dram" in media else 0)
    if ssd:
        settings.update(umbp_ssd_enabled=True, umbp_ssd_dir=str(workdir / "ssd"),
                        umbp_ssd_bytes=256 * MIB, umbp_tier_queue_bytes=4 * MIB)
    return settings


def extra(**settings: Any) -> dict[str, Any]:
    return dynamic_extra_config(umbp_namespace="ns/ctrl", host_hugepage_bytes=0,
                                host_prefault=False, prefetch_threshold=E.PAGE, **settings)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return E.tiny_model_dir(tmp_path_factory.mktemp("model"))


def tokens(n_pages: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n_pages * E.PAGE)]


def backed_up_pages(stack: S.Stack, n_pages: int, seed: int) -> tuple[list[int], Any, list[bytes]]:
    """Pages of random bytes in the host pool, backed up through the controller."""
    toks = tokens(n_pages, seed)
    idx = stack.host.alloc(len(toks))
    E.fill_pages(stack.host, idx, seed)
    want = E.page_bytes(stack.host, idx)
    assert S.backup(stack.ctrl, idx, toks) == len(toks)
    stack.host.free(idx)
    E.wipe_pages(stack.host, idx)
    return toks, idx, want


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("mode", L3_MODES)
def test_backup_then_prefetch_round_trips_byte_exact(
    model: Path, tmp_path: Path, standalone_servers: StandaloneServers,
    stacks: list[S.Stack], mode: str, kind: str,
) -> None:
    cfg = extra(**l3_settings(mode, tmp_path, standalone_servers))
    stack = S.scheduler_stack(model, kind, cfg)
    stacks.append(stack)
    backend = stack.backend
    assert isinstance(backend, UMBPHiCacheStorage)
    assert stack.ctrl.page_get_func == stack.ctrl._page_get_zero_copy  # interface_v1 took effect
    from sglang.srt.mem_cache.hicache_storage import PoolName

    assert backend.registered_pools[PoolName.KV] is stack.host  # v2 registration of the group
    assert stack.host.size == (E.HICACHE_SIZE_GB * 10**9 // stack.host.size_per_token
                               // E.PAGE + 1) * E.PAGE  # sized by --hicache-size
    from hicache_umbp.sglang.host_allocator import UMBPHostTensorAllocator

    assert isinstance(stack.host.allocator, UMBPHostTensorAllocator)
    n = 20  # > 16: an SSD batch to the node or a sidecar is split by its staging slots
    toks, _, want = backed_up_pages(stack, n, seed=1)
    assert backend.flush()
    got = S.prefetch(stack.ctrl, "req-1", toks)
    assert (got.hit_tokens, got.tokens) == (len(toks), len(toks))
    assert got.operation.hash_value == S.page_hashes(toks, E.PAGE)
    assert E.page_bytes(stack.host, got.host_indices) == want
    stats = backend.umbp_stats()
    assert (stats["pages_set"], stats["pages_get"], stats["errors"]) == (n, n, {})
    if "ssd" in mode:  # the pages reached the SSD tier's files (write-back drained by flush)
        ssd_dir = tmp_path / ("sidecar-ssd" if mode.startswith("standalone") else "ssd")
        assert backend._plan is not None
        assert segment_bytes(ssd_dir) >= n * sum(backend._plan.sizes)
    assert S.threads_alive(stack.ctrl)


def segment_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("segment_*") if f.is_file())


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_page_first_direct_round_trips_byte_exact(
    model: Path, stacks: list[S.Stack], kind: str
) -> None:
    stack = S.scheduler_stack(model, kind, extra(umbp_dram_bytes=64 * MIB),
                              layout="page_first_direct")
    stacks.append(stack)
    assert stack.host.layout == "page_first_direct"
    assert stack.ctrl.io_backend == "direct"
    toks, _, want = backed_up_pages(stack, 5, seed=7)
    got = S.prefetch(stack.ctrl, "req-direct", toks)
    assert got.tokens == len(toks)
    assert E.page_bytes(stack.host, got.host_indices) == want


def test_prefetch_stops_at_the_first_missing_page(model: Path, stacks: list[S.Stack]) -> None:
    stack = S.scheduler_stack(model, "mha", extra(umbp_dram_bytes=64 * MIB))
    stacks.append(stack)
    toks = tokens(6, seed=3)
    hashes = S.page_hashes(toks, E.PAGE)
    idx = stack.host.alloc(3 * E.PAGE)
    E.fill_pages(stack.host, idx, seed=4)
    want = E.page_bytes(stack.host, idx)
    assert S.backup(stack.ctrl, idx, toks[: 3 * E.PAGE], hashes[:3]) == 3 * E.PAGE
    stack.host.free(idx)
    E.wipe_pages(stack.host, idx)
    got = S.prefetch(stack.ctrl, "req-2", toks)
    assert (got.hit_tokens, got.tokens) == (3 * E.PAGE, 3 * E.PAGE)
    assert got.operation.hash_value == hashes[:3]
    assert E.page_bytes(stack.host, got.host_indices) == want
    miss = S.prefetch(stack.ctrl, "req-3", tokens(2, seed=99))
    assert (miss.hit_tokens, miss.tokens, miss.host_indices) == (0, 0, None)


def test_a_new_engine_reads_what_the_last_one_backed_up_through_the_sidecar(
    model: Path, tmp_path: Path, standalone_servers: StandaloneServers, stacks: list[S.Stack],
) -> None:
    """Two schedulers one after the other (an engine restart) share only what production shares:
    the ``umbp_standalone_server`` sidecar. Each has its own controller, host pool and client."""
    cfg = extra(**l3_settings("standalone-dram", tmp_path, standalone_servers))
    first = S.scheduler_stack(model, "mla", cfg)
    toks, _, want = backed_up_pages(first, 4, seed=11)
    first.close()
    second = S.scheduler_stack(model, "mla", cfg)
    stacks.append(second)
    assert second.host.kv_buffer.data_ptr() != first.host.kv_buffer.data_ptr()
    got = S.prefetch(second.ctrl, "req-after-restart", toks)
    assert got.tokens == len(toks)
    assert E.page_bytes(second.host, got.host_indices) == want


@pytest.mark.parametrize("fault", ["raise", "false", "none", "partial"])
def test_faults_mid_batch_leave_threads_alive_and_data_intact(
    model: Path, stacks: list[S.Stack], fault: str
) -> None:
    made: list[FaultyClient] = []
    with use_client_opener(real_client_opener(made)):
        stack = S.scheduler_stack(model, "mha", extra(umbp_dram_bytes=64 * MIB))
    stacks.append(stack)
    (client,) = made
    ctrl, host = stack.ctrl, stack.host
    good, _, good_bytes = backed_up_pages(stack, 4, seed=5)

    # A failing backup: the controller records no completed tokens for the failed batch.
    bad = tokens(4, seed=7)
    bad_idx = host.alloc(len(bad))
    client.inject("batch_put_from_ptr", fault)
    assert S.backup(ctrl, bad_idx, bad) == 0
    # A failing prefetch of stored pages: zero (or a prefix for "partial") pages, no crash.
    client.inject("batch_get_into_ptr", fault)
    fetched = S.prefetch(ctrl, "req-fault", good)
    assert fetched.tokens < len(good)
    if fetched.host_indices is not None:
        host.free(fetched.host_indices)
    client.inject("batch_exists_consecutive", fault)
    missed = S.prefetch(ctrl, "req-exists-fault", good)
    assert missed.hit_tokens == 0 or fault == "partial"
    if missed.host_indices is not None:
        host.free(missed.host_indices)
    assert S.threads_alive(ctrl)

    # The same threads keep serving; the stored pages were not corrupted by the faults.
    host.free(bad_idx)
    after = S.prefetch(ctrl, "req-after", good)
    assert after.tokens == len(good)
    assert E.page_bytes(host, after.host_indices) == good_bytes
    assert S.threads_alive(ctrl)
    assert stack.backend.umbp_stats()["errors"], "the faults were counted"
    assert client.calls["batch_put_from_ptr"] >= 2
