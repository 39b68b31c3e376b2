"""Where TVM 0.27's own pipeline (torch.export + from_exported_program + tvm.compile) imports and runs
a model, tapml-dbg records it, and replays and bisects it cleanly on llvm; where TVM refuses it,
tapml-dbg refuses in one line naming why. One tiny model per kind (tests/models/import_kinds.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tapml_dbg.engine.session import Session
from tapml_dbg.errors import ModelError
from tapml_dbg.frontend.importer import export_program, import_program
from tapml_dbg.frontend.model_loader import load_model
from tapml_dbg.judge.verdict import Status
from tapml_dbg.record.host_ops import HostOps
from tapml_dbg.record.recorder import record
from tapml_dbg.trace import TraceReader

MODELS = Path(__file__).parent / "models" / "import_kinds.py"
SEED = 5


def _spec(kind: str) -> str:
    return f"{MODELS}:build_{kind}"


def _record_and_replay(tmp_path, kind: str) -> tuple[dict, list[dict], list[np.ndarray]]:
    """Record `kind`; check the trace is complete, ends in the model's own outputs bit for bit, and
    every op passes on llvm (isolated, and the bisection finds nothing); return meta, ops, outputs."""
    path = tmp_path / f"{kind}.h5"
    record(_spec(kind), path, seed=SEED)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    module, inputs = load_model(_spec(kind))
    with torch.no_grad():
        eager = module(*inputs)
    eager = [t.numpy() for t in (eager if isinstance(eager, tuple) else (eager,)) if t is not None]
    with TraceReader(path) as reader:
        assert reader.complete
        meta, ops = dict(reader.meta), list(reader.outline.ops)
        outputs = reader.tensors.op_outputs(ops[-1]["index"])
    assert [o.shape for o in outputs] == [e.shape for e in eager]
    assert all(np.array_equal(o, e) for o, e in zip(outputs, eager)), "the last op must be the model's output"
    with Session.open(path) as session:
        verdicts = session.verdicts.isolated_many(list(range(len(ops))))
        assert all(v.status in (Status.PASS, Status.MISSING) for v in verdicts.values()), \
            [(v.name, v.status, v.message) for v in verdicts.values() if v.status != Status.PASS]
        result = session.bisect(sweep=False)
    assert not result.diverged, result.culprit
    return meta, ops, outputs


def test_a_none_output_is_left_out(tmp_path):
    """Failed before: TypeError in portable/runner.py:flatten (the recorder ran R.null_value on tvm:llvm)."""
    meta, ops, outputs = _record_and_replay(tmp_path, "none_output")
    assert "none-outputs" in meta["import_fixes"]
    assert not any(op["relax_op"] == "relax.null_value" for op in ops)
    assert len(outputs) == 1 and outputs[0].shape == (2, 8)


def test_a_data_dependent_size_is_fixed_to_the_recorded_run(tmp_path):
    """Failed before: KeyError in frontend/importer.py:_build_graph (the match_cast binding kept its name)."""
    meta, ops, _ = _record_and_replay(tmp_path, "masked_select")
    torch.manual_seed(SEED)
    _, (x,) = load_model(_spec("masked_select"))
    selected = int((x > 0).sum())
    assert f"static-size: u0={selected} (masked_select) on the recorded inputs" in meta["import_fixes"]
    nonzero = [op for op in ops if op["relax_op"] == "relax.nonzero"]
    assert [op["outputs"][0]["shape"] for op in nonzero] == [[1, selected]]
    assert all(op["outputs"] for op in ops), "every op has a static tensor value"


def test_runtime_checks_are_dropped_and_their_conditions_recorded(tmp_path):
    """Failed before: tvm InternalError compiling R.assert_op alone (now refused by the trace's graph check)."""
    meta, ops, _ = _record_and_replay(tmp_path, "one_hot")
    assert "runtime-checks: 2 dropped" in meta["import_fixes"]
    assert not any(op["relax_op"] == "relax.assert_op" for op in ops)
    checked = [op["name"] for op in ops if op["op"] == "aten.logical_not.default" and op["outputs"][0]["shape"] == []]
    assert len(checked) == 2  # what each check asserted is an op of its own, recorded and replayed


def test_cond_records_the_branch_the_source_took(tmp_path):
    """Failed before: TypeError "emit() got an unexpected keyword argument 'name_hint'"."""
    meta, ops, outputs = _record_and_replay(tmp_path, "cond")
    assert "cond-branch: cond took the false branch on the recorded inputs" in meta["import_fixes"]
    aten = [op["op"] for op in ops]
    assert "aten.gt.Scalar" in aten and "aten.sub.Tensor" in aten and "aten.mul.Tensor" not in aten
    sub = next(op for op in ops if op["op"] == "aten.sub.Tensor")
    assert sub["fx_node"] == "sub" and sub.get("note", "") == ""  # torch's own value, not a helper's


def test_a_sparse_parameter_is_imported_like_tvm_does(tmp_path):
    """Failed before: RuntimeError "unsupported memory format option Contiguous" storing the param."""
    meta, ops, _ = _record_and_replay(tmp_path, "sparse_weight")
    assert "sparse-as-dense: w (sparse_coo)" in meta["import_fixes"]
    assert ops[0]["op"] == "aten._sparse_mm.default"  # not decomposed, as TVM's importer leaves it


def test_a_sparse_tensor_made_in_forward_is_refused_in_one_line():
    """TVM 0.27 refuses it too (no converter for aten._to_sparse)."""
    module, inputs = load_model(_spec("to_sparse"))
    with pytest.raises(ModelError) as caught:
        import_program(export_program(module, inputs))
    message = str(caught.value)
    assert "aten._to_sparse" in message and "\n" not in message


def test_a_helper_tvm_cannot_compute_alone_stops_in_one_line():
    """A helper op TVM fails on (as R.assert_op did) is a one-line ModelError naming it, not TVM's pages."""
    module, inputs = load_model(_spec("one_hot"))
    graph, provenance = import_program(export_program(module, inputs))
    helper = next(op for op in graph.ops if op.name not in provenance and op.relax_op == "relax.max")

    def failing(_op):
        raise RuntimeError("InternalError: Check failed: ...\n  (pages of C++ frames)")

    with pytest.raises(ModelError) as caught:
        HostOps(graph.mod["main"], failing).compute(helper, {})
    message = str(caught.value)
    assert helper.name in message and "relax.max" in message and "\n" not in message
