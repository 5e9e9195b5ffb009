"""Request traces: Mooncake's published format and ours, parsed into prefix-block chains.

**Mooncake** (``FAST25-release/traces/*.jsonl``): one JSON object per line with ``timestamp``
(ms), ``input_length``, ``output_length`` and ``hash_ids``, one id per 512-token block. The ids
are *prefix* hashes: an id names its block together with everything before it, so one id never
appears at two chain positions or under two parents (checked on both published traces:
``tests/operator/test_trace_model_paper.py``). A block is therefore keyed by its id alone.

**Ours** (``hicache-trace``, docs/capacity-planning.md): an optional first line
``{"hicache_trace": 1, "block_tokens": 64}``, then one request per line with ``timestamp`` (ms)
and either ``tokens`` (the prompt's token ids, as SGLang's ``/generate`` takes ``input_ids``)
or ``text`` (the prompt; 4 UTF-8 bytes count as one token, the router's ``charsPerToken``
default), and optionally ``output_length``. We cut the prompt into blocks of ``block_tokens``
(default 64) and chain-hash them, so two prompts share exactly the blocks of their common
prefix, as SGLang's radix tree and page hashes do.

A bad line is a :class:`TraceError` naming the line and the reason, never another exception.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

MOONCAKE_BLOCK_TOKENS = 512
OUR_BLOCK_TOKENS_DEFAULT = 64
TEXT_BYTES_PER_TOKEN = 4
BUILTIN_TRACES = {
    "mooncake-conversation": "conversation_trace.jsonl",
    "mooncake-synthetic": "synthetic_trace.jsonl",
}


class TraceError(ValueError):
    """A trace that cannot be read; ``line`` is 1-based (0: the file itself)."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        self.source, self.line, self.reason = source, line, reason
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    blocks: tuple[int, ...]  # prefix-block keys, one per block_tokens of the prompt


@dataclass(frozen=True)
class Trace:
    name: str
    block_tokens: int
    requests: tuple[Request, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    @property
    def duration_s(self) -> float:
        """Arrival span; a one-request (or same-instant) trace counts as one second."""
        if not self.requests:
            return 1.0
        span = (self.requests[-1].timestamp_ms - self.requests[0].timestamp_ms) / 1000
        return span if span > 0 else 1.0

    def sliced(self, count: int, *, start: int = 0) -> Trace:
        return Trace(f"{self.name}[{start}:{start + count}]", self.block_tokens,
                     self.requests[start:start + count])


def load_trace(source: str) -> Trace:
    """A built-in trace by name (:data:`BUILTIN_TRACES`) or a file of either format."""
    if source in BUILTIN_TRACES:
        ref = resources.files(__package__).joinpath("traces").joinpath(BUILTIN_TRACES[source])
        return parse_lines(ref.read_text(encoding="utf-8").splitlines(), source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        known = ", ".join(BUILTIN_TRACES)
        raise TraceError(source, 0, f"cannot read it ({e}); built-in traces: {known}") from None
    return parse_lines(text.splitlines(), source)


def parse_lines(lines: Iterable[str], source: str) -> Trace:
    requests: list[Request] = []
    fmt: str | None = None
    block_tokens = MOONCAKE_BLOCK_TOKENS
    last_ts = None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TraceError(source, number, f"not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(source, number, "a request must be a JSON object")
        if "hicache_trace" in obj:
            if requests or fmt is not None:
                raise TraceError(source, number, "the hicache_trace header must be line 1")
            block_tokens = _header(obj, source, number)
            fmt = "ours"
            continue
        kind = "mooncake" if "hash_ids" in obj else "ours"
        if fmt is None:
            fmt = kind
            if kind == "ours":
                block_tokens = OUR_BLOCK_TOKENS_DEFAULT
        elif kind != fmt:
            raise TraceError(source, number, f"a {kind} request in a {fmt} trace "
                             f"(hash_ids and tokens/text do not mix)")
        req = (_mooncake(obj, source, number, block_tokens) if kind == "mooncake"
               else _ours(obj, source, number, block_tokens))
        if last_ts is not None and req.timestamp_ms < last_ts:
            raise TraceError(source, number, f"timestamp {req.timestamp_ms} is before the "
                             f"previous request's {last_ts}: requests must be in arrival order")
        last_ts = req.timestamp_ms
        requests.append(req)
    if not requests:
        raise TraceError(source, 0, "holds no request")
    return Trace(Path(source).name if Path(source).suffix else source, block_tokens,
                 tuple(requests))


def _int(obj: dict[str, Any], key: str, source: str, line: int, *, minimum: int = 0,
         default: int | None = None) -> int:
    if key not in obj:
        if default is not None:
            return default
        raise TraceError(source, line, f"missing {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(source, line, f"{key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _header(obj: dict[str, Any], source: str, line: int) -> int:
    if obj["hicache_trace"] != 1:
        raise TraceError(source, line, f"unknown hicache_trace version {obj['hicache_trace']!r}"
                         f" (this planner reads 1)")
    return _int(obj, "block_tokens", source, line, minimum=1, default=OUR_BLOCK_TOKENS_DEFAULT)


def _mooncake(obj: dict[str, Any], source: str, line: int, block_tokens: int) -> Request:
    ts = _int(obj, "timestamp", source, line)
    length = _int(obj, "input_length", source, line, minimum=1)
    out = _int(obj, "output_length", source, line, default=0)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise TraceError(source, line, "'hash_ids' must be a non-empty list of integers >= 0")
    need = -(-length // block_tokens)
    if len(ids) != need:
        raise TraceError(source, line, f"{len(ids)} hash_ids for input_length {length}: "
                         f"{block_tokens}-token blocks need {need}")
    return Request(ts, length, out, tuple(ids))


def _ours(obj: dict[str, Any], source: str, line: int, block_tokens: int) -> Request:
    ts = _int(obj, "timestamp", source, line)
    out = _int(obj, "output_length", source, line, default=0)
    if "tokens" in obj:
        tokens = obj["tokens"]
        if not isinstance(tokens, list) or not tokens or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63
                for t in tokens):
            raise TraceError(source, line, "'tokens' must be a non-empty list of token ids")
        data = b"".join(t.to_bytes(8, "little") for t in tokens)
        unit = 8
        length = len(tokens)
    elif "text" in obj:
        text = obj["text"]
        if not isinstance(text, str) or not text:
            raise TraceError(source, line, "'text' must be a non-empty string")
        data = text.encode("utf-8")
        unit = TEXT_BYTES_PER_TOKEN
        length = -(-len(data) // unit)
    else:
        raise TraceError(source, line, "a request needs 'hash_ids' (Mooncake), 'tokens' or "
                         "'text' (hicache-trace)")
    return Request(ts, length, out, tuple(_chain(data, unit * block_tokens)))


def _chain(data: bytes, block_bytes: int) -> Iterator[int]:
    """Prefix hashes: each block's key covers its bytes and its parent's key."""
    parent = b""
    for start in range(0, len(data), block_bytes):
        digest = hashlib.blake2b(parent + data[start:start + block_bytes], digest_size=8)
        parent = digest.digest()
        # Mooncake ids are small integers; ours carry a high bit so the two never collide when
        # a test mixes them in one cache.
        yield int.from_bytes(parent, "little") | (1 << 64)
