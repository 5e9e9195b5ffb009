"""The opt-in CPU extend attention (hicache_cpu_engine.tail_attention) against SGLang 0.5.23's own.

Real: SGLang's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` (called unbound: plain causal
attention reads nothing from the backend object) and torch's SDPA. Faked: the KV cache, the
request-to-token table and the queries are random tensors, two sequences with cached prefixes
and one without. Float32, so the two computations agree to rounding.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.sglang

HEADS, KV_HEADS, DIM = 4, 2, 8


def _case() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    prefix = torch.tensor([40, 0, 7])
    extend = torch.tensor([5, 9, 1])
    seq = prefix + extend
    k_cache = torch.randn(200, KV_HEADS, DIM, generator=g)
    v_cache = torch.randn(200, KV_HEADS, DIM, generator=g)
    req_to_token = torch.randperm(200, generator=g)[:3 * 60].view(3, 60)
    query = torch.randn(int(extend.sum()), HEADS, DIM, generator=g)
    return query, k_cache, v_cache, req_to_token, torch.arange(3), seq, prefix, extend


def test_new_rows_only_equal_sglangs_whole_sequence_extend() -> None:
    from hicache_cpu_engine import tail_attention
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    query, k, v, r2t, pools, seq, prefix, extend = _case()
    theirs = TorchNativeAttnBackend._run_sdpa_forward_extend(
        None, query, torch.zeros_like(query), k, v, r2t, pools, seq, prefix, extend,
        scaling=0.3, enable_gqa=True, causal=True)
    ours = tail_attention.run(query, torch.zeros_like(query), k, v, r2t, pools, seq, prefix,
                              extend, 0.3, True)
    torch.testing.assert_close(ours, theirs)


def test_other_cases_go_to_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache_cpu_engine import tail_attention

    query, k, v, r2t, pools, seq, prefix, extend = _case()
    calls: list[str] = []

    def original(*a: object, **kw: object) -> str:
        calls.append("sglang")
        return "sglang"

    args = (query, torch.zeros_like(query), k, v, r2t, pools, seq)
    assert tail_attention.tail_extend(original, None, *args, torch.zeros(3, dtype=torch.int64),
                                      extend, causal=True) == "sglang"
    assert tail_attention.tail_extend(original, None, *args, prefix, extend, causal=True,
                                      sliding_window_size=16) == "sglang"
    assert tail_attention.tail_extend(original, None, *args, prefix, extend,
                                      causal=False) == "sglang"
    assert calls == ["sglang"] * 3
    monkeypatch.delenv(tail_attention.ENV, raising=False)
    seen: list[str] = []

    class Registry:
        @staticmethod
        def register(target: str, hook: object, kind: object) -> None:
            seen.append(target)

    tail_attention.register(Registry, "around")
    assert seen == []
    monkeypatch.setenv(tail_attention.ENV, "1")
    tail_attention.register(Registry, "around")
    assert seen == [tail_attention.TARGET]
