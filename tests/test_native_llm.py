"""Native LLMs (`record FILE.py --source tvm:T --generate N`, docs/native-llm.md): examples/native_llama.py's
`build_tvm()` keeps the contract a recorder drives; a bad native LLM is refused in one line; TVM's
paged-KV cache module a recording builds is kept in the compile cache's kernel store, loaded by later
processes, built again when damaged.

That the example generates transformers' greedy tokens on llvm (5 distinct ones: a prefill and 4 decode
steps, the later ones reading across a page boundary), with every step's logits and the K/V in its pages
within 2e-5 of transformers' (absolute: stricter than allclose(rtol=1e-4, atol=2e-5); arrays of another
length would not be within it), is docs/native-llm.md's transcript of `python examples/native_llama.py`.

What a recording of examples/native_llama.py is, docs/native-llm.md's transcripts check byte for byte
(tests/test_transcripts.py), on one recording (`--source tvm:llvm --generate 2`) and the transformers one
of the same weights:
- the deployment: a prefill of 14 positions + 2 decode steps, source tvm:llvm, the logits bit-exact
  (`vs eager forward bit-exact`), the tokens 24 80 44, transformers' own (the example's script prints
  `generate()`'s);
- every attention call of every step an op with its state: six (REPL `ops`), each in its layer's
  self_attn, outputs (14, 4, 16) at the prefill and (1, 4, 16) later, the pages it leaves (14, 2, 16)
  at the prefill and (16, 2, 16) at step 2;
- a clean bisect: no divergence over the 198 ops, all 3 steps choose the source's token;
- a 5% fault in step 2's last call named at #174 lv3_step2, step 2 (decode), isolated;
- that call dumped fed the step-1 cache state (lv3_step1_keys/values, 15 positions), its one-file
  `--tvmscript-only` repro reproducing (exit 1), the same call dumped clean matching (exit 0);
- `diff` against the transformers recording: all 87 layer boundaries (29 layers x 3 steps) within
  the tolerance."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import EXAMPLES, ROOT, run_cli

from tapml_dbg.errors import ModelError
from tapml_dbg.frontend.native_llm import check_target, native_llm

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
    spec = importlib.util.spec_from_file_location("native_llama_example_llm", EXAMPLES / "native_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def native(example):
    """build_tvm("llvm")'s dict (tests that change it change a copy)."""
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


def test_a_bad_native_llm_gets_one_line(tmp_path):
    """Through the command line: the refusal is one `error:` line, no traceback (a dict without the
    cache's sizes and layout; every other mistake, at the stage that refuses it, in the test below)."""
    path = tmp_path / "bad_llm.py"
    path.write_text("def build_tvm(target='llvm'):\n"
                    "    return {'mod': None, 'params': [], 'prompt': [[1, 2]], 'functions': {}}\n")
    result = run_cli("record", str(path), "-o", str(tmp_path / "t.h5"), "--source", "tvm:llvm", "--generate", "1",
                     cwd=str(ROOT))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "the native LLM's dict lacks cache, kv" in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_every_mistake_in_a_native_llms_dict_is_refused_in_one_line(example, native):
    """What `record --source tvm:llvm` checks build_tvm()'s dict with before it compiles anything
    (record/native_llm.py's load_llm: native_llm, then check_target): each mistake a ModelError of one
    line, which the command line prints as its one `error:` line (the test above); one real build of the
    example for every mistake of the dict, and a real build for CUDA recorded on llvm."""
    where = "bad_llm.py"
    good = native
    check_target(native_llm(good, where), "llvm", where)  # the example itself passes
    mistakes = {
        "no decode function 'step'": dict(good, functions={**good["functions"], "decode": "step"}),
        "'kv' lacks 'rope_theta'": dict(good, kv={k: v for k, v in good["kv"].items() if k != "rope_theta"}),
        "cache['page_size'] is 0": dict(good, cache={**good["cache"], "page_size": 0}),
    }
    for expected, bad in mistakes.items():
        with pytest.raises(ModelError) as refused:
            check_target(native_llm(bad, where), "llvm", where)
        assert expected in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    for_cuda = native_llm(example.build_tvm("cuda"), where)
    with pytest.raises(ModelError) as refused:
        check_target(for_cuda, "llvm", where)
    message = str(refused.value)
    assert "generated its paged-KV kernels for cuda, not llvm" in message and "\n" not in message, message


def test_the_paged_kv_kernels_are_built_once_per_store_and_a_damaged_one_again(tmp_path, monkeypatch):
    """A session's workers (and later sessions) load the cache module a first process built and kept in the
    compile cache's kernel store: the same values; a damaged file is built again, not loaded."""
    import numpy as np
    import tvm

    from tapml_dbg.portable import paged_kv

    config = {"layer": 0, "num_qo_heads": 2, "num_kv_heads": 2, "head_dim": 8, "sm_scale": 8 ** -0.5,
              "rope_theta": 10000.0, "rope_scale": 1.0, "rotary_dim": 8, "page_size": 16, "dtype": "float32"}
    qkv = np.random.default_rng(0).standard_normal((3, 6, 8)).astype("float32")

    def call():
        paged_kv._kits.clear()  # a fresh process: nothing built in memory
        outputs = [tvm.runtime.empty(shape, "float32", tvm.cpu()) for shape in ((3, 2, 8), (3, 2, 8), (3, 2, 8))]
        tvm.get_global_func(paged_kv.ATTENTION_FUNC)(tvm.runtime.tensor(qkv), paged_kv.config_text(config), *outputs)
        return [output.numpy() for output in outputs]

    builds = []
    real_build = paged_kv._build
    monkeypatch.setattr(paged_kv, "_build", lambda *args: builds.append(1) or real_build(*args))
    paged_kv.register(tmp_path / "kernels")
    try:
        first = call()
        assert len(builds) == 1 and len(list((tmp_path / "kernels").glob("paged-kv-*.so"))) == 1
        again = call()
        assert len(builds) == 1 and all(np.array_equal(a, b) for a, b in zip(first, again))
        (library,) = (tmp_path / "kernels").glob("paged-kv-*.so")
        torn = library.with_suffix(".torn")
        torn.write_bytes(library.read_bytes()[:1000])
        torn.replace(library)  # a new file: the loaded library's pages stay mapped (truncated in place: SIGBUS)
        rebuilt = call()
        assert len(builds) == 2 and all(np.array_equal(a, b) for a, b in zip(first, rebuilt))
    finally:
        paged_kv._store.clear()
        paged_kv._kits.clear()
