"""The page key scheme (version 2): one UMBP key per page part, carrying everything that changes
the part's bytes.

A key is::

    hicache/v2/<namespace>/<backend tag>/<model>/<format tag>/<layout>/<kv dtype>/p<page tokens>
              /tp<tp size>/r<rank>/<part>/<page hash>

=================  ===========================================================================
field              what it separates
=================  ===========================================================================
``v2``             the scheme itself (:data:`SCHEME_VERSION`); v1 keys (no page format) are
                   never read by v2 code
namespace          deployments (the operator sets ``<k8s namespace>/<CR name>``)
backend tag        SGLang's ``extra_backend_tag`` extra-config key (empty when unset)
model              ``umbp_model_id``, else SGLang's storage model name (with PP/CP shards)
format tag         the host pool's ``storage_format_tag`` (SGLang's ``storage_model_name``
                   appends it to the model name; ``umbp_model_id`` used to drop it)
layout             host pool layout: ``page_first``, ``page_first_direct``, ``page_head`` (the
                   same KV in another byte order)
kv dtype           the host pool's dtype, e.g. ``bfloat16``, ``float8_e4m3fn``
page tokens        tokens per page (``--page-size``): another page size is another page
tp size, rank      which head slice a part holds (MLA: ``tp1/r0``, replicated)
part               ``k``/``v`` (MHA) or ``kv`` (MLA)
page hash          SGLang's 64-hex SHA-256 chain hash of the page's tokens
=================  ===========================================================================

Every field before the page hash is percent-encoded (``urllib.parse.quote`` with no safe
characters), so it never contains ``/``; an empty field is an empty segment. A key therefore
splits back into exactly one tuple of fields (:func:`parse_key`), and two keys are equal only if
every field is: deployments that differ in any one of them never read each other's pages.

The per-part prefixes are built once; a page key is one string concatenation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import quote, unquote

from ..contract.page_limits import MHA_PARTS

SCHEME_VERSION = 2
SCHEME = f"hicache/v{SCHEME_VERSION}"
_FIELDS_BEFORE_HASH = 12  # "hicache", "v2", then the ten escaped fields


def _escape(field_value: str) -> str:
    return quote(field_value, safe="")


@dataclass(frozen=True)
class PageFormat:
    """What the host pool does to a page's bytes, beyond model and head slice.

    ``PageFormat()`` (all empty, 0 tokens) is "unspecified": fine for tests and tools over one
    store; the SGLang adapter always fills it from the registered host pool
    (:meth:`from_host_pool` in :mod:`hicache_umbp.sglang.adapter`).
    """

    layout: str = ""
    kv_dtype: str = ""
    page_tokens: int = 0
    format_tag: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.page_tokens, int) or self.page_tokens < 0:
            raise ValueError(f"page_tokens={self.page_tokens!r} must be an integer >= 0")
        for name in ("layout", "kv_dtype", "format_tag"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a string")


class KeyFields(NamedTuple):
    """A key split back into its fields (:func:`parse_key`)."""

    namespace: str
    backend_tag: str
    model_id: str
    page_format: PageFormat
    tp_size: int
    rank: int
    part: str
    page_hash: str


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
    page_format: PageFormat = PageFormat()
    backend_tag: str = ""
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
        if not isinstance(self.page_format, PageFormat):
            problems.append(f"page_format={self.page_format!r} must be a PageFormat")
        if problems:
            raise ValueError("invalid KeyScheme: " + "; ".join(problems))
        fmt = self.page_format
        base = "/".join(
            (
                SCHEME,
                _escape(self.namespace),
                _escape(self.backend_tag),
                _escape(self.model_id),
                _escape(fmt.format_tag),
                _escape(fmt.layout),
                _escape(fmt.kv_dtype),
                f"p{fmt.page_tokens}",
                f"tp{self.tp_size}",
                f"r{self.rank}",
            )
        )
        object.__setattr__(
            self, "_prefixes", tuple(f"{base}/{_escape(p)}/" for p in self.parts)
        )

    @property
    def pod_identity(self) -> str:
        """The fields every rank of the pod shares (everything before the rank): what a shared
        SSD tier's drives are written for (:mod:`hicache_umbp.disk.layout`)."""
        return self._prefixes[0].rsplit("/", 3)[0]

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


def parse_key(key: str) -> KeyFields:
    """Split a key back into its fields; the inverse of :meth:`KeyScheme.page_keys`."""
    segments = key.split("/", _FIELDS_BEFORE_HASH)
    if len(segments) != _FIELDS_BEFORE_HASH + 1 or "/".join(segments[:2]) != SCHEME:
        raise ValueError(f"{key!r} is not a {SCHEME} page key")
    _, _, ns, tag, model, fmt_tag, layout, dtype, page, tp, rank, part, page_hash = segments
    numbers = (page, "p"), (tp, "tp"), (rank, "r")
    if not all(s.startswith(p) and s[len(p) :].isdigit() for s, p in numbers):
        raise ValueError(f"{key!r} is not a {SCHEME} page key (bad page/tp/rank fields)")
    return KeyFields(
        namespace=unquote(ns),
        backend_tag=unquote(tag),
        model_id=unquote(model),
        page_format=PageFormat(unquote(layout), unquote(dtype), int(page[1:]), unquote(fmt_tag)),
        tp_size=int(tp[2:]),
        rank=int(rank[1:]),
        part=unquote(part),
        page_hash=page_hash,
    )
