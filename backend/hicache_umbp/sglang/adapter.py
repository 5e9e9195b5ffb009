"""SGLang 0.5.23 HiCache L3 storage backend over the UMBP page store (the SGLang integration,
:mod:`hicache_umbp.sglang`, is the only part of the backend that imports sglang or torch).

Loading into stock SGLang (no file of SGLang is changed)::

    python -m hicache_umbp.serve --model-path <model> --enable-hierarchical-cache \\
        --hicache-mem-layout page_first --hicache-write-policy write_back \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "umbp",
            "module_path": "hicache_umbp.sglang_adapter", "class_name": "UMBPHiCacheStorage",
            "interface_v1": 1, "umbp_dram_bytes": 68719476736, "umbp_namespace": "ns/name"}'

``python -m hicache_umbp.serve`` is ``python -m sglang.launch_server`` plus the host-allocator
hook (:mod:`hicache_umbp.sglang.hook`); the adapter itself also loads under plain
``sglang.launch_server``, only with SGLang's default host allocator. ``interface_v1: 1`` selects
SGLang's zero-copy path (:meth:`batch_get_v1` / :meth:`batch_set_v1` on host-pool pointers);
without it SGLang uses the per-page legacy ``batch_get``/``batch_set`` with tensor copies, which
this class also implements correctly (same keys, same bytes) but slowly.

What SGLang does with the class: ``StorageBackendFactory`` imports ``module_path`` and calls
``UMBPHiCacheStorage(storage_config, {})``, then ``register_mem_pool_host(host_pool)``; the
cache controller's prefetch and backup threads call ``batch_exists``, ``batch_get_v1`` and
``batch_set_v1`` with at most 128 pages (64-hex SHA-256 chain hashes) per call.

Configuration: the extra-config JSON over ``HICACHE_*`` environment variables over defaults,
parsed by :func:`hicache_umbp.contract.settings.load_store_config` (SGLang's own keys are accepted,
any other unknown key is an error). The per-rank index is ``(dp_rank * pp_size + pp_rank) * tp_size
+ tp_rank`` with the attention TP group under DP attention, where ``dp_rank`` is ``SGLANG_DP_RANK``
when the launcher set it, else SGLang's attention DP rank.

Keys (:mod:`.storage_keys`, :class:`hicache_umbp.store.keys.KeyScheme`): MHA pages are keyed per
attention-TP rank and TP size (a rank holds a head slice; DP replicas of the same slice share keys),
MLA pages are replicated across ranks and keyed with rank 0 of tp 1 (one writer, every rank reads).
Pipeline and context parallel shards are folded into the model field. Split heads (``tp_lcm_size``):
each page is written as the ``tp_lcm_size // tp_size`` head groups a ``tp_lcm_size`` deployment's
ranks would own, so deployments of different TP sizes share pages.

Never-raise contract: the batch methods return one bool per page (an int for
:meth:`batch_exists`) whatever happens below them; ``None`` would kill SGLang's prefetch thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from ..build import build_store
from ..contract.load import load_store_config
from ..contract.settings import ConfigError, RankConfig, StoreConfig
from ..store.keys import PageFormat
from ..store.metrics import StoreMetrics
from ..store.ratelimit import RateLimitedLog
from ..store.store import PagePointers, UMBPStore
from .host_pool import PointerPlan, host_buffer_ranges, page_format_of
from .storage_keys import StorageKeys, storage_rank_position
from .storage_stats import StorageSamples, merged_store_stats

log = logging.getLogger(__name__)

SUPPORTED_LAYOUTS = ("page_first", "page_first_direct", "page_head")
#: Seconds between refreshes of the store's cumulative counters in :meth:`get_stats`.
STATS_REFRESH_S = 0.5


# ----------------------------------------------------------------------------- the backend


class UMBPHiCacheStorage(HiCacheStorage):  # type: ignore[misc]  # sglang is untyped
    """SGLang ``HiCacheStorage`` (v1 zero-copy + legacy) backed by :class:`UMBPStore`."""

    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        kwargs: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        extra = dict(storage_config.extra_config or {})
        self.storage_config = storage_config
        self.config: StoreConfig = load_store_config(extra, env)
        self.position = storage_rank_position(storage_config, env)
        self.rank_config: RankConfig = self.config.rank(self.position.local_rank)
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.keying = StorageKeys.from_sglang(storage_config, self.config, extra, self.position,
                                              interface_v1=self.interface_v1)
        self.is_mla, self.is_writer = self.keying.is_mla, self.keying.is_writer
        self.split_factor, self.model_id = self.keying.split_factor, self.keying.model_id
        self.backend_tag = self.keying.backend_tag
        # Opened by register_mem_pool_host: the page part size and format come from the pool.
        self.stores: list[UMBPStore] = []
        self.page_format: PageFormat | None = None
        self.value_bytes = 0
        self.parts_per_page = self.keying.parts_per_page
        self._warn = RateLimitedLog(log, self.config.umbp_log_interval_s)
        self._samples = StorageSamples(bool(storage_config.enable_storage_metrics))
        self.mem_pool_host: Any = None
        self._plan: PointerPlan | None = None
        self._store_metrics = StoreMetrics(self.position.local_rank)
        self._umbp: dict[str, Any] | None = None  # get_stats' last refresh, and when
        self._umbp_at = 0.0
        if not self.interface_v1:
            log.warning(
                "UMBPHiCacheStorage loaded without interface_v1: SGLang will use the per-page "
                "legacy path with tensor copies; add \"interface_v1\": 1 to the extra-config"
            )
        log.info(
            "UMBPHiCacheStorage: mode=%s local_rank=%d model=%r writer=%s (stores open when "
            "SGLang registers the host pool)",
            self.config.umbp_mode,
            self.position.local_rank,
            self.model_id,
            self.is_writer,
        )

    def _open_stores(self, fmt: PageFormat, value_bytes: int) -> list[UMBPStore]:
        """The head store (it owns the client) and one sibling per further split-head group:
        siblings share the client, its batch limit and the buffer registrations."""
        first, *others = self.keying.schemes(self.config.umbp_namespace, fmt)
        head = build_store(self.rank_config, keys=first, value_bytes=value_bytes)
        return [head, *(head.sibling(s) for s in others)]

    # ------------------------------------------------------------------ registration

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        layout = getattr(mem_pool_host, "layout", None)
        if layout not in SUPPORTED_LAYOUTS:
            raise ConfigError(
                [f"host pool layout {layout!r} is not supported by the UMBP backend; use "
                 "--hicache-mem-layout page_first or page_first_direct (UMBP stores whole "
                 "pages, layer_first scatters a page over every layer)"]
            )
        if layout == "page_head" and self.split_factor == 1 and not self.is_mla:
            log.info("page_head layout without tp_lcm_size: pages are stored as whole K/V parts")
        if self.stores:
            if mem_pool_host is self.mem_pool_host:
                return
            raise ConfigError(["a second host pool was registered with this UMBP backend; "
                               "it serves exactly one KV host pool"])
        super().register_mem_pool_host(mem_pool_host)
        self._plan = PointerPlan.derive(
            mem_pool_host, self._meta, self.parts_per_page, _index_tensor
        )
        if self._plan is None:
            log.info("UMBPHiCacheStorage: per-batch get_page_buffer_meta (no linear plan)")
        from . import hook

        hook.check_pool_allocator(mem_pool_host)
        # The real page part size sizes the SSD staging slots and the write-back ring, and the
        # pool's format is part of every key; sizes no tier can hold fail here, once.
        self.value_bytes = max(self._part_sizes(mem_pool_host))
        self.page_format = page_format_of(mem_pool_host, _published_kv_cache_dtype())
        self.stores = self._open_stores(self.page_format, self.value_bytes)
        for ptr, size in host_buffer_ranges(mem_pool_host):
            for store in self.stores:  # siblings share registrations: one client call
                if not store.register_buffer(ptr, size):
                    raise RuntimeError(
                        f"UMBP client refused to register the host pool buffer "
                        f"[{ptr:#x}, +{size}) for zero-copy I/O"
                    )
        log.info(
            "UMBPHiCacheStorage: page part %d bytes, format %s, keys %s",
            self.value_bytes,
            self.page_format,
            [s.keys.page_keys("<page>") for s in self.stores],
        )

    def _part_sizes(self, pool: Any) -> tuple[int, ...]:
        if self._plan is not None:
            return self._plan.sizes
        _, sizes = self._meta(_index_tensor(list(range(int(pool.page_size)))))
        if len(sizes) != self.parts_per_page:
            raise ConfigError([f"host pool gave {len(sizes)} page parts, expected "
                               f"{self.parts_per_page} (layout {pool.layout!r})"])
        return tuple(int(x) for x in sizes)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang registers its host pool group here; only the KV pool is supported.

        Sidecar pools (SWA, Mamba state, DSA indexer, draft KV) travel through
        ``batch_*_v2``, which this backend does not implement: refusing them at attach time
        beats silently never caching their pages.
        """
        if str(host_pool_name) == "kv":
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            return
        raise ConfigError(
            [f"host pool {str(host_pool_name)!r} (a hybrid-model sidecar pool) needs "
             "HiCache's batch_*_v2 interface, which the UMBP backend does not implement; "
             "it supports the KV pool of MHA and MLA models"]
        )

    # ------------------------------------------------------------------ zero-copy v1

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        n = len(keys)
        if n == 0:
            return []
        if not self.is_writer:
            # MLA replicas: one writer per page; SGLang skips backup here too (backup_skip).
            return [True] * n
        return self._transfer("set", keys, host_indices)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        if not keys:
            return []
        return self._transfer("get", keys, host_indices)

    def _transfer(self, op: str, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        """One v1 batch through the store; any failure becomes ``False`` entries."""
        n = len(keys)
        start = time.perf_counter()
        try:
            pages = self.page_pointers(host_indices, n)
            ok = self._run(op, keys, pages)
        except Exception as e:
            self._warn.warn(f"{op}_error", "batch_%s_v1 of %d pages failed: %r", op, n, e)
            return [False] * n
        self._samples.sample(op == "get", ok, pages, start)
        return ok

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        if not keys:
            return 0
        try:
            if not self.stores:
                raise RuntimeError("register_mem_pool_host was not called")
            return min(store.batch_exists(keys) for store in self.stores)
        except Exception as e:
            self._warn.warn("exists_error", "batch_exists of %d pages failed: %r", len(keys), e)
            return 0

    def page_pointers(self, host_indices: torch.Tensor, n_pages: int) -> list[PagePointers]:
        """(ptr, size) of every part of every page, page-major.

        The fast path applies the linear plan derived from (and verified against) SGLang's own
        ``get_page_buffer_meta`` at registration; without a plan it calls SGLang per batch.
        """
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("register_mem_pool_host was not called")
        plan = self._plan
        if plan is not None:
            return plan.pointers(host_indices, n_pages)
        ptrs, sizes = self._meta(host_indices)
        per = self.parts_per_page
        if len(ptrs) != n_pages * per or len(sizes) != len(ptrs):
            raise ValueError(
                f"host pool gave {len(ptrs)} pointers / {len(sizes)} sizes for {n_pages} pages "
                f"of {per} parts (layout {pool.layout!r})"
            )
        pairs = list(zip(ptrs, sizes, strict=True))
        if per == 1:
            return [(p,) for p in pairs]
        return [tuple(pairs[i : i + per]) for i in range(0, len(pairs), per)]

    def _meta(self, host_indices: torch.Tensor) -> tuple[list[int], list[int]]:
        pool = self.mem_pool_host
        if self.split_factor > 1:
            ptrs, sizes = pool.get_split_heads_page_buffer_meta(host_indices, self.split_factor)
        else:
            ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        return list(ptrs), list(sizes)

    def _run(self, op: str, keys: Sequence[str], pages: Sequence[PagePointers]) -> list[bool]:
        if not self.stores:
            raise RuntimeError("register_mem_pool_host was not called")
        if len(self.stores) == 1:
            store = self.stores[0]
            return store.batch_set(keys, pages) if op == "set" else store.batch_get(keys, pages)
        ok = [True] * len(keys)
        offset = 0
        for store in self.stores:
            width = store.keys.parts_per_page
            sub = [page[offset : offset + width] for page in pages]
            got = store.batch_set(keys, sub) if op == "set" else store.batch_get(keys, sub)
            ok = [a and b for a, b in zip(ok, got, strict=True)]
            offset += width
        return ok

    # ------------------------------------------------------------------ legacy interface

    def _tensor_parts(self, tensor: torch.Tensor) -> PagePointers:
        """A flat page tensor split into the parts of a v1 page: same keys, same bytes.

        SGLang's flat MHA page is the K half then the V half (``get_data_page(flat=True)``),
        an MLA page is one part; split-head pages have no flat form (v1 only, checked in init).
        """
        if not tensor.is_contiguous():
            raise ValueError("legacy page tensors must be contiguous")
        total = tensor.numel() * tensor.element_size()
        per = self.parts_per_page
        if total % per:
            raise ValueError(f"a page of {total} bytes does not split into {per} equal parts")
        step = total // per
        base = tensor.data_ptr()
        return tuple((base + i * step, step) for i in range(per))

    def get(
        self,
        key: str,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> torch.Tensor | None:
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0] if isinstance(got, list) else None

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None]:
        n = len(keys)
        if n == 0:
            return []
        try:
            if target_locations is None:
                targets = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
            else:
                targets = list(target_locations)
            pages = [self._tensor_parts(t) for t in targets]
            ok = self._run("get", keys, pages)
        except Exception as e:
            self._warn.warn("legacy_get_error", "batch_get of %d pages failed: %r", n, e)
            return [None] * n
        return [t if hit else None for t, hit in zip(targets, ok, strict=True)]

    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        if not keys:
            return True
        if not self.is_writer:
            return True
        try:
            if values is None or len(values) != len(keys):
                raise ValueError("batch_set needs one page tensor per key")
            contiguous = [v.contiguous() for v in values]
            pages = [self._tensor_parts(v) for v in contiguous]
            return all(self._run("set", keys, pages))
        except Exception as e:
            self._warn.warn("legacy_set_error", "batch_set of %d pages failed: %r", len(keys), e)
            return False

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------------------ lifecycle and stats

    def clear(self) -> None:
        # mori's embedded clear() makes every later put fail (1.2.4), so a "flush cache" from
        # SGLang must not reach it: the L3 tier keeps its pages (they are content-addressed).
        log.warning("UMBPHiCacheStorage.clear(): not forwarded (mori 1.2.4 embedded clear() "
                    "makes every later put fail); the UMBP tier keeps its pages")

    def flush(self) -> bool:
        return all(store.flush() for store in self.stores[:1])

    def close(self) -> None:
        for store in reversed(self.stores):  # siblings first; the head owns the client
            store.close()

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` (per-batch samples since the last call) plus ``umbp``:
        the store's cumulative counters (hits, misses, bytes, failures) as a dict.

        SGLang 0.5.23 calls this on every scheduler step (``check_hicache_events``), also while
        a request spins waiting for its prefetch: the counters and their Prometheus families are
        refreshed at most every ``STATS_REFRESH_S`` (scrapes are seconds apart), so a step
        costs the samples' drain, not a walk of every tier's counters under their locks.
        """
        metrics = self._samples.drain()
        now = time.monotonic()
        if self._umbp is None or now - self._umbp_at >= STATS_REFRESH_S:
            self._umbp, self._umbp_at = self.umbp_stats(), now
            self._store_metrics.update(self._umbp)
        metrics.umbp = self._umbp
        return metrics

    def umbp_stats(self) -> dict[str, Any]:
        return merged_store_stats(self.stores)


def _index_tensor(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _published_kv_cache_dtype() -> str | None:
    """SGLang's ``--kv-cache-dtype`` in a scheduler process (None where no server args were
    published, e.g. a bare pool in a test)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return str(get_server_args().kv_cache_dtype)
    except Exception:
        return None
