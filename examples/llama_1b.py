"""A TinyLlama-1.1B-shaped Llama from a transformers config, random weights: 22 layers, width 2048,
GQA 32/4 heads, vocab 32000, a 128-token prompt (~1.1e9 parameters, 4.4 GB in float32).

For the GPU at scale (docs/cuda.md): `build` is the wrapper the `(module, inputs)` contract takes,
with an explicit all-ones attention mask (TVM's own whole-model build can then be timed against,
benchmarks/time_to_answer.py); `build_without_mask` is the same model called with the ids alone, as
issue [17] first built it (transformers then makes the causal mask with a bool `cumsum`, which TVM
0.27 imports as bool and which aborts on CUDA: benchmarks/sticky_cuda.py); `causal_lm` is the bare
`LlamaForCausalLM`, which `record` drives itself and `record --generate N` generates with. `TAPML_LLAMA_1B_LAYERS` / `_WIDTH` shrink it (a
CPU check of a script before it runs on the GPU).
"""

import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = 128


class LlamaLogits(LlamaForCausalLM):
    """Positional (ids, mask) forward returning logits, with an explicit attention mask."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


class LlamaLogitsWithoutMask(LlamaForCausalLM):
    """Positional (ids) forward returning logits: no attention mask, transformers makes its own."""

    def forward(self, input_ids):
        return super().forward(input_ids=input_ids, use_cache=False).logits


def config() -> LlamaConfig:
    layers = int(os.environ.get("TAPML_LLAMA_1B_LAYERS", "22"))
    width = int(os.environ.get("TAPML_LLAMA_1B_WIDTH", "2048"))
    return LlamaConfig(num_hidden_layers=layers, hidden_size=width, intermediate_size=width * 11 // 4,
                       num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                       max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                       attn_implementation="eager")


def _ids():
    return torch.randint(0, 32000, (1, PROMPT))


def build():
    torch.manual_seed(0)
    model = LlamaLogits(config()).eval()
    return model, (_ids(), torch.ones(1, PROMPT, dtype=torch.long))


def build_without_mask():
    torch.manual_seed(0)
    return LlamaLogitsWithoutMask(config()).eval(), (_ids(),)


def causal_lm():
    torch.manual_seed(0)
    model = LlamaForCausalLM(config()).eval()
    return model, (_ids(),)
