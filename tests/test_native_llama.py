"""examples/native_llama.py: the Llama written with relax.frontend.nn on TVM's paged KV cache (TIR
kernels on llvm) generates transformers' greedy tokens, with the same logits at every step; its
`build_tvm()` contract (docs/native-llm.md) is what a recorder can drive."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from conftest import EXAMPLES

DECODE_STEPS = 4
LOGITS_TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}  # float32, another summation order: ~2e-7 seen on llvm


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
    """transformers' greedy generation of the same weights: its tokens, the prefill's logits at every
    position, each decode step's logits."""
    model, (ids,) = example.build()
    with torch.no_grad():
        prefill = model(ids).logits[0].numpy()
        out = model.generate(ids, do_sample=False, max_new_tokens=DECODE_STEPS + 1, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    return tokens, [prefill] + [step.numpy() for step in out.logits[1:]]


def test_greedy_tokens_equal_transformers_generate(tvm_run, torch_run):
    tokens, _ = tvm_run
    assert len(tokens) == DECODE_STEPS + 1
    assert len(set(tokens)) > 1  # a real generation, not one token repeated
    assert tokens == torch_run[0]


def test_logits_agree_with_transformers_at_every_step(tvm_run, torch_run):
    _, tvm_logits = tvm_run
    _, torch_logits = torch_run
    assert tvm_logits[0].shape == torch_logits[0].shape == (8, 128)  # prefill: every prompt position
    np.testing.assert_allclose(tvm_logits[0], torch_logits[0], **LOGITS_TOLERANCE)
    assert len(tvm_logits) == len(torch_logits) == DECODE_STEPS + 1
    for step in range(1, DECODE_STEPS + 1):  # decode: the paged decode kernel over the cached pages
        assert tvm_logits[step].shape == torch_logits[step].shape == (1, 128)
        np.testing.assert_allclose(tvm_logits[step], torch_logits[step], **LOGITS_TOLERANCE)


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
    assert native["target"] == "llvm"
