"""Parse a CR into typed models and check the cross-field rules (the CRD's CEL rules, again).

The API server enforces the CEL rules on create/update; the planner re-checks them so ``plan -f``
on a file, and CRs stored before a rule existed, get the same verdict with the same message.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hicache_umbp.contract.builtin import BUILTIN_BACKEND
from pydantic import ValidationError

from ..api.crd import MAX_NAME_LENGTH
from ..api.k8s import ROLLING_UPDATE_TYPES_MESSAGE
from ..api.l3 import (
    BUILTIN_PREFAULT_THREADS_MESSAGE,
    BUILTIN_SSD_MESSAGE,
    MORI_ONE_VOLUME_MESSAGE,
)
from ..api.spec import KV_BYTES_NEEDS_ATTENTION, KV_HEADS_NEEDS_MHA, SGLangHiCacheSpec
from ..api.types import API_VERSION, KIND
from .errors import Problems

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ParsedCR:
    name: str
    namespace: str
    generation: int | None
    spec: SGLangHiCacheSpec


_UNION_TAGS = frozenset({"int", "str", "float", "bool", "dict", "list"})


def _loc(loc: tuple[int | str, ...]) -> str:
    """``spec.a.b[0]``; pydantic's union-member tags (``int``, ``function-after[...]``) dropped."""
    out = "spec"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _UNION_TAGS and "[" not in part:
            out += f".{part}"
    return out


def _pydantic_problems(e: ValidationError) -> list[tuple[str, str]]:
    """One problem per field: a union's per-member messages are joined into one."""
    by_path: dict[str, list[str]] = {}
    for err in e.errors():
        messages = by_path.setdefault(_loc(tuple(err["loc"])), [])
        message = _message(err)
        if message not in messages:
            messages.append(message)
    return [(path, "; or ".join(messages)) for path, messages in by_path.items()]


def parse_cr(cr: Mapping[str, Any], problems: Problems) -> ParsedCR | None:
    """The typed CR (``None`` when the spec does not even parse); problems go to ``problems``."""
    if not isinstance(cr, Mapping):
        problems.add("<root>", f"a CR must be a mapping, got {type(cr).__name__}")
        return None
    api_version, kind = cr.get("apiVersion"), cr.get("kind")
    if api_version is not None and api_version != API_VERSION:
        problems.add("apiVersion", f"{api_version!r} is not {API_VERSION!r}")
    if kind is not None and kind != KIND:
        problems.add("kind", f"{kind!r} is not {KIND!r}")
    meta = cr.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = (meta.get("namespace") if isinstance(meta, Mapping) else None) or "default"
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        problems.add("metadata.name", "is required")
        name = ""
    elif len(name) > MAX_NAME_LENGTH or not _DNS1035.match(name):
        problems.add(
            "metadata.name",
            f"{name!r} must be a DNS-1035 label (lower-case letters, digits, '-', "
            f"starting with a letter) of at most {MAX_NAME_LENGTH} characters: it names "
            f"Services and the StatefulSet's pods",
        )
    if not isinstance(namespace, str) or not _DNS1123.match(namespace):
        problems.add("metadata.namespace", f"{namespace!r} is not a valid namespace name")
    raw_spec = cr.get("spec")
    if not isinstance(raw_spec, Mapping):
        problems.add("spec", "is required and must be a mapping")
        return None
    try:
        spec = SGLangHiCacheSpec.model_validate(dict(raw_spec))
    except ValidationError as e:
        problems.extend(_pydantic_problems(e))
        # Drop the fields that failed and parse the rest, so the planner can still report the
        # CR's other problems in the same answer; the dropped paths mask their own echoes.
        pruned = copy.deepcopy(dict(raw_spec))
        for err in e.errors():
            if _drop(pruned, tuple(err["loc"])):
                problems.masked.add(_loc(tuple(err["loc"])))
        try:
            spec = SGLangHiCacheSpec.model_validate(pruned)
        except ValidationError:
            return None
    # Cross-field problems are collected but the typed spec is returned, so the planner can
    # report every other problem of the same CR in one go.
    check_cross_field_rules(spec, problems)
    return ParsedCR(
        name=name,
        namespace=str(namespace),
        generation=generation if isinstance(generation, int) else None,
        spec=spec,
    )


def _drop(spec: dict[str, Any], loc: tuple[int | str, ...]) -> bool:
    """Remove the value at pydantic's ``loc`` (union tags skipped) from the raw spec."""
    node: Any = spec
    parts = [p for p in loc if isinstance(p, int) or (p not in _UNION_TAGS and "[" not in p)]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            if last:
                del node[part]
                return True
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            if last:
                node.pop(part)  # later indices of the same list shift; their re-parse decides
                return True
            node = node[part]
        else:
            return False
    return False


def _message(err: Any) -> str:
    msg = str(err["msg"])
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "literal_error":
        return f"{err.get('input')!r} is not allowed: {msg.removeprefix('Input should be ')}"
    return msg.removeprefix("Value error, ")


def check_cross_field_rules(spec: SGLangHiCacheSpec, problems: Problems) -> None:
    """The rules the CRD states as CEL, with the same messages."""
    model = spec.model
    if model.kv_bytes_per_token is not None and model.attention == "auto":
        problems.add("spec.model.kvBytesPerToken", KV_BYTES_NEEDS_ATTENTION)
    if model.kv_heads is not None and (
        model.kv_bytes_per_token is None or model.attention != "mha"
    ):
        problems.add("spec.model.kvHeads", KV_HEADS_NEEDS_MHA)
    hc = spec.hi_cache
    if (hc.host_pool_per_rank is None) == (hc.host_pool_ratio is None):
        problems.add("spec.hiCache", "set exactly one of hostPoolPerRank or hostPoolRatio")
    if hc.mem_layout == "layer_first":
        problems.add(
            "spec.hiCache.memLayout",
            "memLayout layer_first is not allowed: the UMBP store needs a page-first "
            "layout (page_first or page_first_direct)",
        )
    if hc.write_policy != "write_back" and not hc.allow_write_through:
        problems.add(
            "spec.hiCache.writePolicy",
            "writePolicy write_through needs allowWriteThrough: true (a detokenizer "
            "deadlock was seen with write-through policies)",
        )
    if hc.host_pool_ratio is not None and hc.host_allocator.huge_page_size != "none":
        problems.add(
            "spec.hiCache.hostPoolRatio",
            "hostPoolRatio sizes the pool from the GPU KV cache, which the operator "
            "cannot know, so hugepages cannot be requested: use hostPoolPerRank or "
            "hostAllocator.hugePageSize none",
        )
    strategy = spec.update_strategy
    if strategy.rolling_update is not None and strategy.type == "OnDelete":
        problems.add("spec.updateStrategy", ROLLING_UPDATE_TYPES_MESSAGE)
    ssd = spec.l3.ssd
    if (spec.l3.mode == "standalone" and ssd.enabled and ssd.engine == "mori"
            and ssd.io_backend != "io_uring"):
        problems.add(
            "spec.l3",
            "ssd.ioBackend posix cannot be honoured in standalone mode with engine mori: the "
            "umbp_standalone_server of mori 1.2.4 always uses io_uring (and falls back to "
            "posix by itself); use io_uring or mode embedded",
        )
    if spec.l3.backend == BUILTIN_BACKEND:
        if ssd.enabled:
            problems.add("spec.l3", BUILTIN_SSD_MESSAGE)
        if hc.host_allocator.prefault_threads:
            problems.add("spec.hiCache.hostAllocator.prefaultThreads",
                         BUILTIN_PREFAULT_THREADS_MESSAGE)
    if ssd.enabled and (ssd.capacity is None or not ssd.drive_volumes()):
        problems.add("spec.l3.ssd", "an enabled SSD tier needs capacity and volume (or volumes)")
    if ssd.volume is not None and ssd.volumes is not None:
        problems.add("spec.l3.ssd", "set exactly one of volume or volumes")
    if ssd.volumes is not None and ssd.engine == "mori" and len(ssd.volumes) > 1:
        problems.add("spec.l3.ssd.volumes", MORI_ONE_VOLUME_MESSAGE)
    at = ([("spec.l3.ssd.volume", ssd.volume)] if ssd.volume is not None else
          [(f"spec.l3.ssd.volumes[{i}]", v) for i, v in enumerate(ssd.volumes or [])])
    for path, vol in at:
        count = sum(
            v is not None for v in (vol.claim_template, vol.empty_dir, vol.host_path)
        )
        if count != 1:
            problems.add(path, "set exactly one of claimTemplate, emptyDir or hostPath")
