"""Which pages one rank of SGLang stores and reads, from SGLang's storage config.

SGLang hands the backend a ``HiCacheStorageConfig`` per rank; from it follow the rank's place in
the pod (the per-rank index of :mod:`.ranks`), whether it writes, and the key schemes of its
pages (:class:`~hicache_umbp.store.keys.KeyScheme`): MHA pages keyed per attention-TP rank and TP
size, MLA pages rank-free (``tp1/r0``: one writer, every rank reads), split heads
(``tp_lcm_size``) as the head groups a ``tp_lcm_size`` deployment's ranks would own. What SGLang
asks that these keys cannot serve is refused here, at construction, with the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contract.page_limits import MHA_PARTS, MLA_PARTS
from ..contract.settings import ConfigError, StoreConfig
from ..store.keys import KeyScheme, PageFormat
from .ranks import RankPosition, rank_position


def storage_rank_position(storage_config: Any, env: Mapping[str, str]) -> RankPosition:
    """SGLang's storage config already holds the attention-TP view under DP attention."""
    return rank_position(
        env,
        tp_rank=storage_config.tp_rank,
        tp_size=storage_config.tp_size,
        dp_rank=storage_config.dp_rank,
        pp_rank=storage_config.pp_rank,
        pp_size=storage_config.pp_size,
    )


@dataclass(frozen=True)
class StorageKeys:
    """One rank's keys: ``schemes`` gives one scheme per head group it writes (one without
    split heads)."""

    position: RankPosition
    is_mla: bool
    is_writer: bool
    split_factor: int
    model_id: str
    backend_tag: str

    @property
    def parts_per_page(self) -> int:
        return len(MLA_PARTS) if self.is_mla else len(MHA_PARTS) * self.split_factor

    @classmethod
    def from_sglang(cls, cfg: Any, config: StoreConfig, extra: Mapping[str, Any],
                    position: RankPosition, *, interface_v1: bool) -> StorageKeys:
        """``cfg`` is SGLang's ``HiCacheStorageConfig``; ``config`` the resolved store config."""
        _check_parallelism(cfg)
        is_mla = bool(cfg.is_mla_model)
        _check_mla_store(cfg, config, is_mla)
        return cls(
            position=position,
            is_mla=is_mla,
            is_writer=bool(cfg.is_storage_writer),
            split_factor=_split_factor(cfg, interface_v1),
            model_id=_model_id(cfg, config),
            backend_tag=_backend_tag(extra),
        )

    def schemes(self, namespace: str, fmt: PageFormat) -> list[KeyScheme]:
        def scheme(tp_size: int, rank: int, parts: tuple[str, ...]) -> KeyScheme:
            return KeyScheme(namespace, self.model_id, tp_size, rank, parts, page_format=fmt,
                             backend_tag=self.backend_tag)

        if self.is_mla:
            return [scheme(1, 0, MLA_PARTS)]
        pos = self.position
        if self.split_factor == 1:
            return [scheme(pos.tp_size, pos.tp_rank, MHA_PARTS)]
        lcm = pos.tp_size * self.split_factor
        base = pos.tp_rank * self.split_factor
        return [scheme(lcm, base + i, MHA_PARTS) for i in range(self.split_factor)]


def _check_mla_store(cfg: Any, config: StoreConfig, is_mla: bool) -> None:
    """An MLA model sharded over TP ranks needs one store every rank reads.

    SGLang backs an MLA page up from the storage writer (attention-TP rank 0) only and
    prefetches the minimum of the ranks' ``batch_exists``; per-rank embedded stores would
    never hit (docs/architecture.md, "MLA"). ``tp_size`` is the attention TP size here.
    """
    if is_mla and cfg.tp_size > 1 and config.umbp_mode == "embedded":
        raise ConfigError(
            [f"MLA model with attention tensor parallelism {cfg.tp_size}: SGLang backs MLA "
             "pages up from TP rank 0 only and prefetches the minimum of the ranks' hits, "
             "so an embedded (per-rank) UMBP store would never hit; use umbp_mode "
             "standalone (spec.l3.mode: standalone, and spec.model.attention: mla to have "
             "the operator check it at admission)"]
        )


def _check_parallelism(cfg: Any) -> None:
    if cfg.dcp_size > 1:
        raise ConfigError(
            [f"decode context parallel (dcp_size={cfg.dcp_size}) is not supported by the "
             "UMBP backend; SGLang 0.5.23 allows only file or mooncake storage with DCP"]
        )


def _split_factor(cfg: Any, interface_v1: bool) -> int:
    if not cfg.should_split_heads:
        return 1
    if not interface_v1:
        raise ConfigError(["split heads (tp_lcm_size) needs interface_v1: 1 in the extra-config"])
    lcm = cfg.tp_lcm_size or 0
    if lcm % cfg.tp_size:
        raise ConfigError([f"tp_lcm_size={lcm} is not a multiple of tp_size={cfg.tp_size}"])
    return int(lcm // cfg.tp_size)


def _model_id(cfg: Any, config: StoreConfig) -> str:
    base = config.umbp_model_id or (cfg.model_name or "")
    if not base:
        raise ConfigError(
            ["the model identity for keys is empty: SGLang passed no model name and "
             "umbp_model_id / HICACHE_UMBP_MODEL_ID is not set"]
        )
    # A rank of a pipeline or context-parallel group holds a different slice of each page.
    if cfg.pp_size > 1:
        base += f"@pp{cfg.pp_rank}of{cfg.pp_size}"
    if cfg.attn_cp_size > 1:
        base += f"@cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
    return str(base)


def _backend_tag(extra: Mapping[str, Any]) -> str:
    tag = extra.get("extra_backend_tag", "")
    if tag is None:
        return ""
    if not isinstance(tag, str):
        raise ConfigError([f"extra-config 'extra_backend_tag'={tag!r} must be a string"])
    return tag
