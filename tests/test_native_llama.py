"""examples/native_llama.py: the Llama written with relax.frontend.nn on TVM's paged KV cache (TIR
kernels on llvm) generates transformers' greedy tokens, with the same logits at every step and the
same K/V in its pages as transformers' cache; its `build_tvm()` contract (docs/native-llm.md) is what
a recorder can drive."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import EXAMPLES

DECODE_STEPS = 4
GPU_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}  # the GPU kernels' float32 summation orders


def _has_cuda() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:
        return False
TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}  # float32, another summation order: ~2e-7 seen on llvm


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("native_llama_example", EXAMPLES / "native_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def native(example):
    return example.build_tvm("llvm")


@pytest.fixture(scope="module")
def tvm_run(example, native):
    """The module compiled once for llvm, a prefill and DECODE_STEPS decode steps on the paged cache."""
    return example.generate_tvm(DECODE_STEPS, native=native, executable=example.compile_tvm(native))


@pytest.fixture(scope="module")
def torch_run(example):
    """transformers' greedy generation of the same weights (`generate(max_new_tokens=DECODE_STEPS + 1)`)."""
    return example.torch_generate(DECODE_STEPS)


def test_greedy_tokens_equal_transformers_generate(tvm_run, torch_run):
    assert len(tvm_run.tokens) == DECODE_STEPS + 1
    assert len(set(tvm_run.tokens)) > 1  # a real generation, not one token repeated
    assert tvm_run.tokens == torch_run.tokens


def test_logits_agree_with_transformers_at_every_step(example, tvm_run, torch_run):
    prompt = example.PROMPT_LEN
    assert tvm_run.logits[0].shape == torch_run.logits[0].shape == (prompt, 128)  # prefill: every position
    np.testing.assert_allclose(tvm_run.logits[0], torch_run.logits[0], **TOLERANCE)
    assert len(tvm_run.logits) == len(torch_run.logits) == DECODE_STEPS + 1
    assert prompt < example.CACHE["page_size"] < prompt + DECODE_STEPS  # the later steps read across a page boundary
    for step in range(1, DECODE_STEPS + 1):  # decode: the paged decode kernel over the cached pages
        assert tvm_run.logits[step].shape == torch_run.logits[step].shape == (1, 128)
        np.testing.assert_allclose(tvm_run.logits[step], torch_run.logits[step], **TOLERANCE)


def test_the_paged_cache_holds_transformers_keys_and_values(example, tvm_run, torch_run):
    """The pages read back (`attention_kv_cache_debug_get_kv`): the prompt and every fed token, keys
    after rotary, as transformers' own cache holds them: the state a recorder records."""
    assert tvm_run.keys.shape == torch_run.keys.shape == (2, example.PROMPT_LEN + DECODE_STEPS, 2, 16)
    np.testing.assert_allclose(tvm_run.keys, torch_run.keys, **TOLERANCE)
    np.testing.assert_allclose(tvm_run.values, torch_run.values, **TOLERANCE)


def test_build_tvm_contract(example, native):
    """What a recorder relies on: the named functions exist; the parameters are transformers' weights by
    name, in the order prefill/decode take them after (ids, cache); the cache's sizes in
    create_paged_kv_cache's order; the prompt is build()'s."""
    mod, functions = native["mod"], native["functions"]
    assert functions == {"create_cache": "create_paged_kv_cache", "prefill": "prefill", "decode": "decode"}
    model, (ids,) = example.build()
    weights = model.state_dict()
    names = [name for name, _ in native["params"]]
    assert sorted(names) == sorted(weights)
    for name, value in native["params"]:
        np.testing.assert_array_equal(value, weights[name].numpy())
    for func in ("prefill", "decode"):
        params = mod[functions[func]].params
        assert [p.name for p in params[:2]] == ["ids", "cache"]
        assert [p.name for p in params[2:]] == names  # the Relax parameters carry the same names
    create = mod[functions["create_cache"]].params
    assert [p.name for p in create] == list(native["cache"])
    assert native["prompt"].dtype == np.int32 and native["prompt"].tolist() == ids.tolist()
    assert native["kv"] == {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "dtype": "float32",
                            "rope_theta": 10000.0}
    assert native["target"] == "llvm" and native["model_class"] == "NativeLlama"


@pytest.mark.skipif(not _has_cuda(), reason="no CUDA GPU on this machine")
def test_greedy_tokens_and_logits_on_cuda(example, torch_run):
    """The same on CUDA: build_tvm("cuda") puts the cache's GPU kernels in the module."""
    run = example.generate_tvm(DECODE_STEPS, "cuda")
    assert run.tokens == torch_run.tokens
    for got, expected in zip(run.logits, torch_run.logits):
        np.testing.assert_allclose(got, expected, **GPU_TOLERANCE)
    np.testing.assert_allclose(run.keys, torch_run.keys, **GPU_TOLERANCE)
    np.testing.assert_allclose(run.values, torch_run.values, **GPU_TOLERANCE)
