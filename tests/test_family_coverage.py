"""benchmarks/family_coverage.py's cell (record a family in a dtype, bisect it on llvm) on one real cell, so the
benchmark behind docs/coverage.md's "Causal-LM families by dtype on llvm" cannot rot; that cell's trace is
where the suite checks that TVM 0.27 builds no bf16 layer_norm nor power on llvm, and that `fix` computes
them in float32 (docs/coverage.md's "bf16 on llvm")."""

from __future__ import annotations

import time

import torch

import tapml_dbg
from conftest import EXAMPLES, ROOT, load_benchmark, run_cli
from tapml_dbg.portable import load_function

coverage = load_benchmark("family_coverage", "tapml_family_coverage")


def test_every_family_and_dtype_has_its_build_function():
    for family in coverage.FAMILIES:
        for dtype, torch_dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            build = load_function(str(EXAMPLES / "family_lms.py"), f"build_{family}_{dtype}")
            assert build.__name__ == f"build_{family}_{dtype}"
    model, (ids,) = load_function(str(EXAMPLES / "family_lms.py"), "build_qwen3_fp16")()
    assert {p.dtype for p in model.parameters()} == {torch.float16} and ids.shape == (1, 6)


def test_a_bf16_gpt2_cell_names_tvms_layer_norm_that_does_not_build_and_fix_computes_it_in_float32(
        tmp_path, monkeypatch):
    """TVM 0.27's `layer_norm` does not build in bf16 on llvm: the cell names GPT-2's first layer norm. On
    the trace the cell recorded, `fix` computes GPT-2's three layer norms and gelu_new's `x ** 3` (relax
    power does not build in bf16 either) in float32, and the whole model then passes. The cell's two
    `tapml-dbg` commands (record, bisect --json) run forked from the suite's server (tests/fork_cli.py),
    as run_cli's do: the same commands, without two interpreters importing torch and TVM afresh."""
    def forked(*args: str):
        started = time.perf_counter()
        return run_cli(*args, cwd=str(ROOT)), time.perf_counter() - started

    monkeypatch.setattr(coverage, "cli", forked)
    cell = coverage.run_cell("gpt2", "bf16", 0, tmp_path)
    assert set(cell) == {"family", "dtype", "generate", "status", "ops", "op", "first_bad_token", "tokens", "error",
                         "record_s", "bisect_s"}
    assert (cell["status"], cell["error"], cell["first_bad_token"], cell["tokens"]) == ("diverged", "", None, None)
    op = cell["op"]
    assert (op["name"], op["op"], op["verdict"], op["layer"]) == (
        "native_layer_norm", "aten.native_layer_norm.default", "compile-error", "transformer.h.0.ln_1")
    assert op["message"] == "layer_norm: only support float32 and float16 for now"
    text = coverage.cell_text(cell)
    assert text.startswith(f"**#{op['index']} `native_layer_norm`** (`aten.native_layer_norm.default`")
    assert "compile-error: layer_norm: only support float32" in text
    table = coverage.render({("gpt2", "bf16", 0): cell}, [("gpt2", "bf16")], 2, "--families gpt2", 1.0)
    assert "`python benchmarks/family_coverage.py --families gpt2`" in table
    assert f"| gpt2 | bf16 | {text} |  |  |" in table
    with tapml_dbg.open(tmp_path / "gpt2_bf16.h5") as replay:  # the cell's trace
        found = replay.fix(tmp_path / "fix").to_json()  # what `tapml-dbg fix --json` prints
    assert found["output_passed"] is True and found["unfixed"] == [], found
    assert sorted(op["name"] for op in found["fixed"]) == ["native_layer_norm", "native_layer_norm_1",
                                                           "native_layer_norm_2", "pow_1"]
    assert all(op["kind"] == "float32" and "does not build it in bfloat16" in op["how"] for op in found["fixed"])
    assert all(op["before"]["status"] == "compile-error" for op in found["fixed"]), found["fixed"]
