"""Extend attention for the new tokens only, on SGLang's CPU ``torch_native`` backend (opt-in).

SGLang 0.5.23's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` computes attention for every
token of a sequence, cached prefix included (``per_req_query_redudant``: a ``[heads, seq_len,
dim]`` query of which only the new rows are kept), so a 12-token tail after a 1,012-token cache
hit costs the attention of the whole 1,024-token prompt. The GPU backends (FlashAttention,
FlashInfer, Triton, aiter) compute the new rows only: on CPU, a cache hit of any tier looks
slower than it is (docs/performance.md, "One L3 hit": the tail's forward took as long as the
cold prompt's). With ``CPU_ENGINE_TAIL_ATTENTION=1`` this wraps that method and, for plain
causal self-attention, computes the new rows against the whole cached sequence with the causal
mask offset by the prefix (row ``i`` sees keys ``0 .. prefix + i``); a sequence without a prefix
and every other case (sliding window, encoder, cross attention) go to SGLang's own code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

ENV = "CPU_ENGINE_TAIL_ATTENTION"
TARGET = ("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend."
          "_run_sdpa_forward_extend")


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() == "1"


def register(registry: Any, around: Any) -> None:
    if enabled():
        registry.register(TARGET, tail_extend, around)


def tail_extend(original: Callable[..., Any], self: Any, query: Any, output: Any, k_cache: Any,
                v_cache: Any, req_to_token: Any, req_pool_indices: Any, seq_lens: Any,
                extend_prefix_lens: Any, extend_seq_lens: Any, encoder_lens: Any = None,
                scaling: Any = None, enable_gqa: bool = False, causal: bool = False,
                is_cross_attn: bool = False, sliding_window_size: Any = None) -> Any:
    plain = (causal and encoder_lens is None and not is_cross_attn
             and (sliding_window_size is None or sliding_window_size <= -1))
    if not plain or int(extend_prefix_lens.max()) == 0:
        return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                        seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens=encoder_lens,
                        scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                        is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    return run(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
               extend_prefix_lens, extend_seq_lens, scaling, enable_gqa)


def run(query: Any, output: Any, k_cache: Any, v_cache: Any, req_to_token: Any,
        req_pool_indices: Any, seq_lens: Any, extend_prefix_lens: Any, extend_seq_lens: Any,
        scaling: Any, enable_gqa: bool) -> Any:
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    q_all = query.movedim(0, query.dim() - 2)  # [heads, tokens, dim]
    start_q = 0
    for i in range(seq_lens.shape[0]):
        n_q, prefix, n_kv = (int(extend_seq_lens[i]), int(extend_prefix_lens[i]),
                             int(seq_lens[i]))
        q = q_all[:, start_q:start_q + n_q, :]
        tokens = req_to_token[req_pool_indices[i], :n_kv]
        k = k_cache[tokens].movedim(0, query.dim() - 2).to(q.dtype)
        v = v_cache[tokens].movedim(0, query.dim() - 2).to(q.dtype)
        rows = torch.arange(n_q).unsqueeze(1) + prefix
        mask = torch.arange(n_kv).unsqueeze(0) <= rows  # row i: keys 0 .. prefix + i
        out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                           attn_mask=mask, enable_gqa=enable_gqa, scale=scaling)
        output[start_q:start_q + n_q, :, :] = out.squeeze(0).movedim(query.dim() - 2, 0)
        start_q += n_q
    return output
