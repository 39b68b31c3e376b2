"""`record examples/native_llama.py --source tvm:llvm --generate N`: the Relax Llama on TVM's paged KV
cache recorded call by call, every step; bisect names a planted fault at its (step, call); a paged-KV
call dumps as a standalone repro fed its recorded cache state; `diff` meets the transformers
recording of the same weights at every layer boundary; bad native LLMs fail with one line.

docs/native-llm.md's transcripts check the rest, byte for byte: the recording's steps, source, tokens
(24 80 44, transformers' own: the example's script prints them) and bit-exact logits, and the 5% fault
in step 2's last attention call named at #174 lv3_step2, step 2 (decode), isolated."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import EXAMPLES, ROOT, fault_transform, run_cli

from tapml_dbg.errors import ModelError
from tapml_dbg.frontend.native_llm import check_target, native_llm

STEPS = 2
PAGED = "vm.builtin.attention_kv_cache_attention_with_fused_qkv"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("native_llama_example_llm", EXAMPLES / "native_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def native_trace(traces):
    return traces.get("native_llama", "--source", "tvm:llvm", "--generate", str(STEPS))


@pytest.fixture(scope="module")
def ops(native_trace):
    result = run_cli("info", str(native_trace), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _info(trace) -> dict:
    result = run_cli("info", str(trace), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _attention(ops: dict, step: int, nth: int = 0) -> dict:
    calls = [op for op in ops["ops"] if op["op"] == PAGED and op.get("step") == step]
    return calls[nth]


def _bisect(trace, *extra) -> dict:
    result = run_cli("bisect", str(trace), "--json", *extra)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_the_recording_is_the_deployment_bit_for_bit_with_transformers_tokens(native_trace, example):
    info = _info(native_trace)
    steps = info["generation"]["steps"]
    assert [step["step"] for step in steps] == list(range(STEPS + 1))
    assert [step["kind"] for step in steps] == ["prefill"] + ["decode"] * STEPS
    assert [step["token"] for step in steps] == example.torch_generate(STEPS).tokens
    assert info["source"] == "tvm:llvm"
    assert info["eager_output_max_abs_diff"] == 0.0  # op by op == the module's own prefill/decode run


def test_every_attention_call_of_every_step_is_an_op_with_its_state(ops):
    calls = [op for op in ops["ops"] if op["op"] == PAGED]
    assert len(calls) == 2 * (STEPS + 1)  # two layers, every step
    first, later = _attention(ops, 0), _attention(ops, 2, 1)
    assert (first["layer"], later["layer"]) == ("model.layers.0.self_attn", "model.layers.1.self_attn")
    prompt = 14
    assert [tuple(out["shape"]) for out in first["outputs"]] == [(prompt, 4, 16), (prompt, 2, 16), (prompt, 2, 16)]
    assert [tuple(out["shape"]) for out in later["outputs"]] == [(1, 4, 16), (prompt + 2, 2, 16), (prompt + 2, 2, 16)]


def test_a_clean_native_generation_bisects_clean(native_trace, ops):
    report = _bisect(native_trace)
    assert report["diverged"] is False and report["ops"] == len(ops["ops"])
    assert report["first_bad_token"] is None
    assert [step["verdict"] for step in report["tokens"]["steps"]] == ["same"] * (STEPS + 1)


def test_a_fault_in_one_attention_call_is_named_at_its_step_and_call(native_trace, ops, tmp_path):
    """The prefill's first call (lv_step0); a decode step's (step 2's last, lv3_step2 #174) is
    docs/native-llm.md's transcript of `bisect`."""
    step, nth = 0, 0
    call = _attention(ops, step, nth)
    transform = fault_transform(tmp_path, "scale", call["name"], scale="1.05")
    report = _bisect(native_trace, "--transform", transform)
    culprit = report["op"]
    assert (culprit["name"], culprit["step"], culprit["op"]) == (call["name"], step, PAGED)
    assert culprit["verdict"] == "isolated"  # fed its recorded cache state, the call alone is wrong


def test_a_paged_attention_call_dumps_as_a_repro_fed_its_recorded_cache(native_trace, ops, tmp_path):
    call = _attention(ops, 2, 1)
    transform = fault_transform(tmp_path, "scale", call["name"], scale="1.05")
    out = tmp_path / "repro"
    result = run_cli("dump", str(native_trace), "--op", str(call["index"]), "-o", str(out), "--transform", transform)
    assert result.returncode == 0, result.stderr
    inputs = json.loads((out / "meta.json").read_text())["ops"][0]["inputs"]
    assert [item["name"].rpartition("_")[2] for item in inputs[1:]] == ["keys", "values"]  # step 1's cache state
    assert inputs[1]["shape"] == [14 + 1, 2, 16]
    import subprocess
    import sys

    reproduced = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True, text=True, cwd=tmp_path)
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr  # exit 1: reproduced
    script = subprocess.run([sys.executable, str(out / "repro.py"), "--tvmscript-only"], capture_output=True, text=True)
    assert script.returncode == 0, script.stderr
    (tmp_path / "standalone.py").write_text(script.stdout)  # one file: the paged-KV function inlined in it
    alone = subprocess.run([sys.executable, str(tmp_path / "standalone.py")], capture_output=True, text=True,
                           cwd=tmp_path)
    assert alone.returncode == 1 and "REPRODUCED" in alone.stdout, alone.stdout + alone.stderr
    clean = tmp_path / "clean"
    assert run_cli("dump", str(native_trace), "--op", str(call["index"]), "-o", str(clean)).returncode == 0
    passed = subprocess.run([sys.executable, str(clean / "repro.py")], capture_output=True, text=True, cwd=tmp_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_diff_meets_the_transformers_recording_at_every_layer_boundary(native_trace, traces):
    torch_trace = traces.get("native_llama", "--generate", str(STEPS))
    result = run_cli("diff", str(torch_trace), str(native_trace), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    layers = {(row["layer"], row["step"]): row["status"] for row in report["layers"]}
    for step in range(STEPS + 1):
        for layer in ("model.layers.0", "model.layers.1", "model.norm", "lm_head", "model.layers.0.self_attn",
                      "model.layers.1.mlp"):
            assert layers[(layer, step)] in ("identical", "close"), (layer, step)
    assert report["first_layer_difference"] is None


def _bad_llm(tmp_path, body: str) -> str:
    path = tmp_path / "bad_llm.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nimport native_llama\n\n"
                    f"def build_tvm(target='llvm'):\n    native = native_llama.build_tvm(target)\n{body}\n"
                    "    return native\n")
    return str(path)


def test_a_bad_native_llm_gets_one_line(tmp_path):
    """Through the command line: the refusal is one `error:` line, no traceback."""
    body = "    native['functions']['decode'] = 'step'\n"
    result = run_cli("record", _bad_llm(tmp_path, body), "-o", str(tmp_path / "t.h5"), "--source", "tvm:llvm",
                     "--generate", "1", cwd=str(ROOT))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "no decode function 'step'" in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_every_mistake_in_a_native_llms_dict_is_refused_in_one_line(example):
    """What `record --source tvm:llvm` checks build_tvm()'s dict with before it compiles anything
    (record/native_llm.py's load_llm: native_llm, then check_target): each mistake a ModelError of one
    line, which the command line prints as its one `error:` line (the test above); one real build of the
    example for every mistake of the dict, and a real build for CUDA recorded on llvm."""
    where = "bad_llm.py"
    good = example.build_tvm("llvm")
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
