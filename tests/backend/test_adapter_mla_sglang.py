"""MLA with TP > 1: the adapter refuses a per-rank (embedded) store it knows can never hit.

Real: SGLang 0.5.23's ``HiCacheStorageConfig`` for an MLA model as the controller builds it
(``is_mla_model``, ``tp_rank``/``tp_size``; ``is_storage_writer`` derived by SGLang), our adapter's
constructor. The end-to-end behaviour (two SGLang ranks, one standalone store, L3 hits on both)
is tests/pod/test_mla_pod.py.
"""

from __future__ import annotations

import pytest
from hicache_umbp.contract.names import dynamic_extra_config
from hicache_umbp.contract.settings import ConfigError
from hicache_umbp.sglang.adapter import UMBPHiCacheStorage
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

pytestmark = pytest.mark.sglang


def storage_config(mode: str, *, mla: bool, tp_size: int, tp_rank: int = 0) -> HiCacheStorageConfig:
    extra = dynamic_extra_config(umbp_mode=mode, umbp_dram_bytes=64 << 20,
                                 umbp_local_ranks=tp_size, umbp_model_id="m")
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, is_page_first_layout=True, model_name="m",
        enable_storage_metrics=False,
        extra_config=extra)


@pytest.mark.parametrize("rank", [0, 1])
def test_mla_with_tp2_refuses_an_embedded_store_on_every_rank(rank: int) -> None:
    cfg = storage_config("embedded", mla=True, tp_size=2, tp_rank=rank)
    assert cfg.is_storage_writer == (rank == 0)  # SGLang's rule the guard is about
    with pytest.raises(ConfigError, match="umbp_mode standalone"):
        UMBPHiCacheStorage(cfg, {}, env={})


def test_mla_with_one_rank_and_mha_with_tp2_keep_the_embedded_store() -> None:
    UMBPHiCacheStorage(storage_config("embedded", mla=True, tp_size=1), {}, env={}).close()
    UMBPHiCacheStorage(storage_config("embedded", mla=False, tp_size=2), {}, env={}).close()
