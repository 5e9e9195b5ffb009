"""The L3-hit measurement harness (hicache_cpu_engine.l3trace) against real SGLang 0.5.23.

Real: SGLang's modules and classes (every wrapped method must exist under the name the harness
uses, or bench/l3_hit.py would measure nothing), SGLang's hook registry applying an AROUND hook.
Faked: the object the wrapped function is called on (a plain object with a request id).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang


def test_every_wrapped_method_exists_in_sglang_and_our_adapter() -> None:
    from hicache_cpu_engine import l3trace

    missing = []
    for target in l3trace.targets():
        module, cls, method = target.rsplit(".", 2)
        owner = getattr(importlib.import_module(module), cls, None)
        if not callable(getattr(owner, method, None)):
            missing.append(target)
    assert not missing, f"SGLang 0.5.23 (or our adapter) has no {missing}"


def test_a_span_writes_start_and_end_with_the_request_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_cpu_engine import l3trace

    monkeypatch.setenv(l3trace.ENV, str(tmp_path / "trace"))
    monkeypatch.setattr(l3trace, "_out", None)

    class Op:
        request_id = "r-1"

    hook = l3trace.targets()[f"{l3trace.HCC}._storage_hit_query"]
    got = hook(lambda self, op: (["h"], 32), object(), Op())
    assert got == (["h"], 32)
    (f,) = (tmp_path / "trace").glob("l3trace-*.jsonl")
    evs = [json.loads(line) for line in f.read_text().splitlines()]
    assert [(e["ev"], e["rid"]) for e in evs] == [("hit_query.start", "r-1"),
                                                  ("hit_query.end", "r-1")]
    assert evs[1]["hit_tokens"] == 32 and evs[0]["t"] <= evs[1]["t"]


def test_nothing_is_registered_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_cpu_engine import l3trace

    monkeypatch.delenv(l3trace.ENV, raising=False)
    seen: list[str] = []

    class Registry:
        @staticmethod
        def register(target: str, hook: object, kind: object) -> None:
            seen.append(target)

    l3trace.register(Registry, "around")
    assert seen == []
    monkeypatch.setenv(l3trace.ENV, "/nonexistent")
    l3trace.register(Registry, "around")
    assert sorted(seen) == sorted(l3trace.targets())
