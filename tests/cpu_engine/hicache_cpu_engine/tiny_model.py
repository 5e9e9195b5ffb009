"""Tiny, locally generated models for serving tests: nothing is downloaded from a model hub.

``python -m hicache_cpu_engine.tiny_model DIR {llama|mla}`` writes a ``save_pretrained``
directory: random weights from a fixed seed (bf16) and a byte-level BPE tokenizer trained on a
built-in corpus, so the same command gives the same model on any machine. ``llama`` is an MHA
model (GQA, 2 layers); ``mla`` is a DeepSeek-V2-architecture model whose attention is MLA
(compressed latent KV: SGLang's ``MLATokenToKVPool`` and MLA host pool).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SEED = 1234
VOCAB = 512
CORPUS = (
    "The hierarchical cache keeps the key value cache of long prompts in device memory, host "
    "memory and a storage tier. A request that shares a prefix with an earlier one reuses its "
    "cached pages instead of computing them again. Multi-turn chats, agents and documents with a "
    "long system prompt benefit the most. Pages move from the device to the host pool when the "
    "device fills up, and from the host pool to the storage tier in the background. "
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}-_/\n"
)

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
}
MLA = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": None,
    "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 2,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    # SGLang's CPU path builds DeepSeek's RoPE only as YaRN (deepseek_yarn); factor 1 = plain RoPE.
    "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 1.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0},
    "tie_word_embeddings": False, "topk_method": "greedy",
    "n_group": 1, "topk_group": 1, "num_experts_per_tok": 1, "moe_layer_freq": 1,
    "scoring_func": "softmax", "norm_topk_prob": False, "routed_scaling_factor": 1.0,
    "attention_bias": False, "attention_dropout": 0.0,
}
# The shape issue 24's L3-hit latency was seen with (3 layers, 2 KV heads): bench/l3_hit.py.
LLAMA3 = {**LLAMA, "num_hidden_layers": 3}
KINDS: dict[str, dict[str, Any]] = {"llama": LLAMA, "llama3": LLAMA3, "mla": MLA}


def _tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


def make_model(out: Path, kind: str) -> Path:
    """Write the model (config, weights, tokenizer) to ``out``; returns ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind not in KINDS:
        raise ValueError(f"model kind {kind!r}: expected one of {sorted(KINDS)}")
    out.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer(out)
    cfg_dict = {**KINDS[kind], "vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 1,
                "torch_dtype": "bfloat16"}
    cfg = AutoConfig.for_model(cfg_dict.pop("model_type"), **cfg_dict)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "hicache-tiny-model.json").write_text(json.dumps({"kind": kind, "seed": SEED}))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m hicache_cpu_engine.tiny_model DIR {llama|mla}")
    print(make_model(Path(sys.argv[1]), sys.argv[2]))
