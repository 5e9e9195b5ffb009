"""The launcher's command line against real SGLang 0.5.23 (engine env, ``make test-sglang``).

Real: SGLang's own server-args parser (``prepare_server_args``), its ``StorageBackendFactory``
importing ``hicache_umbp.sglang_adapter`` from the rendered extra-config, and the adapter's
config resolution, with the real amd-mori 1.2.4 importable in the same Python (no client opens
before SGLang registers a host pool, which these tests do not build). Faked: the node (a fake
sysfs tree).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hicache_umbp.contract import names
from hicache_umbp.launch.noderoot import NodeRoot
from hicache_umbp.launch.run import plan_launch
from hicache_umbp.sglang.adapter import UMBPHiCacheStorage
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.server_args import prepare_server_args

from .conftest import io_uring_ok, launch_env
from .fakenode import GIB, FakeNode

pytestmark = pytest.mark.sglang


def _server_args(node: FakeNode, **env: Any) -> tuple[Any, list[str]]:
    plan = plan_launch(launch_env(**env), NodeRoot(node.root), io_uring_probe=io_uring_ok)
    argv = list(plan.command.argv)
    assert argv[1:3] == ["-m", "hicache_umbp.serve"]
    return prepare_server_args(argv[3:]), argv


def test_the_public_load_path_is_the_adapter() -> None:
    """The module path and class the launcher renders (:mod:`hicache_umbp.contract.names`)
    resolve to the adapter, as SGLang's factory resolves them: importlib, then getattr."""
    import importlib

    module = importlib.import_module(names.ADAPTER_MODULE)
    assert getattr(module, names.ADAPTER_CLASS) is UMBPHiCacheStorage


def test_command_parses_with_sglangs_own_parser(mi355x: FakeNode) -> None:
    args, _ = _server_args(mi355x, extra_args=json.dumps(["--mem-fraction-static", "0.85"]))
    assert args.model_path == "deepseek-ai/DeepSeek-R1"
    assert (args.host, args.port, args.tp_size, args.page_size) == ("0.0.0.0", 30000, 8, 64)
    assert args.enable_hierarchical_cache is True
    assert args.hicache_size == 214 and args.hicache_ratio is None
    assert args.hicache_mem_layout == "page_first"
    assert args.hicache_write_policy == "write_back"
    assert args.hicache_io_backend == "kernel"
    assert args.hicache_storage_backend == "dynamic"
    assert args.mem_fraction_static == 0.85
    extra = json.loads(args.hicache_storage_backend_extra_config)
    assert extra["interface_v1"] == 1
    assert extra["host_numa"] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_dp_attention_and_ratio_parse(mi355x: FakeNode) -> None:
    args, _ = _server_args(mi355x, dp_size=8, enable_dp_attention=True, host_pool_bytes=0,
                           host_pool_ratio=1.5)
    assert args.attn_dp_size == 8 and args.dp_size == 1
    assert args.hicache_ratio == 1.5 and args.hicache_size == 0


def test_extra_config_builds_our_backend_through_the_factory(mi355x: FakeNode) -> None:
    args, _ = _server_args(mi355x)
    extra = json.loads(args.hicache_storage_backend_extra_config)
    storage_config = HiCacheStorageConfig(
        tp_rank=5, tp_size=8, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        # MHA: an MLA model with TP 8 refuses an embedded store (test_adapter_mla_sglang.py)
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=args.model_path, extra_config=extra)
    backend = StorageBackendFactory.create_backend("dynamic", storage_config, None)
    assert type(backend).__name__ == "UMBPHiCacheStorage"
    assert backend.interface_v1 is True
    # mori's client (64 GiB of DRAM for this rank) opens when SGLang registers the host pool.
    assert backend.stores == [] and backend.mem_pool_host is None
    rank = backend.rank_config
    assert rank.local_rank == 5
    assert (rank.host_numa, rank.dram_numa, rank.dram_bytes) == (1, 1, 64 * GIB)
    assert backend.config.umbp_namespace == "team-a/r1"


def test_builtin_backend_command_parses_and_selects_sglangs_mori_backend(
    mi355x: FakeNode,
) -> None:
    """l3_backend sglang-mori: SGLang's parser takes the command and maps the backend to its
    own class (its host allocator kind follows from the same name:
    tests/backend/test_builtin_backend_sglang.py)."""
    args, _ = _server_args(mi355x, l3_backend="sglang-mori")
    assert args.hicache_storage_backend == "mori"
    # SGLang's prefetch settings ride along (the contract's defaults are SGLang's own).
    assert json.loads(args.hicache_storage_backend_extra_config) == {
        "ssd_enabled": False, "dram_capacity_bytes": 64 * GIB, "prefetch_threshold": 256,
        "prefetch_timeout_base": 1.0, "prefetch_timeout_per_ki_token": 0.25}
    assert StorageBackendFactory._registry["mori"]["class_name"] == "UMBPStore"
