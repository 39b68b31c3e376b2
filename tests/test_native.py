"""TVM-native models (`build_tvm()`, relax.frontend.nn): recorded on a trusted TVM target, every binding
an op, bisected clean, planted faults named at the right binding, dumped as a repro that reproduces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLES, FAULTS, fault_transform, run_cli
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import ModelError, UsageError
from tapml_dbg.frontend.native import load_native, native_model
from tapml_dbg.trace import TraceReader

NATIVE = "native_mlp"
SOURCE = ("--source", "tvm:llvm")


@pytest.fixture(scope="module")
def native_trace(traces):
    return traces.get(NATIVE, *SOURCE)


def test_native_trace_holds_the_modules_bindings_with_layers(native_trace):
    info = json.loads(run_cli("info", str(native_trace), "--json").stdout)
    assert info["source"] == "tvm:llvm" and info["complete"] and info["source_graph"] is False
    names = [op["name"] for op in info["ops"]]
    assert names[:4] == ["rms_norm", "permute_dims", "matmul", "silu"]  # the Relax bindings' own names
    layers = {op["name"]: op["layer"] for op in info["ops"]}
    assert layers["rms_norm"] == "blocks.0.norm" and layers["matmul"] == "blocks.0.up"
    assert layers["rms_norm1"] == "blocks.1.norm" and layers["softmax"] == "head"
    assert {op["op"] for op in info["ops"]} >= {"relax.nn.rms_norm", "relax.matmul", "relax.nn.softmax"}
    assert info["eager_output_max_abs_diff"] == 0.0  # op by op = the whole module's own run, bit for bit
    with TraceReader(native_trace) as reader:
        assert reader.meta["native"]["entry"] == "forward"
        (softmax,) = reader.tensors.op_outputs(names.index("softmax"))
        assert np.allclose(softmax.sum(axis=-1), 1.0, atol=1e-5)


def test_native_trace_bisects_clean_against_its_source_target(native_trace):
    result = json.loads(run_cli("bisect", str(native_trace), "--json").stdout)
    assert result["diverged"] is False and result["ops"] == 19
    assert result["reference"] == {"kind": "source", "target": "llvm"}


@pytest.mark.parametrize("op, index, layer", [("rms_norm", 0, "blocks.0.norm"), ("silu1", 10, "blocks.1.up"),
                                              ("softmax", 17, "head")])
def test_planted_fault_is_named_at_its_binding(native_trace, tmp_path, op, index, layer):
    with Session.open(native_trace, transform=fault_transform(tmp_path, "scale", op)) as session:
        result = session.bisect()
    assert result.culprit is not None and (result.culprit.index, result.culprit.name) == (index, op)
    assert result.culprit.verdict == "isolated" and result.culprit.layer == layer


def test_dump_of_a_native_binding_reproduces(native_trace, tmp_path):
    """One dump, its transform planting the fault where $TAPML_FAULT_OP says (docs/dump-example.md's way):
    the repro reproduces with the variable set, and without it the binding matches the source (the
    module and data dumped are the binding's own). The transform's text is this test's own: the compile
    cache keys a unit by it, not by the variable."""
    transform = tmp_path / "faults_by_variable.py"
    transform.write_text(FAULTS.read_text() + "\n\nSETTINGS = {'scale': '1.01', 'for': 'test_native dump'}\n")
    fault = {"TAPML_FAULT_OP": "silu1"}
    folder = tmp_path / "repro"
    result = run_cli("dump", str(native_trace), "--op", "silu1", "-o", str(folder), "--transform", f"{transform}:scale",
                     env=fault)
    assert result.returncode == 0, result.stderr
    assert "R.nn.silu" in (folder / "module.py").read_text()  # the binding as a Relax function
    unset = {key: value for key, value in os.environ.items() if key != "TAPML_FAULT_OP"}
    ran = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=300,
                         env={**unset, **fault})
    assert ran.returncode == 1 and "REPRODUCED" in ran.stdout, ran.stdout + ran.stderr
    passed = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=300,
                            env=unset)
    assert passed.returncode == 0 and "NOT REPRODUCED" in passed.stdout, passed.stdout + passed.stderr


def _nn_module():
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    class Tiny(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(4, 3, bias=False)

        def forward(self, x):
            return op.silu(self.fc(x))

    return Tiny().export_tvm(spec={"forward": {"x": nn.spec.Tensor((2, 4), "float32")}})


def test_bad_native_modules_get_one_clear_line():
    mod, params = _nn_module()
    good = [np.ones((2, 4), "float32"), np.ones((3, 4), "float32")]
    assert [op.name for op in native_model(mod, good).graph.ops][-1] == "gv"
    with pytest.raises(ModelError, match=r"argument fc.weight is float32\[4, 3\] but the entry function takes "
                                         r"float32\[3, 4\]"):
        native_model(mod, [good[0], np.ones((4, 3), "float32")])
    with pytest.raises(ModelError, match="takes 2 arguments .* but 1 arrays were given"):
        native_model(mod, good[:1])
    with pytest.raises(UsageError, match="no Relax function 'prefill' .*it has: forward"):
        native_model(mod, good, entry="prefill")
    with pytest.raises(ModelError, match="must be a tvm.IRModule"):
        native_model("not a module", good)
    with pytest.raises(ModelError, match="list of numpy arrays"):
        native_model(mod, good[0])


def test_bad_native_files_fail_in_one_line(tmp_path):
    missing = tmp_path / "no_build_tvm.py"
    missing.write_text("def build():\n    return None\n")
    result = run_cli("record", f"{missing}:build_tvm", "-o", str(tmp_path / "t.h5"), *SOURCE)
    assert result.returncode == 1 and "build_tvm" in result.stderr and "Traceback" not in result.stderr
    wrong = tmp_path / "wrong_entry.py"
    wrong.write_text((EXAMPLES / f"{NATIVE}.py").read_text())
    result = run_cli("record", str(wrong), "-o", str(tmp_path / "t.h5"), *SOURCE, "--entry", "decode")
    assert result.returncode == 1 and "no Relax function 'decode'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_load_native_reads_the_example():
    model = load_native(str(EXAMPLES / f"{NATIVE}.py"))
    assert model.entry == "forward" and list(model.inputs) == ["x"] and len(model.params) == 8


def test_migrate_and_mixed_runs_of_a_native_trace_run_the_source_ops_on_the_source_target(native_trace, tmp_path):
    transform = fault_transform(tmp_path, "scale", "silu1")
    with Session.open(native_trace, transform=transform) as session:
        clean = session.run_mixed(session.resolve_ops("blocks.0"))  # blocks.1 and the head on tvm:llvm, fed it
        assert clean.passed and clean.source.startswith("tvm:llvm")
        broken = session.run_mixed(session.resolve_ops("blocks.1"))  # the fault's block offloaded
        assert not broken.passed
        migration = session.migrate()
    assert migration.culprit is not None and migration.culprit.name == "silu1"
