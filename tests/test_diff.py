"""`tapml-dbg diff TRACE_A TRACE_B`: two recordings of one model compared op by op and layer by layer.

Real recordings: examples/mlp.py on torch and on tvm:llvm, in float32 and bfloat16, examples/family_lms.py's
wide Llama in float32 and bfloat16, examples/native_mlp.py, a generation trace; a planted difference is a
copy of a trace whose ops from one on are scaled (as a kernel that is 1% off there would leave them),
written with the trace writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tapml_dbg
from conftest import EXAMPLES, run_cli
from tapml_dbg.engine.diff import DiffStatus, DiffTolerance, diff_traces, layer_boundaries
from tapml_dbg.errors import TraceError, UsageError
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.writer import TraceWriter

PLANTED_AT = 13  # gelu_1, the first op of examples/mlp.py's blocks.1 after its fc
FACTOR = 1.01  # a 1% error, 100x the float32 tolerance (1e-4)
BF16_MLP = f"""import sys, torch
sys.path.insert(0, {str(EXAMPLES)!r})
import mlp

def build():  # examples/mlp.py in bfloat16: the same graph, so the same op names
    model, (x,) = mlp.build()
    return model.to(torch.bfloat16), (x.to(torch.bfloat16),)
"""


def copy_trace(source: Path, target: Path, scale_from: int | None = None, factor: float = FACTOR,
               rename=lambda name: name, leave_out: frozenset[int] = frozenset(), relayer=lambda layer: layer) -> Path:
    """`source` written again as `target`: float outputs of ops `scale_from` and after multiplied by
    `factor`, op names through `rename` and layers through `relayer`, the ops in `leave_out` not written
    (the trace then incomplete)."""
    with TraceReader(source) as reader:
        ops = [{**op, "name": rename(op["name"]), "inputs": [rename(name) for name in op["inputs"]],
                "layer": relayer(op.get("layer", ""))} for op in reader.outline.ops]
        writer = TraceWriter(target, meta=reader.meta, graph_json=reader.outline.graph_json, tvmscript=reader.outline.tvmscript,
                             ops=ops, inputs={n: reader.tensors.input(n) for n in reader.outline.input_names},
                             params={n: reader.tensors.param(n) for n in reader.outline.param_names},
                             source_graph=reader.outline.source_graph_json)
        for index in range(len(ops)):
            if index in leave_out:
                continue
            outputs = reader.tensors.op_outputs(index)
            if scale_from is not None and index >= scale_from:
                with np.errstate(over="ignore"):  # a mask's float32 minimum becomes -inf: unchanged as a mask
                        outputs = [(value * factor).astype(value.dtype) if value.dtype.kind == "f" else value
                               for value in outputs]
            writer.write_op(index, outputs)
        writer.close(complete=not leave_out)
    return target


def diff_json(a: Path, b: Path, *options: str) -> dict:
    done = run_cli("diff", str(a), str(b), "--json", *options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def planted(traces, tmp_path_factory) -> Path:
    return copy_trace(traces.get("mlp"), tmp_path_factory.mktemp("diff") / "planted.h5", scale_from=PLANTED_AT)


# ------------------------------------------------------------------ one model, two sources
def test_torch_and_tvm_llvm_recordings_pair_every_op_and_agree_within_float32_noise(traces):
    torch_trace, tvm_trace = traces.get("mlp"), traces.get("mlp", "--source", "tvm:llvm")
    found = diff_json(torch_trace, tvm_trace)
    assert (found["a"]["source"], found["b"]["source"]) == ("torch", "tvm:llvm")
    assert found["keyed_by"] == "name" and found["matched"] == 26
    assert found["only_in_a"] == {"count": 0, "names": []} and found["only_in_b"] == {"count": 0, "names": []}
    assert found["first_difference"] is None and found["first_layer_difference"] is None and not found["differs"]
    counts = found["counts"]
    assert counts["differs"] == counts["shape differs"] == counts["not compared"] == 0
    identical = {op["name"] for op in found["ops"] if op["status"] == "identical"}
    assert {"permute", "permute_1", "permute_2", "permute_3", "permute_4"} <= identical  # a weight's transpose: a move
    close = [op for op in found["ops"] if op["status"] == "close"]
    assert close and counts["close"] == len(close) == 26 - counts["identical"]
    rels = [op["metrics"]["scale_rel_err"] for op in close]
    assert 0 < max(rels) < 1e-5  # reduction-order noise, far under float32's 1e-4
    assert all(op["tolerance"] == {"rtol": 1e-4, "atol": 1e-6} and op["precision"] == "float32" and op["cast"] is None
               for op in close)
    # every layer, at its last op, in the order the model reaches it; a layer ends where its last nested op does
    layers = [(row["layer"], row["a"]["name"]) for row in found["layers"]]
    assert layers == [("proj", "addmm"), ("blocks.0.norm", "native_layer_norm"), ("blocks.0.fc", "addmm_1"),
                      ("blocks.0", "add"), ("blocks.1.norm", "native_layer_norm_1"), ("blocks.1.fc", "addmm_2"),
                      ("blocks.1", "add_1"), ("blocks.2.norm", "native_layer_norm_2"), ("blocks.2.fc", "addmm_3"),
                      ("blocks.2", "add_2"), ("blocks", "add_2"), ("head", "addmm_4")]
    assert all(row["status"] == "close" and row["b"] == row["a"] for row in found["layers"])


def test_the_json_shape(traces, planted):
    found = diff_json(traces.get("mlp"), planted)
    assert set(found) == {"a", "b", "keyed_by", "tolerance", "selected", "matched", "only_in_a", "only_in_b", "counts",
                          "differs", "first_difference", "first_layer_difference", "ops", "layers",
                          "layers_unmatched", "seconds"}
    assert set(found["a"]) == {"path", "source", "model", "ops", "steps"}
    assert set(found["counts"]) == {str(status) for status in DiffStatus}
    assert found["tolerance"]["rule"] == "by dtype"
    assert found["tolerance"]["by_dtype"]["bfloat16"] == {"rtol": 4e-2, "atol": 1e-2}
    op_keys = {"name", "step", "op", "b_op", "layer", "a", "b", "status", "a_outputs", "b_outputs", "output", "cast",
               "tolerance", "precision", "metrics", "note"}
    assert all(set(op) == op_keys for op in found["ops"])
    assert set(found["first_difference"]) == op_keys
    assert found["ops"][0]["a_outputs"] == ["float32[16, 32]"] and found["ops"][0]["metrics"]["max_abs_err"] == 0
    layer_keys = op_keys - {"name", "op", "b_op"} | {"layer"}
    assert all(set(row) == layer_keys for row in found["layers"])


# ------------------------------------------------------------------ a planted difference
def test_a_difference_planted_at_one_op_is_the_first_difference_and_its_layer_the_first_that_parts(traces, planted):
    found = diff_json(traces.get("mlp"), planted)
    first = found["first_difference"]
    assert (first["a"], first["name"], first["op"], first["layer"]) == (PLANTED_AT, "gelu_1", "aten.gelu.default",
                                                                        "blocks.1")
    assert first["status"] == "differs" and first["metrics"]["scale_rel_err"] == pytest.approx(FACTOR - 1, rel=1e-3)
    assert found["counts"]["identical"] == PLANTED_AT and found["counts"]["differs"] == 26 - PLANTED_AT
    assert [op["status"] for op in found["ops"][:PLANTED_AT]] == ["identical"] * PLANTED_AT
    statuses = {row["layer"]: row["status"] for row in found["layers"]}
    assert statuses["blocks.0"] == statuses["blocks.1.fc"] == "identical"  # parted after blocks.1.fc's last op
    assert statuses["blocks.1"] == statuses["blocks.2"] == statuses["head"] == "differs"
    assert found["first_layer_difference"]["layer"] == "blocks.1"
    assert found["first_layer_difference"]["a"] == {"index": 14, "name": "add_1"}

    shown = run_cli("diff", str(traces.get("mlp")), str(planted))
    assert shown.returncode == 0, shown.stderr
    assert "first difference: #13 gelu_1 (aten.gelu.default) in layer blocks.1: differs: max_abs=" in shown.stdout
    assert "13 op(s) differ: #13 gelu_1, #14 add_1," in shown.stdout
    assert "first layer that differs: blocks.1" in shown.stdout
    assert "13 identical, 0 close, 13 differs" in shown.stdout


def test_rtol_sets_one_tolerance_and_ops_narrows_the_comparison(traces, planted):
    loose = diff_json(traces.get("mlp"), planted, "--rtol", "0.02")
    assert loose["first_difference"] is None and loose["counts"]["close"] == 26 - PLANTED_AT
    assert loose["tolerance"] == {"rule": "fixed", "rtol": 0.02, "atol": 0.0}
    tight = diff_json(traces.get("mlp"), planted, "--rtol", "0.005", "--atol", "1e-3")
    assert tight["first_difference"]["name"] == "gelu_1"
    assert tight["first_difference"]["tolerance"] == {"rtol": 0.005, "atol": 1e-3}
    narrowed = diff_json(traces.get("mlp"), planted, "--ops", "blocks.2")
    assert narrowed["selected"] == "blocks.2" and narrowed["matched"] == 6
    assert narrowed["first_difference"]["name"] == "native_layer_norm_2"
    # the layers whose last op is among them: `blocks` ends where blocks.2 does
    assert [row["layer"] for row in narrowed["layers"]] == ["blocks.2.norm", "blocks.2.fc", "blocks.2", "blocks"]


def test_an_op_one_recording_lacks_is_not_compared_and_said(traces, tmp_path):
    cut = copy_trace(traces.get("mlp"), tmp_path / "cut.h5", leave_out=frozenset({20, 21}))
    result = tapml_dbg.diff(traces.get("mlp"), cut)
    missing = [op for op in result.ops if op.status == DiffStatus.NOT_COMPARED]
    assert [op.name for op in missing] == ["add_2", "permute_4"]
    assert "no values in B: op 20 (add_2) has no recorded values" in missing[0].compared.note
    assert result.first_difference is None and result.counts()["identical"] == 24
    assert {row.layer: row.status for row in result.layers}["blocks.2"] == DiffStatus.NOT_COMPARED


# ------------------------------------------------------------------ float32 vs bfloat16
@pytest.fixture(scope="module")
def bf16_mlp(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bf16")
    (folder / "mlp_bf16.py").write_text(BF16_MLP)
    done = run_cli("record", str(folder / "mlp_bf16.py"), "-o", str(folder / "mlp_bf16.h5"))
    assert done.returncode == 0, done.stderr
    return folder / "mlp_bf16.h5"


def test_float32_and_bfloat16_recordings_pair_by_name_and_are_compared_in_float64(traces, bf16_mlp):
    found = diff_json(traces.get("mlp"), bf16_mlp)
    assert found["matched"] == 26 and found["only_in_a"]["count"] == found["only_in_b"]["count"] == 0
    assert all(op["cast"] == "float32 vs bfloat16" for op in found["ops"])
    assert found["ops"][1]["a_outputs"] == ["float32[4, 32]"] and found["ops"][1]["b_outputs"] == ["bfloat16[4, 32]"]
    rels = [op["metrics"]["scale_rel_err"] for op in found["ops"]]
    assert 1e-3 < max(rels) < 4e-2  # bf16's rounding, under bf16's tolerance: no difference by default
    assert all(op["tolerance"] == {"rtol": 4e-2, "atol": 1e-2} and op["precision"] == "bfloat16" for op in found["ops"])
    assert not found["differs"] and all(row["status"] == "close" for row in found["layers"])
    strict = diff_json(traces.get("mlp"), bf16_mlp, "--rtol", "1e-4")  # float32's rule: bf16 fails at once
    assert strict["first_difference"]["a"] == 0 and strict["first_layer_difference"]["layer"] == "proj"
    shown = run_cli("diff", str(traces.get("mlp")), str(bf16_mlp))
    assert "dtypes differ (float32 vs bfloat16) at 26 op(s): compared in float64" in shown.stdout


def test_a_bfloat16_llms_float32_islands_are_judged_at_bfloat16_as_they_are_computed_from_it(traces):
    """A bf16 Llama computes RoPE and its norms' upcasts in float32 from bf16 values: held to float32's rule
    they would differ from the float32 model's by bf16's rounding, a false alarm."""
    # examples/family_lms.py's Llama with a 2048-wide MLP; the bf16 trace is tests/test_bf16.py's (once a run)
    fp32, bf16 = (traces.record(f"{EXAMPLES / 'family_lms.py'}:build_llama_wide_{dtype}",
                                name=f"{dtype}_llama_wide")[0] for dtype in ("fp32", "bf16"))
    found = diff_json(fp32, bf16)
    assert found["matched"] == found["a"]["ops"] and found["only_in_a"]["count"] == 0
    assert found["only_in_b"]["count"] > 0 and all(name.startswith("_to_copy") for name in found["only_in_b"]["names"])
    assert not found["differs"], found["first_difference"]
    islands = [op for op in found["ops"] if op["cast"] is None and op["a_outputs"][0].startswith("float32")
               and op["precision"] == "bfloat16"]
    assert {"cos", "sin", "rsqrt"} <= {op["op"].split(".")[1] for op in islands}  # RoPE and RMSNorm in float32
    assert max(op["metrics"]["scale_rel_err"] for op in islands) > 1e-4  # past float32's rtol, within bfloat16's
    assert all(op["status"] == "close" for op in islands)


# ------------------------------------------------------------------ TVM-native and generation traces
def test_a_tvm_native_model_diffs_against_its_planted_copy_and_not_with_another_model(traces, tmp_path):
    native = traces.get("native_mlp", "--source", "tvm:llvm")
    copy = copy_trace(native, tmp_path / "native.h5", scale_from=7)  # rms_norm1: blocks.1's first op
    result = diff_traces(native, copy)
    assert result.first_difference.name == "rms_norm1" and result.first_difference.op == "relax.nn.rms_norm"
    assert result.first_layer_difference.layer == "blocks.1.norm"
    assert [row.layer for row in result.layers if row.status == DiffStatus.IDENTICAL][-1] == "blocks.0"
    # another model shares an op name by chance: the pair is said to be other operators of other shapes
    other = diff_traces(native, traces.get("mlp"))
    assert [op.name for op in other.ops] == ["add"] and other.ops[0].status == DiffStatus.SHAPE
    assert (other.ops[0].op, other.ops[0].b_op) == ("relax.add", "aten.add.Tensor")
    assert len(other.only_in_a) == 18 and len(other.only_in_b) == 25


def test_generation_traces_pair_by_name_and_step(traces, tmp_path):
    trace = traces.get("plain_qwen2", "--generate", "3")
    with TraceReader(trace) as reader:
        step_two = next(op["index"] for op in reader.outline.ops if op["step"] == 2)
    copy = copy_trace(trace, tmp_path / "gen.h5", scale_from=step_two)
    result = diff_traces(trace, copy)
    assert result.by_step and not result.only_in_a and not result.only_in_b
    # step 2 opens with integer ops and masks (unchanged by the scale): its first float value parts
    assert result.first_difference.step == 2 and result.first_difference.name == "embedding_2_p2"
    assert {op.status for op in result.ops if op.a < step_two} == {DiffStatus.IDENTICAL}
    assert result.first_layer_difference.step == 2
    assert {row.status for row in result.layers if row.step in (0, 1)} == {DiffStatus.IDENTICAL}
    assert {row.step for row in result.layers} == {0, 1, 2, 3}
    assert result.to_json()["keyed_by"] == "name and step"


def test_layer_boundaries_nest_and_split_by_step():
    ops = [{"index": 0, "name": "a", "layer": "m.l0.attn", "step": 0}, {"index": 1, "name": "b", "layer": "m.l0", "step": 0},
           {"index": 2, "name": "c", "layer": "m.l1.mlp", "step": 0}, {"index": 3, "name": "d", "layer": "m.l0.attn", "step": 1},
           {"index": 4, "name": "e", "layer": "", "step": 1}]
    assert layer_boundaries(ops, by_step=True) == {("m", 0): 2, ("m.l0", 0): 1, ("m.l0.attn", 0): 0, ("m.l1", 0): 2,
                                                   ("m.l1.mlp", 0): 2, ("m", 1): 3, ("m.l0", 1): 3, ("m.l0.attn", 1): 3}
    assert layer_boundaries(ops, by_step=False)[("m.l0.attn", None)] == 3


# ------------------------------------------------------------------ bad input: one line
def test_bad_input_is_one_line(traces, tmp_path):
    mlp = str(traces.get("mlp"))
    not_a_trace = tmp_path / "notes.h5"
    not_a_trace.write_text("not a trace")
    renamed = copy_trace(traces.get("mlp"), tmp_path / "renamed.h5", rename=lambda name: f"other_{name}",
                         relayer=lambda layer: f"other.{layer}")  # another model: no op name, no layer in common
    cases = [((mlp, str(tmp_path / "missing.h5")), "does not exist; check the path"),
             ((str(not_a_trace), mlp), "is not a tapml trace (not an HDF5 file)"),
             ((mlp, str(renamed)), "share no op name and no layer: diff pairs ops by name"),
             ((mlp, mlp, "--atol", "1e-3"), "--atol goes with --rtol"),
             ((mlp, mlp, "--rtol", "-1"), "--rtol must be a number >= 0"),
             ((mlp, mlp, "--ops", "blocks.9"), "no op or layer named 'blocks.9'")]
    for args, message in cases:
        done = run_cli("diff", *args)
        assert done.returncode == 1 and done.stdout == "", (args, done.stdout)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, done.stderr)
    with pytest.raises(TraceError):
        tapml_dbg.diff(mlp, tmp_path / "missing.h5")
    with pytest.raises(UsageError):
        diff_traces(mlp, renamed)


def test_the_api_answers_what_the_cli_prints(traces, planted):
    result = tapml_dbg.diff(traces.get("mlp"), planted, rtol=0.005)
    printed = diff_json(traces.get("mlp"), planted, "--rtol", "0.005")
    mine = json.loads(json.dumps(result.to_json()))
    for found in (mine, printed):
        found.pop("seconds")
    assert mine == printed
    assert result.tolerance == DiffTolerance(rtol=0.005)
    assert np.isclose(result.first_difference.compared.metrics.scale_rel_err, FACTOR - 1, rtol=1e-3)
