"""The KV page one rank registers with the L3 store, and the pageSize its tiers can hold.

Notation as in :mod:`.sizing`: N tokens per page (``spec.engine.pageSize``), K the model's KV
bytes per token (``spec.model.kvBytesPerToken``), T the attention-TP ranks, h the KV heads
(``spec.model.kvHeads``, T when unset).

Page geometry (K set, ``attention`` mha or mla): one rank's host pool registers pages of
``n`` parts of ``p`` bytes, which the L3 store stages part by part:

- mha: ``n = 2`` (K and V), ``p = N * K / 2 / min(T, h)`` (SGLang gives every rank
  ``max(1, h / T)`` heads, so with fewer heads than ranks a rank holds one whole head);
  Llama-3.1-70B bf16, K = 327,680, T = 4, N = 64: ``p = 2,621,440 B``;
- mla: ``n = 1``, ``p = N * K`` (the latent cache is the same on every rank);
  DeepSeek-R1 bf16, K = 70,272, N = 128: ``p = 8,994,816 B``.

Without K the planner assumes 8 MiB parts (``SSD_SLOT_BYTES_DEFAULT``) and says so in a
warning: the pod sizes its own staging from the real part, which can differ.

pageSize: every page the pod's store would refuse when SGLang registers its host pool
(``hicache_umbp.contract.page_limits.page_size_problems`` run on the rendered env: an embedded DRAM
or SSD tier per rank smaller than one page, a ring that cannot hold one page, a part one sidecar
batch cannot stage) is refused at ``spec.engine.pageSize`` with the largest pageSize the tiers hold
(``largest_page_size``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hicache_umbp.contract.page_limits import MHA_PARTS, MLA_PARTS

from ..api.spec import SGLangHiCacheSpec
from .errors import Problems


@dataclass(frozen=True)
class PageGeometry:
    """One KV page as one rank's host pool registers it: ``parts`` parts of ``part_bytes``."""

    page_size: int  # tokens (spec.engine.pageSize)
    token_part_bytes: int  # bytes of one token in one part, per rank
    parts: int  # 2 (K, V) for mha, 1 for mla
    formula: str  # how token_part_bytes follows from the spec (summary arithmetic)

    @property
    def part_bytes(self) -> int:
        return self.page_size * self.token_part_bytes

    @property
    def page_bytes(self) -> int:
        return self.parts * self.part_bytes

    def describe(self) -> str:
        return (
            f"{self.parts} part(s) x {self.part_bytes} B = {self.page_bytes} B per rank "
            f"(part = pageSize {self.page_size} x {self.formula})"
        )


def page_geometry(
    spec: SGLangHiCacheSpec, attention_tp: int, problems: Problems
) -> PageGeometry | None:
    """The page one rank registers (module docstring, "Page geometry"); ``None`` without
    ``model.kvBytesPerToken`` (or with attention auto, which the cross-field rules refuse)."""
    m = spec.model
    k = m.kv_bytes_per_token
    if k is None or m.attention == "auto":
        return None
    if m.attention == "mla":
        return PageGeometry(
            spec.engine.page_size, k, len(MLA_PARTS),
            f"kvBytesPerToken {k} B; mla: one latent part, the same on every rank",
        )
    heads = m.kv_heads
    if heads is not None and heads % attention_tp and attention_tp % heads:
        problems.add(
            "spec.model.kvHeads",
            f"{heads} KV heads cannot be sharded over {attention_tp} attention-TP ranks: "
            f"SGLang needs one of the two to divide the other",
        )
        return None
    shards = attention_tp if heads is None else min(attention_tp, heads)
    divisor = len(MHA_PARTS) * shards
    if k % divisor:
        problems.add(
            "spec.model.kvBytesPerToken",
            f"{k} B is not a multiple of {len(MHA_PARTS)} (K and V) x {shards} "
            f"(the KV heads' shards over the attention-TP ranks) = {divisor}: an mha cache is "
            f"layers x KV heads x head dim x dtype bytes x 2, check the arithmetic"
            + ("" if heads is not None else " (or set model.kvHeads if the model has fewer "
               f"KV heads than the {attention_tp} ranks)"),
        )
        return None
    why = (f"{shards} attention-TP ranks" if heads is None or heads >= attention_tp
           else f"{heads} KV heads (one per rank: fewer than the {attention_tp} attention-TP "
           f"ranks)")
    return PageGeometry(
        spec.engine.page_size, k // divisor, len(MHA_PARTS),
        f"kvBytesPerToken {k} B / {len(MHA_PARTS)} (K, V) / {why}",
    )


def largest_page_size(page: PageGeometry, fits: Callable[[int], bool]) -> int:
    """The largest pageSize up to ``page.page_size`` whose part (``pageSize x token part``)
    ``fits`` accepts, 0 if none; every limit grows with the part, so a bisection finds it."""
    lo, hi = 0, page.page_size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * page.token_part_bytes):
            lo = mid
        else:
            hi = mid - 1
    return lo


def page_size_refusal(page: PageGeometry, reason: str, raise_: str, largest: int) -> str:
    """The message of a pageSize the pod would refuse: the page, the backend's reason (which
    names the limit) and what to change."""
    lower = (
        f"lower spec.engine.pageSize to at most {largest}" if largest
        else "no pageSize fits (even 1 token)"
    )
    return (
        f"a page of {page.describe()}: the pod would refuse it when SGLang registers the host "
        f"pool: {reason}; {lower}" + (f", or raise {raise_}" if raise_ else "")
    )
