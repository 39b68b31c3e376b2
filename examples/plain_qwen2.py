"""A bare Qwen2ForCausalLM from a tiny transformers config (random weights), returned unwrapped.

`tapml-dbg record` drives a transformers causal LM itself, as `generate()` runs a prefill: an
explicit all-ones attention mask, positions from the mask, `use_cache=False`, and the logits as
the output (docs/causal-lm.md). No wrapper needed.
"""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def build(seq: int = 8):
    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=64,
                         attn_implementation="eager")
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, seq))
    return model, (ids,)
