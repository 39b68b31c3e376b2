"""GPT-2 from a small transformers config with random weights (2 layers, width 64)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


class GPT2Logits(GPT2LMHeadModel):
    """Positional (ids, mask) forward returning logits. An explicit attention mask avoids a
    TVM 0.27 import bug (cumsum over a bool mask keeps dtype bool)."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def config(**overrides) -> GPT2Config:
    settings = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128,
                    bos_token_id=0, eos_token_id=0)
    # eager attention: the exported graph then computes exactly what the model's forward does
    # (with sdpa, torch's fused kernel and its decomposition differ in the last bits)
    settings.setdefault("attn_implementation", "eager")
    settings.update(overrides)
    return GPT2Config(**settings)


def build(seq: int = 16, **overrides):
    model = GPT2Logits(config(**overrides)).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, seq))
    return model, (ids, torch.ones(1, seq, dtype=torch.long))
