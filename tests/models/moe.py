"""Tiny transformers mixture-of-experts causal LMs (random weights), returned unwrapped: their MoE
layers export `aten.histc` and transformers' `grouped_mm_fallback` custom op, which TVM 0.27 cannot
import (docs/host-only-ops.md). `build` is Mixtral, `build_qwen2_moe` Qwen2-MoE (with its shared expert)."""

import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

SEQ = 8
COMMON = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
              max_position_embeddings=64, attn_implementation="eager")


def build():
    torch.manual_seed(0)
    config = MixtralConfig(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, **COMMON)
    model = MixtralForCausalLM(config).eval()
    return model, (torch.randint(0, config.vocab_size, (1, SEQ)),)


def build_qwen2_moe():
    torch.manual_seed(0)
    config = Qwen2MoeConfig(intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                            num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, **COMMON)
    model = Qwen2MoeForCausalLM(config).eval()
    return model, (torch.randint(0, config.vocab_size, (1, SEQ)),)
