"""Llama from a small transformers config with random weights (2 layers, width 64, GQA).

`build` returns a wrapper with a positional (ids, mask) -> logits forward (the `(module, inputs)`
contract); `causal_lm` returns the bare `LlamaForCausalLM`, which `record` drives itself, and which
`record --generate N` runs as a greedy generation with a KV cache (docs/generation.md).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


class LlamaLogits(LlamaForCausalLM):
    """Positional (ids, mask) forward returning logits, with an explicit attention mask."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def config():
    return LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128,
                       bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")


def build(seq: int = 16):
    model = LlamaLogits(config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, seq))
    return model, (ids, torch.ones(1, seq, dtype=torch.long))


def causal_lm(seq: int = 16):
    model = LlamaForCausalLM(config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, seq))
    return model, (ids,)
