"""The page key scheme: one UMBP key per (deployment, model, TP layout, rank, KV part, page).

A key is ``hicache/v1/<namespace>/<model>/tp<tp_size>/r<rank>/<part>/<page_hash>``, where every
field before the page hash is percent-encoded (``urllib.parse.quote`` with no safe characters), so
it never contains ``/``. The key therefore splits back into exactly one tuple of fields: the first
seven ``/``-separated segments are the escaped fields, the rest is the page hash (which may hold
anything). Two keys are equal only if namespace, model, TP size, rank, part and hash all are, so
two deployments (namespace ``<k8s-namespace>/<cr-name>``) sharing one store never collide, nor do
two models, two TP layouts of one model (a rank's KV slice differs), two ranks, or the K and V
halves of a page. ``v1`` versions the scheme itself.

The per-part prefixes are built once; a page key is one string concatenation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

SCHEME = "hicache/v1"
MHA_PARTS: tuple[str, ...] = ("k", "v")
MLA_PARTS: tuple[str, ...] = ("kv",)


def _escape(field_value: str) -> str:
    return quote(field_value, safe="")


@dataclass(frozen=True)
class KeyScheme:
    """Namespaced page keys for one rank's slice of one model's KV cache.

    ``parts`` names the host buffers a page is made of: ``("k", "v")`` for MHA page-first
    layouts (two (ptr, size) pairs per page), ``("kv",)`` for MLA (one).
    """

    namespace: str
    model_id: str
    tp_size: int
    rank: int
    parts: tuple[str, ...] = MHA_PARTS
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.tp_size, int) or self.tp_size < 1:
            problems.append(f"tp_size={self.tp_size!r} must be an integer >= 1")
        if not isinstance(self.rank, int) or self.rank < 0:
            problems.append(f"rank={self.rank!r} must be an integer >= 0")
        if not self.parts:
            problems.append("parts must name at least one KV part, e.g. ('k', 'v') or ('kv',)")
        elif len(set(self.parts)) != len(self.parts) or any(not p for p in self.parts):
            problems.append(f"parts={self.parts!r} must be distinct non-empty names")
        if problems:
            raise ValueError("invalid KeyScheme: " + "; ".join(problems))
        base = "/".join(
            (
                SCHEME,
                _escape(self.namespace),
                _escape(self.model_id),
                f"tp{self.tp_size}",
                f"r{self.rank}",
            )
        )
        object.__setattr__(
            self, "_prefixes", tuple(f"{base}/{_escape(p)}/" for p in self.parts)
        )

    @property
    def parts_per_page(self) -> int:
        return len(self.parts)

    def page_keys(self, page_hash: str) -> list[str]:
        """One key per part of the page, in ``parts`` order."""
        return [prefix + page_hash for prefix in self._prefixes]

    def batch_keys(self, hashes: Sequence[str]) -> list[str]:
        """Keys of every part of every page, page-major: ``[h0/k, h0/v, h1/k, h1/v, ...]``."""
        prefixes = self._prefixes
        if len(prefixes) == 1:
            only = prefixes[0]
            return [only + h for h in hashes]
        return [prefix + h for h in hashes for prefix in prefixes]


def parse_key(key: str) -> tuple[str, str, int, int, str, str]:
    """Split a key back into (namespace, model_id, tp_size, rank, part, page_hash).

    The inverse of :meth:`KeyScheme.page_keys`; used by tests and debugging tools.
    """
    segments = key.split("/", 7)
    if len(segments) != 8 or "/".join(segments[:2]) != SCHEME:
        raise ValueError(f"{key!r} is not a {SCHEME} page key")
    _, _, ns, model, tp, rank, part, page_hash = segments
    if not (tp.startswith("tp") and rank.startswith("r")):
        raise ValueError(f"{key!r} is not a {SCHEME} page key (bad tp/rank fields)")
    return unquote(ns), unquote(model), int(tp[2:]), int(rank[1:]), unquote(part), page_hash
