"""One Llama, twice: transformers' `LlamaForCausalLM` (`build`) and the same weights written with
`tvm.relax.frontend.nn` on TVM's own paged KV cache (`build_tvm`), MLC-LLM's way of deploying an LLM.

`build()` returns the transformers model and its prompt ids (`(model, (ids,))`, as examples/tiny_llama.py's
`causal_lm`). `build_tvm(target)` returns a dict, the contract of a TVM-native LLM (docs/native-llm.md):

    mod        tvm.IRModule with the functions named in `functions`; the paged cache's TIR kernels
               (attention, append, rotary, page copy) are generated for `target` (CPU or GPU kernels)
    params     [(name, numpy array)] in the order prefill/decode take them after (ids, cache);
               the names are transformers' state_dict names (`model.layers.0.self_attn.q_proj.weight`)
    prompt     int32 array (1, L): the prompt ids, the same as build()'s
    functions  {"create_cache": "create_paged_kv_cache", "prefill": "prefill", "decode": "decode"}
    cache      {"max_batch_size": 1, "max_total_seq_len": ..., "prefill_chunk_size": ..., "page_size": ...,
                "support_sliding_window": 0}: create_paged_kv_cache's arguments in its order, each passed
               to the VM as a one-element ShapeTuple
    kv         {"num_layers", "num_kv_heads", "head_dim", "dtype"}: the layout of the cache's K/V, what
               `vm.builtin.attention_kv_cache_debug_get_kv` needs to read its state back
    target     the target the cache kernels were generated for

    prefill(ids: int32 (1, L), cache, *params) -> (logits float32 (1, L, vocab), cache)   every position
    decode(ids: int32 (1, 1), cache, *params)  -> (logits float32 (1, 1, vocab), cache)

`generate_tvm(n, target)` is the plain deployment loop over that contract: build, create the cache, add
sequence 0, then begin_forward / prefill / end_forward and n greedy decode steps the same way (n + 1 tokens).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import tvm
from transformers import LlamaConfig, LlamaForCausalLM
from tvm import relax as rx
from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.runtime import ShapeTuple
from tvm.target import Target

PROMPT_LEN = 14  # + 4 decode steps: positions 14..17 cross from the first page of 16 into the second
SEED = 0
CACHE = {"max_batch_size": 1, "max_total_seq_len": 128, "prefill_chunk_size": 64, "page_size": 16,
         "support_sliding_window": 0}
FUNCTIONS = {"create_cache": "create_paged_kv_cache", "prefill": "prefill", "decode": "decode"}


def config() -> LlamaConfig:
    return LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=128, rope_theta=10000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=None,
                       pad_token_id=0, attn_implementation="eager")


def rope_theta(cfg: LlamaConfig) -> float:
    """transformers 5 keeps rotary's base in `rope_parameters`, 4.x in `rope_theta`."""
    parameters = getattr(cfg, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def build(seq: int = PROMPT_LEN):
    """The transformers model (seeded random weights) and its prompt ids."""
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config()).eval()
    ids = torch.randint(1, model.config.vocab_size, (1, seq))
    return model, (ids,)


# ---- the same model in relax.frontend.nn (module paths = transformers' names) ----

class Attention(nn.Module):
    """GQA attention: q/k/v projections fused into one qkv for the paged cache, which applies rotary
    to q and k, appends k/v to its pages and attends over them."""

    def __init__(self, cfg: LlamaConfig, dtype: str):
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: Tensor, cache: PagedKVCache, layer_id: int):
        b, s, _ = x.shape
        qkv = op.concat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv = op.reshape(qkv, (b, s, self.heads + 2 * self.kv_heads, self.head_dim))
        out = cache.attention_with_fused_qkv(layer_id, qkv, self.heads, sm_scale=self.head_dim ** -0.5)
        return self.o_proj(op.reshape(out, (b, s, self.heads * self.head_dim)))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, dtype: str):
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: Tensor):
        return self.down_proj(op.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, dtype: str):
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.self_attn = Attention(cfg, dtype)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x: Tensor, cache: PagedKVCache, layer_id: int):
        x = x + self.self_attn(self.input_layernorm(x), cache, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, cfg: LlamaConfig, dtype: str):
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList([DecoderLayer(cfg, dtype) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)

    def forward(self, ids: Tensor, cache: PagedKVCache):
        x = self.embed_tokens(ids)
        for layer_id, layer in enumerate(self.layers):
            x = layer(x, cache, layer_id)
        return self.norm(x)


class NativeLlama(nn.Module):
    """transformers' LlamaForCausalLM in relax.frontend.nn, with MLC-LLM's entry points."""

    def __init__(self, cfg: LlamaConfig, target: Target, dtype: str = "float32"):
        self.model = Model(cfg, dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        self.cfg, self.target, self.dtype = cfg, target, dtype

    def prefill(self, ids: Tensor, cache: PagedKVCache):
        return self.lm_head(self.model(ids, cache)), cache

    def decode(self, ids: Tensor, cache: PagedKVCache):
        return self.lm_head(self.model(ids, cache)), cache

    def create_paged_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                              prefill_chunk_size: tirx.Var, page_size: tirx.Var,
                              support_sliding_window: tirx.Var) -> PagedKVCache:
        cfg, head_dim = self.cfg, self.cfg.hidden_size // self.cfg.num_attention_heads
        return TIRPagedKVCache(
            attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size, page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=rx.ShapeExpr([0, cfg.num_hidden_layers]),
            num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads, qk_head_dim=head_dim, v_head_dim=head_dim,
            mla_original_qk_head_dim=0, mla_original_v_head_dim=0, rope_mode=RopeMode.NORMAL, rope_scale=1,
            rope_theta=rope_theta(cfg),
            rope_scaling={}, rope_ext_factors=rx.prim_value(0), rotary_dim=head_dim,
            enable_disaggregation=False, dtype=self.dtype, target=self.target)

    def spec(self) -> nn.spec.ModuleSpec:
        cache = nn.spec.Object(object_type=PagedKVCache)
        plain = {"param_mode": "plain", "effect_mode": "none"}
        return nn.spec.ModuleSpec.from_raw({
            "prefill": {"ids": nn.spec.Tensor([1, "seq_len"], "int32"), "cache": cache, "$": plain},
            "decode": {"ids": nn.spec.Tensor([1, 1], "int32"), "cache": cache, "$": plain},
            "create_paged_kv_cache": {**{name: int for name in CACHE},
                                      "$": {"param_mode": "none", "effect_mode": "none"}},
        }, self)


def build_tvm(target: str = "llvm", dtype: str = "float32") -> dict:
    """The same model as build() in TVM, its weights copied from it by name (the contract above), in
    `dtype` (weights, activations and the cache's pages)."""
    model, (ids,) = build()
    torch_weights = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    native = NativeLlama(model.config, Target(target) if isinstance(target, str) else target, dtype)
    mod, named = native.export_tvm(spec=native.spec())
    params = []
    for name, param in named:
        if name not in torch_weights:
            raise KeyError(f"{name}: no transformers weight of that name")
        weight = torch_weights[name].astype(param.dtype)
        if tuple(weight.shape) != tuple(int(d) for d in param.shape):
            raise ValueError(f"{name}: transformers' weight is {weight.shape}, the Relax parameter {param.shape}")
        params.append((name, np.ascontiguousarray(weight)))
    cfg = model.config
    kv = {"num_layers": cfg.num_hidden_layers, "num_kv_heads": cfg.num_key_value_heads,
          "head_dim": cfg.hidden_size // cfg.num_attention_heads, "dtype": dtype, "rope_theta": rope_theta(cfg)}
    return {"mod": mod, "params": params, "prompt": ids.numpy().astype("int32"), "functions": dict(FUNCTIONS),
            "cache": dict(CACHE), "kv": kv, "target": target if isinstance(target, str) else str(target),
            "model_class": type(native).__name__}


def build_tvm_fp16(target: str = "llvm") -> dict:
    """build_tvm in float16 (`record examples/native_llama.py:build_tvm_fp16 --source tvm:T --generate N`)."""
    return build_tvm(target, "float16")


def build_tvm_bf16(target: str = "llvm") -> dict:
    """build_tvm in bfloat16."""
    return build_tvm(target, "bfloat16")


# ---- the deployment loop ----

class Generated(NamedTuple):
    tokens: list[int]  # the n + 1 greedy tokens
    logits: list[np.ndarray]  # the prefill's (L, vocab), then each decode step's (1, vocab)
    keys: np.ndarray  # the cache's state at the end, read back: (layers, positions, kv_heads, head_dim),
    values: np.ndarray  # keys after rotary, as transformers' cache holds them

def compile_tvm(native: dict):
    """`tvm.compile` the module for the target its cache kernels were made for."""
    return tvm.compile(native["mod"], target=native["target"])


def generate_tvm(n: int, target: str = "llvm", native: dict | None = None, executable=None, device=None):
    """Greedy generation as a deployment runs it: a prefill over the prompt, then n decode steps, each
    fed the token chosen before it (`record --generate n`'s steps). Returns the n + 1 chosen token ids
    (transformers' `generate(max_new_tokens=n + 1)` chooses the same), each step's logits and the
    cache's K/V at the end (the prompt and the n fed tokens)."""
    native = native if native is not None else build_tvm(target)
    executable = executable if executable is not None else compile_tvm(native)
    if device is None:
        kind = Target(native["target"]).kind.name
        device = tvm.cpu() if kind == "llvm" else tvm.device(kind, 0)
    vm = rx.VirtualMachine(executable, device)
    names = native["functions"]
    params = [tvm.runtime.tensor(value, device) for _, value in native["params"]]
    add_sequence = tvm.get_global_func("vm.builtin.kv_state_add_sequence")
    begin_forward = tvm.get_global_func("vm.builtin.kv_state_begin_forward")
    end_forward = tvm.get_global_func("vm.builtin.kv_state_end_forward")

    cache = vm[names["create_cache"]](*(ShapeTuple([value]) for value in native["cache"].values()))
    add_sequence(cache, 0)

    def step(func: str, ids: np.ndarray) -> np.ndarray:
        begin_forward(cache, ShapeTuple([0]), ShapeTuple([ids.shape[1]]), None)
        logits, _ = vm[names[func]](tvm.runtime.tensor(ids.astype("int32"), device), cache, *params)
        end_forward(cache)
        return logits.numpy()[0]

    logits = [step("prefill", native["prompt"])]
    tokens = [int(logits[-1][-1].argmax())]
    for _ in range(n):
        logits.append(step("decode", np.array([[tokens[-1]]], dtype="int32")))
        tokens.append(int(logits[-1][-1].argmax()))
    keys, values = read_cache(cache, native["kv"], native["prompt"].shape[1] + n, device)
    return Generated(tokens, logits, keys, values)


def read_cache(cache, kv: dict, length: int, device, seq_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The K/V of positions [0, length) of a sequence, every layer, read from the cache's pages."""
    shape = (kv["num_layers"], length, kv["num_kv_heads"], kv["head_dim"])
    keys, values = tvm.runtime.empty(shape, kv["dtype"], device), tvm.runtime.empty(shape, kv["dtype"], device)
    tvm.get_global_func("vm.builtin.attention_kv_cache_debug_get_kv")(cache, seq_id, 0, length, keys, values)
    return keys.numpy(), values.numpy()


def torch_generate(n: int) -> Generated:
    """transformers' greedy generation of build()'s model, shaped as generate_tvm's: n + 1 tokens, the
    prefill's logits at every position, each decode step's, and its cache's K/V at the end."""
    model, (ids,) = build()
    with torch.no_grad():
        prefill = model(ids).logits[0].numpy()
        out = model.generate(ids, do_sample=False, max_new_tokens=n + 1, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    cache = out["cache"] if "cache" in out else out["past_key_values"]  # `cache` since transformers 5.2x
    layers = cache.layers  # each (1, kv_heads, positions, head_dim)
    keys = np.stack([layer.keys[0].transpose(0, 1).numpy() for layer in layers])
    values = np.stack([layer.values[0].transpose(0, 1).numpy() for layer in layers])
    return Generated(out.sequences[0, ids.shape[1]:].tolist(), [prefill] + [step.numpy() for step in out.logits[1:]],
                     keys, values)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="the Relax Llama on TVM's paged KV cache vs transformers")
    parser.add_argument("steps", nargs="?", type=int, default=4, help="decode steps after the prefill")
    parser.add_argument("--target", default="llvm", help="TVM target (llvm, cuda)")
    parser.add_argument("--atol", type=float, default=2e-5, help="logits tolerance (absolute)")
    args = parser.parse_args(argv)
    expected, got = torch_generate(args.steps), generate_tvm(args.steps, args.target)
    logits = max(float(np.abs(a - b).max()) for a, b in zip(got.logits, expected.logits))
    cache = max(float(np.abs(got.keys - expected.keys).max()), float(np.abs(got.values - expected.values).max()))
    print(f"prefill of {PROMPT_LEN} positions + {args.steps} decode steps, greedy")
    print(f"transformers generate():  {expected.tokens}")
    print(f"TVM on {args.target}, paged cache: {got.tokens}")
    print(f"tokens {'equal' if got.tokens == expected.tokens else 'DIFFER'}; "
          f"logits of every step {'within' if logits <= args.atol else 'NOT within'} {args.atol:g} of transformers'; "
          f"the cache's K/V {'within' if cache <= args.atol else 'NOT within'} {args.atol:g} of transformers' cache")
    return 0 if got.tokens == expected.tokens and max(logits, cache) <= args.atol else 1


if __name__ == "__main__":
    raise SystemExit(main())
