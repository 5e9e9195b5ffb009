"""The UMBP HiCache backend inside real SGLang 0.5.23 objects over the REAL amd-mori 1.2.4 (no
controller threads here; those are in test_controller_sglang.py).

Real: SGLang's StorageBackendFactory, HiCacheStorageConfig, device and host KV pools
(MHATokenToKVPoolHost page_first / page_first_direct / page_head, MLATokenToKVPoolHost) on CPU,
their get_page_buffer_meta pointer math, the launcher's extra-config rendering, our config
parsing, key scheme and store, and the mori client the configuration opens (embedded DRAM; a
real ``umbp_standalone_server`` where two ranks share pages, as they do in production). Where a
test counts client calls or injects a client failure, the real client is wrapped in
:class:`support.faults.FaultyClient` (everything below the wrapper is mori).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hicache_umbp.contract.load import load_launch_config
from hicache_umbp.contract.mori_env import standalone_server_env
from hicache_umbp.contract.names import ADAPTER_CLASS, ADAPTER_MODULE, dynamic_extra_config
from hicache_umbp.contract.page_limits import MHA_PARTS
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.launch.command import store_extra_config
from hicache_umbp.sglang.adapter import UMBPHiCacheStorage
from hicache_umbp.store.keys import KeyScheme, parse_key
from support.faults import FaultyClient, real_client_opener, use_client_opener

from . import sglang_env as E
from .conftest import StandaloneServers

pytestmark = pytest.mark.sglang

MIB = 1 << 20
_MODEL: list[Path] = []


def storage_config(extra: dict[str, Any], *, mla: bool = False, **over: Any) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    values: dict[str, Any] = dict(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=E.MODEL_NAME, extra_config=dict(extra),
    )
    values.update(over)
    return HiCacheStorageConfig(**values)


def base_extra(**settings: Any) -> dict[str, Any]:
    """Two local ranks (tp 2 in one pod) unless a test says otherwise; embedded mori DRAM."""
    settings.setdefault("umbp_local_ranks", 2)
    if settings.get("umbp_mode", "embedded") == "embedded":
        settings.setdefault("umbp_dram_bytes", 16 * MIB)
    return dynamic_extra_config(umbp_namespace="ns/app", host_hugepage_bytes=0,
                                host_prefault=False, **settings)


def standalone_extra(servers: StandaloneServers, **settings: Any) -> dict[str, Any]:
    """A real umbp-dram sidecar (started once per test) and the extra-config pointing at it."""
    if not any(s.medium == "dram" for s in servers.started):
        servers.start("dram", standalone_server_env("dram", capacity_bytes=64 * MIB), "dram")
    return base_extra(umbp_mode="standalone", umbp_socket_dir=str(servers.workdir),
                      umbp_standalone_wait_s=30, **settings)


def publish(extra: dict[str, Any]) -> None:
    """Publish the server config as SGLang's scheduler does (our allocator hook reads it)."""
    import atexit
    import shutil
    import tempfile

    if not _MODEL:
        root = tempfile.mkdtemp(prefix="hicache-model-")
        atexit.register(shutil.rmtree, root, True)  # one per session, gone with it
        _MODEL.append(E.tiny_model_dir(Path(root)))
    E.publish_scheduler(_MODEL[0], extra)


def make_backend(
    kind: str = "mha", layout: str = "page_first", extra: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.bfloat16, page: int = E.PAGE, format_tag: str | None = None,
    spy: bool = False, hook_allocator: bool = False, **over: Any,
) -> tuple[UMBPHiCacheStorage, Any, Any]:
    """(backend, host pool, client): the backend the factory builds and registers with a real
    host pool; the client is the real mori client it opened, or with ``spy`` that client in a
    :class:`FaultyClient`. ``hook_allocator``: the host pool comes from our allocator under
    the published config (a standalone server accepts only its mori-shm memory), else from
    SGLang's default allocator."""
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    extra = extra or base_extra()
    allocator = "default"
    if hook_allocator:
        publish(extra)
        allocator = get_allocator_type()
    make_dev = E.mla_device_pool if kind == "mla" else E.mha_device_pool
    host = E.host_pool(make_dev(dtype=dtype, page=page), layout=layout, allocator_type=allocator)
    if format_tag is not None:  # SGLang's unified pool sets it as a class attribute
        host.storage_format_tag = format_tag
    cfg = storage_config(extra, mla=kind == "mla", **over)
    made: list[FaultyClient] = []
    if spy:
        with use_client_opener(real_client_opener(made)):
            backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
            backend.register_mem_pool_host(host)
    else:
        backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
        backend.register_mem_pool_host(host)
    assert isinstance(backend, UMBPHiCacheStorage)
    return backend, host, (made[0] if spy else backend.stores[0].client)


def present(client: Any, keys: list[str]) -> list[bool]:
    """Which UMBP keys the (real) client holds."""
    return [bool(x) for x in client.batch_exists(keys)]


def hashes(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.getrandbits(256):064x}" for _ in range(n)]


def test_factory_builds_backend_from_the_launcher_rendered_extra_config() -> None:
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    env = {"HICACHE_MODEL_PATH": "/models/tiny", "HICACHE_UMBP_DRAM_BYTES": str(32 * MIB),
           "HICACHE_UMBP_NAMESPACE": "team-a/llama", "HICACHE_HOST_HUGEPAGE_BYTES": "0"}
    extra = json.loads(json.dumps(store_extra_config(load_launch_config(env), {})))
    assert (extra["module_path"], extra["class_name"]) == (ADAPTER_MODULE, ADAPTER_CLASS)
    host = E.host_pool(E.mha_device_pool())
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), host)
    assert type(backend) is UMBPHiCacheStorage
    assert backend.stores == []  # mori's client opens when SGLang registers the host pool
    assert backend.interface_v1
    assert backend.config.umbp_namespace == "team-a/llama"
    assert backend.rank_config.dram_bytes == 32 * MIB


@pytest.mark.parametrize(
    ("kind", "layout"),
    [("mha", "page_first"), ("mha", "page_first_direct"), ("mla", "page_first"),
     ("mla", "page_first_direct")],
)
def test_set_wipe_get_restores_every_byte(kind: str, layout: str) -> None:
    backend, host, client = make_backend(kind, layout)
    assert "UMBPClient" in type(client).__name__  # mori's own client, opened by the config
    n = 9
    idx = host.alloc(n * E.PAGE)
    E.fill_random(host, seed=3)
    before = E.page_bytes(host, idx)
    keys = hashes(n)
    assert backend.batch_set_v1(keys, idx) == [True] * n
    E.wipe(host)
    assert E.page_bytes(host, idx) != before
    assert backend.batch_get_v1(keys, idx) == [True] * n
    assert E.page_bytes(host, idx) == before
    parts = 1 if kind == "mla" else 2
    umbp_keys = backend.stores[0].keys.batch_keys(keys)
    assert len(umbp_keys) == n * parts and all(present(client, umbp_keys))


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_partial_prefix_hits_and_consecutive_exists(kind: str) -> None:
    backend, host, _ = make_backend(kind)
    n = 6
    idx = host.alloc(n * E.PAGE)
    E.fill_random(host, seed=5)
    before = E.page_bytes(host, idx)
    keys = hashes(n, seed=1)
    stored = [0, 1, 2, 4]  # a hole at page 3
    sel = torch.cat([idx[i * E.PAGE : (i + 1) * E.PAGE] for i in stored])
    assert backend.batch_set_v1([keys[i] for i in stored], sel) == [True] * len(stored)
    assert backend.batch_exists(keys) == 3
    assert backend.batch_exists(keys[4:]) == 1
    assert backend.batch_exists(hashes(2, seed=99)) == 0
    E.wipe(host)
    got = backend.batch_get_v1(keys, idx)
    assert got == [True, True, True, False, True, False]
    after = E.page_bytes(host, idx)
    assert after[:3] == before[:3]
    assert after[4] == before[4]


def test_empty_batches_touch_nothing() -> None:
    backend, _host, client = make_backend(spy=True)
    calls = sum(client.calls.values())
    empty = torch.empty(0, dtype=torch.int64)
    assert backend.batch_set_v1([], empty) == []
    assert backend.batch_get_v1([], empty) == []
    assert backend.batch_exists([]) == 0
    assert sum(client.calls.values()) == calls


def test_legacy_interface_shares_keys_and_bytes_with_v1() -> None:
    backend, host, _ = make_backend("mha")
    n = 4
    idx = host.alloc(n * E.PAGE)
    E.fill_random(host, seed=7)
    before = E.page_bytes(host, idx)
    keys = hashes(n, seed=2)
    pages = [host.get_data_page(int(idx[i * E.PAGE]), flat=True) for i in range(n)]
    assert backend.batch_set(keys, pages) is True  # legacy write
    assert all(backend.exists(k) for k in keys)
    E.wipe(host)
    assert backend.batch_get_v1(keys, idx) == [True] * n  # zero-copy read of legacy pages
    assert E.page_bytes(host, idx) == before
    got = backend.batch_get(keys[:2], [host.get_dummy_flat_data_page() for _ in range(2)])
    assert [bytes(t.view(torch.uint8).numpy()) for t in got if t is not None] == before[:2]
    assert backend.get(hashes(1, seed=42)[0], host.get_dummy_flat_data_page()) is None


def test_split_heads_writes_the_head_groups_of_the_lcm_layout() -> None:
    extra = base_extra()
    backend, host, client = make_backend(
        "mha", "page_head", extra=extra, tp_rank=1, tp_size=2, tp_lcm_size=4,
        should_split_heads=True, extra_config=extra,
    )
    assert backend.split_factor == 2
    head_keys = {(s.keys.tp_size, s.keys.rank) for s in backend.stores}
    assert head_keys == {(4, 2), (4, 3)}
    n = 3
    idx = host.alloc(n * E.PAGE)
    E.fill_random(host, seed=11)
    before = E.page_bytes(host, idx)
    keys = hashes(n, seed=4)
    assert backend.batch_set_v1(keys, idx) == [True] * n
    for store in backend.stores:  # every head group's K and V is in mori
        written = store.keys.batch_keys(keys)
        assert all(present(client, written))
        assert {(f.tp_size, f.rank, f.part) for f in map(parse_key, written)} == {
            (4, store.keys.rank, p) for p in ("k", "v")}
    assert backend.page_format is not None
    unsplit = KeyScheme("ns/app", E.MODEL_NAME, 2, 1, MHA_PARTS, page_format=backend.page_format)
    assert not any(present(client, unsplit.batch_keys(keys)))  # nothing under tp2/r1
    E.wipe(host)
    assert backend.batch_exists(keys) == n
    assert backend.batch_get_v1(keys, idx) == [True] * n
    assert E.page_bytes(host, idx) == before


def test_keys_carry_model_and_tp_layout() -> None:
    mha, host, client = make_backend("mha", tp_rank=1, tp_size=2)
    idx = host.alloc(E.PAGE)
    page = hashes(1)
    assert mha.batch_set_v1(page, idx) == [True]
    (store,) = mha.stores
    written = store.keys.batch_keys(page)
    assert all(present(client, written))
    assert {(f.namespace, f.model_id, f.tp_size, f.rank, f.part)
            for f in map(parse_key, written)} == {
        ("ns/app", E.MODEL_NAME, 2, 1, "k"), ("ns/app", E.MODEL_NAME, 2, 1, "v")
    }


def test_mla_ranks_share_pages_through_the_standalone_sidecar(
    standalone_servers: StandaloneServers,
) -> None:
    """Two MLA ranks of one pod share nothing but what production shares: the umbp-dram
    sidecar (a real ``umbp_standalone_server``). Each has its own host pool (our allocator's
    mori-shm memory, registered with the server) and its own client; rank 0 writes, rank 1
    acknowledges without writing and reads rank 0's page byte-exact."""
    extra = standalone_extra(standalone_servers)
    writer, h0, c0 = make_backend("mla", extra=extra, hook_allocator=True, tp_rank=0, tp_size=2)
    reader, h1, c1 = make_backend("mla", extra=extra, hook_allocator=True, tp_rank=1, tp_size=2)
    assert not reader.is_writer and c0 is not c1
    i0, i1 = h0.alloc(E.PAGE), h1.alloc(E.PAGE)
    E.fill_pages(h0, i0, seed=1)
    keys = hashes(1, seed=8)
    umbp_keys = writer.stores[0].keys.batch_keys(keys)
    assert umbp_keys == reader.stores[0].keys.batch_keys(keys)  # MLA pages: one key per page
    assert reader.batch_set_v1(keys, i1) == [True]  # a follower acknowledges, writes nothing
    assert present(c1, umbp_keys) == [False]
    assert writer.batch_set_v1(keys, i0) == [True]
    assert present(c1, umbp_keys) == [True]
    assert reader.batch_get_v1(keys, i1) == [True]
    assert E.page_bytes(h1, i1) == E.page_bytes(h0, i0)
    writer.close()
    reader.close()


def test_config_errors_are_specific() -> None:
    with pytest.raises(ConfigError, match="umbp_dram_bytez"):
        make_backend(extra=base_extra(umbp_dram_bytez=1))
    sglang_keys = base_extra(prefetch_threshold=256, prefetch_timeout_base=1,
                             prefetch_timeout_per_ki_token=0.25,
                             hicache_storage_pass_prefix_keys=True, allocator="default")
    make_backend(extra=sglang_keys)
    with pytest.raises(ConfigError, match="layer_first"):
        make_backend(layout="layer_first")
    with pytest.raises(ConfigError, match="model"):
        make_backend(model_name=None)
    with pytest.raises(ConfigError, match="10Gi"):
        make_backend(extra=base_extra() | {"umbp_dram_bytes": "10Gi"})


def test_sglang_dp_rank_selects_the_per_rank_values(monkeypatch: pytest.MonkeyPatch) -> None:
    per_rank = [16 * MIB, 24 * MIB, 32 * MIB, 40 * MIB]
    extra = base_extra(umbp_local_ranks=4) | {"umbp_dram_bytes": per_rank}
    monkeypatch.setenv("SGLANG_DP_RANK", "1")
    backend, _, _ = make_backend(extra=extra, tp_rank=1, tp_size=2, extra_config=extra)
    assert backend.position.local_rank == 3
    assert backend.rank_config.dram_bytes == 40 * MIB
    monkeypatch.setenv("SGLANG_DP_RANK", "2")
    with pytest.raises(ConfigError, match="local rank 5"):
        make_backend(extra=extra, tp_rank=1, tp_size=2, extra_config=extra)
    monkeypatch.setenv("SGLANG_DP_RANK", "one")
    with pytest.raises(ConfigError, match="SGLANG_DP_RANK"):
        make_backend(extra=extra)
    monkeypatch.delenv("SGLANG_DP_RANK")
    backend, _, _ = make_backend(extra=extra, dp_rank=1, tp_rank=0, tp_size=2, extra_config=extra)
    assert backend.rank_config.dram_bytes == 32 * MIB


@pytest.mark.parametrize("fault", ["raise", "false", "none", "partial"])
@pytest.mark.parametrize("method", ["batch_put_from_ptr", "batch_get_into_ptr"])
def test_client_faults_become_false_pages_never_exceptions(method: str, fault: str) -> None:
    backend, host, client = make_backend("mha", spy=True)
    n = 6
    idx = host.alloc(n * E.PAGE)
    E.fill_random(host, seed=13)
    before = E.page_bytes(host, idx)
    keys = hashes(n, seed=6)
    if method == "batch_get_into_ptr":
        assert backend.batch_set_v1(keys, idx) == [True] * n
    client.inject(method, fault)
    call = backend.batch_set_v1 if method == "batch_put_from_ptr" else backend.batch_get_v1
    got = call(keys, idx)
    assert isinstance(got, list) and len(got) == n
    assert all(isinstance(r, bool) for r in got)
    assert not all(got)
    # The next batch goes through: nothing below the adapter is left broken.
    assert backend.batch_set_v1(keys, idx) == [True] * n
    assert backend.batch_get_v1(keys, idx) == [True] * n
    assert E.page_bytes(host, idx) == before


def test_exists_fault_reports_zero() -> None:
    backend, host, client = make_backend(spy=True)
    idx = host.alloc(2 * E.PAGE)
    keys = hashes(2)
    backend.batch_set_v1(keys, idx)
    for fault in ("raise", "none", "false"):
        client.inject("batch_exists_consecutive", fault)
        assert backend.batch_exists(keys) == 0
    assert backend.batch_exists(keys) == 2


def test_get_stats_returns_storage_metrics_with_umbp_counters() -> None:
    from sglang.srt.observability.metrics_collector import StorageMetrics

    backend, host, _ = make_backend(enable_storage_metrics=True)
    idx = host.alloc(4 * E.PAGE)
    keys = hashes(4)
    backend.batch_set_v1(keys, idx)
    backend.batch_get_v1(keys + hashes(1, seed=77), torch.cat([idx, host.alloc(E.PAGE)]))
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [4] and stats.prefetch_pgs == [4]
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    page = 2 * E.LAYERS * E.PAGE * E.MHA_HEADS * E.HEAD_DIM * 2
    assert stats.umbp["pages_set"] == 4 and stats.umbp["bytes_set"] == 4 * page
    assert stats.umbp["pages_get"] == 4 and stats.umbp["get_misses"] == 1
    again = backend.get_stats()
    assert again.backup_pgs == [] and again.umbp["pages_set"] == 4


def test_get_stats_on_every_scheduler_step_walks_the_store_counters_twice_a_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang calls get_stats on each scheduler step, also while a request spins waiting for its
    prefetch (docs/performance.md, "One L3 hit"): the samples drain each time, the store's
    counters (every tier's, under their locks) at most every STATS_REFRESH_S."""
    from hicache_umbp.sglang import adapter

    backend, host, _ = make_backend(enable_storage_metrics=True)
    walks: list[int] = []
    real = backend.umbp_stats

    def counted() -> dict[str, Any]:
        walks.append(1)
        return real()

    monkeypatch.setattr(backend, "umbp_stats", counted)
    idx = host.alloc(2 * E.PAGE)
    backend.batch_set_v1(hashes(2), idx)
    steps = [backend.get_stats() for _ in range(200)]
    assert len(walks) == 1 and steps[0].backup_pgs == [2] and steps[1].backup_pgs == []
    assert steps[-1].umbp["pages_set"] == 2
    monkeypatch.setattr(adapter, "STATS_REFRESH_S", 0.0)
    backend.batch_set_v1(hashes(1, seed=5), host.alloc(E.PAGE))
    assert backend.get_stats().umbp["pages_set"] == 3 and len(walks) == 2


def test_hybrid_sidecar_pools_are_refused_at_attach() -> None:
    from sglang.srt.mem_cache.hicache_storage import PoolName

    backend, host, _ = make_backend()
    backend.register_mem_host_pool_v2(host, PoolName.KV)
    assert backend.registered_pools[PoolName.KV] is host
    with pytest.raises(ConfigError, match="mamba"):
        backend.register_mem_host_pool_v2(host, PoolName.MAMBA)
