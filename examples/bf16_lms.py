"""Tiny transformers causal LMs cast to bfloat16, the dtype LLMs ship in (random weights, seeded).

One build function per family: `tapml-dbg record examples/bf16_lms.py:build_llama -o traces/llama_bf16.h5`.
`build_llama_wide` has a 2048-wide MLP, where TVM 0.27's bf16 matmul (it sums in bf16 on llvm) is past
the noise floor (docs/coverage.md, "bf16 on llvm").
"""

import torch
import transformers

VOCAB, POSITIONS = 64, 6
ATTENTION = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                 vocab_size=VOCAB, attn_implementation="eager")


def _build(config_class: str, model_class: str, **arguments):
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**arguments)
    model = getattr(transformers, model_class)(config).eval().to(torch.bfloat16)
    return model, (torch.randint(0, VOCAB, (1, POSITIONS)),)


def build_llama():
    return _build("LlamaConfig", "LlamaForCausalLM", **ATTENTION, num_key_value_heads=2)


def build_llama_wide():
    return _build("LlamaConfig", "LlamaForCausalLM", **{**ATTENTION, "hidden_size": 64, "intermediate_size": 2048},
                  num_key_value_heads=2)


def build_qwen2():
    return _build("Qwen2Config", "Qwen2ForCausalLM", **ATTENTION, num_key_value_heads=2)


def build_mistral():
    return _build("MistralConfig", "MistralForCausalLM", **ATTENTION, num_key_value_heads=2)


def build_gemma():
    return _build("GemmaConfig", "GemmaForCausalLM", **ATTENTION, num_key_value_heads=2, head_dim=8)


def build_phi():
    return _build("PhiConfig", "PhiForCausalLM", **ATTENTION)


def build_gpt2():
    return _build("GPT2Config", "GPT2LMHeadModel", n_layer=1, n_embd=32, n_head=4, n_positions=64, bos_token_id=0,
                  eos_token_id=0, vocab_size=VOCAB, attn_implementation="eager")


build = build_llama
