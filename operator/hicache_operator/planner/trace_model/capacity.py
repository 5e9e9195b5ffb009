"""What a planned pod gives the trace model: tokens per tier, bytes per token, policies.

Nothing here sizes anything: the tiers' tokens are the planner's own
(:func:`..router_sizing.pod_tokens` for the host pool and L3, :func:`..kv_pools.device_tokens`
for the GPUs' KV pools), the router's tree the planner's ``--max-tree-size``.

Bytes a hit reads, per token (``b`` one token in one rank's pool, ``R`` ranks per pod):

* host pool -> device: every rank loads its own ``b`` over its own PCIe link, in parallel, so
  the tier's rate is ``bandwidth / b``;
UMBP DRAM holds fewer tokens than its bytes say when page parts are small: mori allocates each
key in whole 64 KiB pages (:func:`mori_dram_tokens`); with DeepSeek-R1's 4.5 MB parts that is
0.5%, with a tiny model's 4 KiB parts 16x.

* L3 -> host pool: every rank prefetches its own copy into its host pool (mha: its heads; mla:
  the whole latent, which all ranks read from the pod's one store), so the store serves
  ``R * b`` per token: ``bandwidth / (R * b)``, then the host -> device load as above.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...api.spec import SGLangHiCacheSpec
from ..engine import attention_tp_size
from ..kv_pools import compare_kv_pools, device_tokens
from ..placement import GpuModel
from ..router import RouterPlan
from ..router_sizing import pod_tokens
from ..sizing import PodSizing
from .routing import ROUTER_POLICIES, RouterConfig, RouterPolicy
from .tiers import SGLANG_PREFETCH_THRESHOLD, Policy, TierTokens


@dataclass(frozen=True)
class PodModel:
    """One planned pod as the trace model sees it."""

    capacity: TierTokens
    policy: Policy
    token_bytes: int  # b: one token in one rank's pool
    ranks: int
    notes: tuple[str, ...]

    @property
    def l3_read_bytes_per_token(self) -> int:
        return self.ranks * self.token_bytes


class NoGeometry(ValueError):
    """The CR does not say enough about the model to count tokens."""


def pod_model(spec: SGLangHiCacheSpec, sizing: PodSizing, gpu: GpuModel, *,
              prefetch_threshold: int = SGLANG_PREFETCH_THRESHOLD) -> PodModel:
    mla = spec.model.attention == "mla"
    tp = attention_tp_size(spec)
    tokens = pod_tokens(sizing, tp, mla)
    if tokens is None or sizing.page is None:
        raise NoGeometry("spec.model.kvBytesPerToken and spec.model.attention (mha or mla) are "
                         "needed to count the tiers in tokens")
    b = sizing.page.page_bytes // sizing.page.page_size
    groups = max(sizing.ranks // max(tp, 1), 1)
    notes: list[str] = []
    pools = compare_kv_pools(spec, gpu)
    if pools is None:
        device = tokens.host
        notes.append("device KV pool unknown (spec.model.weightsSize or hostPoolPerRank unset): "
                     "taken as large as the host pool")
    else:
        device = device_tokens(pools, b, groups)
    write = spec.hi_cache.write_policy
    # Our SSD tier holds one slot per page part: K and V of every attention-TP rank (mha), the
    # writer rank's latent (mla).
    parts = sizing.page.parts * (1 if mla else max(tp, 1))
    policy = Policy(page_size=spec.engine.page_size, write_policy=write,
                    prefetch_threshold=max(prefetch_threshold, spec.engine.page_size),
                    promote_on_hit=spec.l3.tiering.promote_on_hit, page_parts=parts)
    capacity = TierTokens(device=device, host=tokens.host,
                          l3_dram=mori_dram_tokens(sizing, tp, mla, tokens.l3_dram),
                          l3_ssd=tokens.l3_ssd)
    return PodModel(capacity, policy, b, sizing.ranks, tuple(notes))


#: mori 1.2.4's DRAM tier allocates each key in whole pages of this size (``dram_page_size``,
#: 64 KiB by default): a 4 KiB page part takes 64 KiB (measured: a 4 MiB embedded tier holds
#: 44-57 keys of 4 KiB, as many as of 64 KiB).
MORI_DRAM_PAGE_BYTES = 64 * 1024


def mori_dram_tokens(sizing: PodSizing, tp: int, mla: bool, planned: int) -> int:
    """The tokens UMBP DRAM really holds: ``D / (keys per page x each key's whole 64 KiB
    pages) x pageSize`` (every attention-TP rank stores its own parts under mha, one copy under
    mla); ``planned`` (the planner's bytes / bytes per token) when the page is unknown."""
    page = sizing.page
    if page is None:
        return planned
    unit = -(-page.part_bytes // MORI_DRAM_PAGE_BYTES) * MORI_DRAM_PAGE_BYTES
    keys = page.parts * (1 if mla else max(tp, 1))
    return sizing.dram_total // (keys * unit) * page.page_size


def router_config(spec: SGLangHiCacheSpec, router: RouterPlan | None, pods: int,
                  policy: RouterPolicy | None = None) -> RouterConfig:
    """The CR's router (thresholds, tree) or, without one, ``policy`` with smg's defaults."""
    r = spec.router
    planned = next((p for p in ROUTER_POLICIES if p == r.policy), None) if router else None
    # No router: the Service spreads requests, as round-robin does on average.
    chosen: RouterPolicy = policy or planned or "round_robin"
    # smg evicts each pod's part of its tree to --max-tree-size (evict_tenant_by_size), so
    # every pod may keep that many characters of prompts.
    tree = router.sizing.tree_chars // r.tree.chars_per_token if router is not None else None
    return RouterConfig(policy=chosen, cache_threshold=r.cache_threshold,
                        balance_abs_threshold=r.balance_abs_threshold,
                        balance_rel_threshold=r.balance_rel_threshold, tree_tokens=tree)
