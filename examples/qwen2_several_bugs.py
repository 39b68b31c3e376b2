"""A tiny transformers Qwen2 used as a new user would: no attention mask, the last position's logits
read with `logits[:, -1]`, and an integer count scaled by 0.5. Real TVM 0.27 divergences in one model."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


class LastLogits(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.lm = Qwen2ForCausalLM(config)

    def forward(self, input_ids, counts):
        logits = self.lm(input_ids=input_ids, use_cache=False).logits
        return logits[:, -1] - counts * 0.5


def build(seq: int = 8):
    config = Qwen2Config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64, max_position_embeddings=64,
                         attn_implementation="eager")
    torch.manual_seed(0)
    model = LastLogits(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, seq))
    counts = torch.randint(0, 4, (1, config.vocab_size))
    return model, (ids, counts)
