"""The recorder: provenance, exactness against the model's own output, the info command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import EXAMPLES, run_cli
from tapml_dbg.frontend.importer import export_program, import_program
from tapml_dbg.frontend.model_loader import load_model
from tapml_dbg.model.serialize import function_from_json
from tapml_dbg.record.recorder import DEFAULT_SEED, record
from tapml_dbg.engine.session import Session
from tapml_dbg.trace import TraceReader


def _bindings(func) -> int:
    return sum(len(block.bindings) for block in func.body.blocks)


@pytest.mark.parametrize("example", ["mlp", "tiny_gpt2"])
def test_final_op_equals_model_output_bit_for_bit(traces, example):
    """The suite's shared recording (`tapml-dbg record EXAMPLE`, the default seed): its last op is the
    model's own output bit for bit, its inputs are those the seed gives (a recording with the same
    seed records the same inputs), and `record` counts the ops it stored."""
    spec = str(EXAMPLES / f"{example}.py")
    path, printed = traces.record(spec, name=example)
    torch.manual_seed(DEFAULT_SEED)
    np.random.seed(DEFAULT_SEED)
    module, inputs = load_model(spec)
    with torch.no_grad():
        expected = module(*inputs).numpy()
    with TraceReader(path) as reader:
        assert reader.complete and reader.meta["seed"] == DEFAULT_SEED
        last = reader.outline.ops[-1]
        assert last["name"] == "output"
        (recorded,) = reader.tensors.op_outputs(last["index"])
        assert recorded.dtype == expected.dtype
        assert np.array_equal(recorded, expected), "the last op must be the model's own output, bit for bit"
        assert np.array_equal(reader.tensors.input(reader.outline.input_names[0]), inputs[0].numpy())
        assert printed.startswith(f"recorded {len(reader.recorded.finished_ops())} ops to {path} ")


def test_op_count_equals_relax_bindings_and_layers(traces):
    spec = str(EXAMPLES / "mlp.py")
    module, inputs = load_model(spec)
    graph, _ = import_program(export_program(module, inputs))
    with TraceReader(traces.get("mlp")) as reader:
        ops = reader.outline.ops
        stored_main = function_from_json(json.loads(reader.outline.graph_json))
    assert len(ops) == _bindings(graph.mod["main"]) == _bindings(stored_main)
    layers = {op["layer"] for op in ops}
    assert {"proj", "blocks.0.fc", "blocks.0.norm", "blocks.2.fc", "head"} <= layers
    fc = [op for op in ops if op["layer"] == "blocks.1.fc"]
    assert fc and all(op["op"].startswith("aten.") for op in fc)
    gelu = [op for op in ops if op["op"] == "aten.gelu.default"]
    assert [op["layer"] for op in gelu] == ["blocks.0", "blocks.1", "blocks.2"]


def test_info_json_of_tiny_gpt2(traces):
    path = traces.get("tiny_gpt2")
    result = run_cli("info", str(path), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    ops = info["ops"]
    assert info["complete"] and len(ops) >= 150
    assert [op["index"] for op in ops] == list(range(len(ops)))
    with_layer = [op for op in ops if op["layer"]]
    assert len(with_layer) / len(ops) > 0.9
    assert any(op["layer"] == "transformer.h.0.attn" for op in ops)
    assert sum(op["op"].startswith("aten.") for op in ops) / len(ops) > 0.9
    assert info["source"] == "torch" and info["versions"]["tvm"].startswith("0.27")


def test_info_human_output(traces):
    result = run_cli("info", str(traces.get("mlp")))
    assert result.returncode == 0
    assert "complete" in result.stdout and "yes" in result.stdout


@pytest.fixture(scope="module")
def mlp_on_tvm_seed_2(tmp_path_factory):
    """examples/mlp.py recorded with `--source tvm:llvm` and seed 2: one recording for both tests below."""
    path = tmp_path_factory.mktemp("tvm_source") / "tvm.h5"
    record(str(EXAMPLES / "mlp.py"), path, source="tvm:llvm", seed=2)
    return path


def test_inputs_npz_and_seed(tmp_path, traces, mlp_on_tvm_seed_2):
    """`--inputs` records the given arrays; another seed records other inputs (the same seed records
    the same ones: test_final_op_equals_model_output_bit_for_bit)."""
    spec = str(EXAMPLES / "mlp.py")
    data = np.full((4, 16), 0.5, dtype=np.float32)
    np.savez(tmp_path / "in.npz", x=data)
    record(spec, tmp_path / "a.h5", inputs_npz=str(tmp_path / "in.npz"))
    with TraceReader(tmp_path / "a.h5") as reader:
        assert np.array_equal(reader.tensors.input(reader.outline.input_names[0]), data)
    torch.manual_seed(2)
    np.random.seed(2)
    _, seeded = load_model(spec)
    with TraceReader(traces.get("mlp")) as seed_0, TraceReader(mlp_on_tvm_seed_2) as seed_2:
        name = seed_0.outline.input_names[0]
        assert seed_2.meta["seed"] == 2 and np.array_equal(seed_2.tensors.input(name), seeded[0].numpy())
        assert not np.array_equal(seed_0.tensors.input(name), seed_2.tensors.input(name))


def test_tvm_source(mlp_on_tvm_seed_2):
    with TraceReader(mlp_on_tvm_seed_2) as reader:
        assert reader.meta["source"] == "tvm:llvm"
        assert reader.complete and len(reader.recorded.finished_ops()) == len(reader.outline.ops)


def test_committed_sample_trace_replays_clean():
    from conftest import ROOT

    with Session.open(ROOT / "traces" / "sample_mlp.h5") as session:
        assert len(session.ops) == 26
        assert not session.bisect().diverged


SLICE_ASSIGN = '''
import torch

class SliceAssign(torch.nn.Module):
    def forward(self, x):
        y = torch.zeros(4, 4)
        y[1:, 1:] = x  # exports as slice -> aten.copy -> slice_scatter
        return y * 2

def build():
    return SliceAssign(), (torch.randn(3, 3),)
'''


def test_in_place_copy_is_attributed_to_the_copy_node(tmp_path):
    """TVM's copy converter rewrites the destination slice's value; the slice must keep its own."""
    spec = tmp_path / "slice_assign.py"
    spec.write_text(SLICE_ASSIGN)
    path = tmp_path / "t.h5"
    record(str(spec), path)
    with TraceReader(path) as reader:
        by_name = {op["name"]: op for op in reader.outline.ops}
        assert by_name["copy"]["op"] == "aten.copy.default"
        (sliced,) = reader.tensors.op_outputs(by_name["slice_2"]["index"])
        assert not sliced.any(), "slice_2 is a slice of zeros; the copied values belong to `copy`"
    with Session.open(path) as session:
        assert not session.bisect().diverged
