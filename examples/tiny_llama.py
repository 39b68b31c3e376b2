"""Llama from a small transformers config with random weights (2 layers, width 64, GQA)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


class LlamaLogits(LlamaForCausalLM):
    """Positional (ids, mask) forward returning logits, with an explicit attention mask."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def build(seq: int = 16):
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")
    model = LlamaLogits(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, seq))
    return model, (ids, torch.ones(1, seq, dtype=torch.long))
