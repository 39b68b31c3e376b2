"""examples/native_llama.py: the Llama written with relax.frontend.nn on TVM's paged KV cache (TIR
kernels on llvm); its `build_tvm()` contract (docs/native-llm.md) is what a recorder can drive: the
functions, the weights by name and order, the cache's sizes, and the logits of every prompt position
from `prefill`, of the one fed token from `decode`.

That it generates transformers' greedy tokens on llvm (5 distinct ones: a prefill and 4 decode steps,
the later ones reading across a page boundary), with every step's logits and the K/V in its pages
within 2e-5 of transformers' (absolute: stricter than allclose(rtol=1e-4, atol=2e-5); arrays of
another length would not be within it), is docs/native-llm.md's transcript of
`python examples/native_llama.py`, checked byte for byte by tests/test_transcripts.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import EXAMPLES

DECODE_STEPS = 4  # the example's script's default, as docs/native-llm.md runs it
GPU_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}  # the GPU kernels' float32 summation orders


def _has_cuda() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


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
def torch_run(example):
    """transformers' greedy generation of the same weights (`generate(max_new_tokens=DECODE_STEPS + 1)`)."""
    return example.torch_generate(DECODE_STEPS)


def test_build_tvm_contract(example, native):
    """What a recorder relies on: the named functions exist; the parameters are transformers' weights by
    name, in the order prefill/decode take them after (ids, cache); prefill returns the logits of
    every position it is fed, decode of its one token; the cache's sizes in create_paged_kv_cache's
    order, its pages of 16 filled past the first by the script's decode steps; the prompt is build()'s."""
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
    ids_length = mod[functions["prefill"]].params[0].ty.shape[1]
    logits = {func: mod[functions[func]].ret_ty.fields[0] for func in ("prefill", "decode")}
    assert logits["prefill"].shape[1].same_as(ids_length)  # every prompt position's logits, not the last only
    assert [int(logits["prefill"].shape[k]) for k in (0, 2)] == [1, 128]
    assert [int(n) for n in logits["decode"].shape] == [1, 1, 128]
    assert example.PROMPT_LEN < native["cache"]["page_size"] < example.PROMPT_LEN + DECODE_STEPS  # across pages
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
