"""Tiny transformers causal LMs of eight families (and a wide-MLP Llama) in float32, float16 and bfloat16 (random weights, seeded).

One build function per family and dtype, the dtype in its name (`fp32`, `fp16`, `bf16`):
`tapml-dbg record examples/family_lms.py:build_llama_fp16 -o traces/llama_fp16.h5` (add `--generate 2`
for greedy generation). The configs are tests/test_causal_lm.py's (1 layer, width 32, MLP 64, 4 heads,
vocab 64, 6 positions); `benchmarks/family_coverage.py` records and bisects every one on llvm
(docs/coverage.md, "Causal-LM families by dtype on llvm").
"""

import torch
import transformers

VOCAB, POSITIONS = 64, 6
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_ATTENTION = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  vocab_size=VOCAB, attn_implementation="eager")
_GROUPED = dict(_ATTENTION, num_key_value_heads=2)
FAMILIES = {  # name: (config class, model class, config arguments)
    "llama": ("LlamaConfig", "LlamaForCausalLM", _GROUPED),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _GROUPED),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_GROUPED, head_dim=8)),
    "mistral": ("MistralConfig", "MistralForCausalLM", _GROUPED),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_GROUPED, head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_GROUPED, head_dim=8)),
    "phi": ("PhiConfig", "PhiForCausalLM", _ATTENTION),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_layer=1, n_embd=32, n_head=4, n_positions=64, bos_token_id=0,
                                                   eos_token_id=0, vocab_size=VOCAB, attn_implementation="eager")),
    # Llama with a 2048-wide MLP (width 64): the down projection sums 2048 products, where a matmul that
    # sums in its low-precision dtype shows (real LLMs' MLPs are wider still: 5632 in TinyLlama)
    "llama_wide": ("LlamaConfig", "LlamaForCausalLM", dict(_GROUPED, hidden_size=64, intermediate_size=2048)),
}


def build_family(family: str, dtype: str):
    """The bare causal LM of `family` cast to `dtype` (a DTYPES key) and its `(input_ids,)`."""
    config_class, model_class, arguments = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**arguments)
    model = getattr(transformers, model_class)(config).eval().to(DTYPES[dtype])
    return model, (torch.randint(0, VOCAB, (1, POSITIONS)),)


def _builder(family: str, dtype: str):
    def build():
        return build_family(family, dtype)

    build.__name__ = build.__qualname__ = f"build_{family}_{dtype}"
    build.__doc__ = f"The tiny {family} causal LM in {DTYPES[dtype]}."
    return build


for _family in FAMILIES:  # build_llama_fp32, build_llama_fp16, build_llama_bf16, ... (FILE.py:FUNC specs)
    for _dtype in DTYPES:
        globals()[f"build_{_family}_{_dtype}"] = _builder(_family, _dtype)

build = globals()["build_llama_fp32"]
