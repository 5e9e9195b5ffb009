"""The L3 media a rank uses, and the rule that it uses at least one (written once: the backend's
loader, the store's builder, the warm-cache table and the operator's planner all ask here)."""

from __future__ import annotations

from typing import Literal

Medium = Literal["dram", "ssd"]


def l3_media(mode: str, *, dram: bool, ssd: bool) -> tuple[Medium, ...]:
    """DRAM first: a DRAM tier when ``dram`` (standalone mode always runs the DRAM sidecar), an
    SSD tier when ``ssd``. Empty means no L3 tier: :func:`no_l3_tier` says what to set."""
    media: list[Medium] = []
    if mode == "standalone" or dram:
        media.append("dram")
    if ssd:
        media.append("ssd")
    return tuple(media)


def no_l3_tier(dram: str, ssd: str) -> str:
    """The one message for a configuration without an L3 tier, in the caller's names for the
    DRAM capacity and the SSD switch (env keys in the pod, CR fields in the operator)."""
    return f"no L3 tier: set {dram} > 0 or enable {ssd}"
