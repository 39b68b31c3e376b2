"""The stock import first: what TVM's stock `from_exported_program` does where tapml-dbg's import fixes
hide it (frontend/stock_import.py) is recorded in the trace and judged as type verdicts (or an
import-error finding when the stock import fails outright)."""

from __future__ import annotations

import contextlib
import json
import textwrap

import pytest

import tapml_dbg
from conftest import EXAMPLES, run_cli
from tapml_dbg.engine.report import OpPoint
from tapml_dbg.engine.triage import group_causes, stock_import_group
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Status, Verdict, WrongClass
from tapml_dbg.model.graph import OpInfo, TensorSpec
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.schema import META_STOCK_IMPORT
from tapml_dbg.trace.source_graph import TypeChange, stock_type_changes
from tapml_dbg.trace.validate import SchemaError, validate_op_table
from tapml_dbg.ui import cli

INT_MATMUL = """
    import torch

    class Counts(torch.nn.Module):
        def forward(self, a, b):
            return (a @ b) - 1

    def build():
        torch.manual_seed(0)
        return Counts(), (torch.randint(-3, 4, (3, 5)), torch.randint(-3, 4, (5, 2)))
"""
FLOAT32_MATMUL = """
    import torch

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.fc(x) @ torch.ones(4, 2))

    def build():
        torch.manual_seed(0)
        return Plain().eval(), (torch.randn(3, 8),)
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Record each model once: {name: trace path} (the float64 linear is examples/float64_linear.py)."""
    folder = tmp_path_factory.mktemp("stock")
    paths = {}
    for name, text in (("float64_linear", None), ("int_matmul", INT_MATMUL), ("float32_matmul", FLOAT32_MATMUL)):
        model = EXAMPLES / f"{name}.py" if text is None else folder / f"{name}.py"
        if text is not None:
            model.write_text(textwrap.dedent(text))
        paths[name] = folder / f"{name}.h5"
        result = run_cli("record", str(model), "-o", str(paths[name]))
        assert result.returncode == 0, result.stderr
        assert "BlockBuilder destroyed" not in result.stderr  # a failed stock import leaves no TVM warning
    return paths


@pytest.fixture(scope="module")
def opened(recorded):
    """name -> its trace opened on llvm, once for the module: bisect and triage ask one session (the
    commands' API methods, whose JSON `bisect --json` and `triage --json` print; triage reuses bisect's
    verdicts)."""
    with contextlib.ExitStack() as stack:
        replays = {}

        def get(name: str):
            if name not in replays:
                replays[name] = stack.enter_context(tapml_dbg.open(recorded[name]))
            return replays[name]

        yield get


def _cli(capsys, *args) -> str:
    """`tapml-dbg ARGS` (its `main`, in this process): what it printed on stdout; exit status 0."""
    assert cli.main([str(arg) for arg in args]) == 0
    return capsys.readouterr().out


def test_a_float64_linear_is_named_at_its_matmul_with_class_type(opened):
    """Stock TVM imports the float64 addmm's matmul as float32 (out_dtype hard-coded) and then fails
    adding the float64 bias; the workaround imports it as float64, so no value differs on the target.
    bisect names the matmul, class type, and says the stock import fails; before, nothing diverged."""
    found = opened("float64_linear").bisect().to_json()
    op = found["op"]
    assert found["diverged"] and (op["name"], op["op"], op["class"]) == ("addmm_p0", "aten.addmm.default", "type")
    assert ("the stock import declares float32 where the source computed float64 (tapml-dbg's matmul-dtype "
            "workaround imports it as float64)") in op["evidence"]
    assert any(note.startswith("TVM's stock import fails at #2 addmm (aten.addmm.default): TypeError: Binary "
                               "operators must have the same datatype") for note in found["notes"]), found["notes"]


def test_triage_lists_the_float64_matmul_and_the_stock_import_error(opened):
    """`triage --json`; its text (the cause, "1 finding(s) of TVM's stock import", "addmm: the stock import
    fails: TypeError: ...") is docs/triage.md's transcript, compared byte for byte."""
    found = opened("float64_linear").triage().to_json()
    by_class = {group["class"]: group for group in found["groups"]}
    assert set(by_class) == {"type", "import-error"}, [g["cause"] for g in found["groups"]]
    typed = by_class["type"]
    assert [o["name"] for o in typed["ops"]] == ["addmm_p0"]
    assert typed["cause"] == "addmm: the stock import declares float32 where the source computed float64"
    error = by_class["import-error"]
    assert [o["name"] for o in error["ops"]] == ["addmm"]
    assert error["ops"][0]["summary"].startswith("TVM import of aten.addmm.default (FX node addmm, layer fc) "
                                                 "failed: TypeError: Binary operators")
    assert "\n" not in error["ops"][0]["summary"]
    assert "after the stock type change at #1 addmm_p0" in error["evidence"]
    assert found["groups"][-1]["class"] == "import-error", "listed after the target's causes"


def test_an_integer_matmul_is_named_at_the_matmul(opened):
    """Stock TVM imports an int64 `a @ b` (and the sub after it) as float32 without failing."""
    found = opened("int_matmul").bisect().to_json()
    op = found["op"]
    assert (op["index"], op["name"], op["op"], op["class"]) == (0, "mm", "aten.mm.default", "type")
    assert "the stock import declares float32 where the source computed int64" in op["evidence"]
    assert not any("stock import fails" in note for note in found["notes"])
    triaged = opened("int_matmul").triage().to_json()
    assert [(g["class"], [o["name"] for o in g["ops"]]) for g in triaged["groups"]] == [("type", ["mm"])]
    assert triaged["groups"][0]["cause"] == "mm: the stock import declares float32 where the source computed int64"


def test_info_says_what_the_stock_import_does(recorded, capsys):
    info = json.loads(_cli(capsys, "info", recorded["float64_linear"], "--json"))
    stock = info["stock_import"]
    assert stock["fixes"] == ["matmul-dtype"] and stock["changed"] == ["#1 addmm_p0"] and stock["error_op"] == "#2 addmm"
    assert stock["reason"].startswith("TypeError: Binary operators")
    text = _cli(capsys, "info", recorded["int_matmul"])
    assert "stock import" in text and "#0 mm (type verdicts)" in text
    with TraceReader(recorded["int_matmul"]) as reader:
        assert reader.outline.ops[0]["stock_outputs"] == [{"output": 0, "shape": [3, 2], "dtype": "float32"}]
        assert reader.outline.ops[1]["stock_outputs"] == [], "only the nodes the fixes touch are compared"
        assert reader.meta[META_STOCK_IMPORT]["error"] is None


def test_a_float32_model_is_not_imported_twice(recorded, capsys):
    """No fix changes a float32 matmul: no second import, nothing stored, nothing reported."""
    with TraceReader(recorded["float32_matmul"]) as reader:
        assert META_STOCK_IMPORT not in reader.meta
        assert all(op["stock_outputs"] == [] for op in reader.outline.ops)
        assert "stock_import" not in reader.meta.get("record_phases", {})
    assert json.loads(_cli(capsys, "info", recorded["float32_matmul"], "--json"))["stock_import"] is None


# ---------------------------------------------------------------------------- the rules, on data
def _op(index, name, op, inputs, dtype="float32", stock=()):
    return OpInfo(index, name, op, "relax.x", "", inputs=inputs, outputs=[TensorSpec((2,), dtype)],
                  stock_outputs=list(stock))


def test_stock_type_changes_skip_what_the_recorded_import_changes_and_widening_is_no_verdict():
    ops = [_op(0, "mm", "aten.mm.default", [], "int64", [(0, TensorSpec((2,), "float32"))]),
           _op(1, "mm_1", "aten.mm.default", [], "float16", [(0, TensorSpec((2,), "float32"))]),
           _op(2, "mm_2", "aten.mm.default", [], "int64", [(0, TensorSpec((2,), "float32"))])]
    own = [TypeChange("mm_2", 0, TensorSpec((2,), "int64"), TensorSpec((2,), "int32"))]
    found = stock_type_changes(ops, own, ["matmul-dtype"])
    assert [(c.op, c.declared.dtype, c.source.dtype, c.stock) for c in found] == [
        ("mm", "float32", "int64", "matmul-dtype"), ("mm_1", "float32", "float16", "matmul-dtype")]
    assert [c.widens for c in found] == [False, True]
    assert found[0].describe() == ("the stock import declares float32 where the source computed int64 "
                                   "(tapml-dbg's matmul-dtype workaround imports it as int64)")


def test_a_stock_type_change_does_not_absorb_failures_downstream():
    """The target computes a stock-typed op in torch's type: a propagated failure after it is a cause of
    its own, not inherited from it; a recorded-import type change still folds what reads it."""
    ops = [_op(0, "mm", "aten.mm.default", [], "int64"), _op(1, "sub", "aten.sub.Tensor", ["mm"], "int64"),
           _op(2, "mul", "aten.mul.Tensor", ["sub"], "int64")]
    stock = TypeChange("mm", 0, TensorSpec((2,), "float32"), TensorSpec((2,), "int64"), "matmul-dtype",
                       TensorSpec((2,), "int64"))

    def verdict(i, mode, status, wrong=None):
        return Verdict(i, ops[i].name, mode, status, wrong=wrong)

    points = [OpPoint(0, "mm", ops[0].op, "", "int64", verdict(0, ISOLATED, Status.FAIL, WrongClass.TYPE),
                      verdict(0, PROPAGATED, Status.FAIL, WrongClass.TYPE)),
              OpPoint(1, "sub", ops[1].op, "", "int64", verdict(1, ISOLATED, Status.PASS),
                      verdict(1, PROPAGATED, Status.FAIL, WrongClass.SEMANTIC)),
              OpPoint(2, "mul", ops[2].op, "", "int64", verdict(2, ISOLATED, Status.PASS),
                      verdict(2, PROPAGATED, Status.FAIL, WrongClass.SEMANTIC))]
    result = group_causes("llvm", ops, points, {0: [stock]})
    assert [[op.name for op in group.ops] for group in result.groups] == [["mm"], ["sub"]]
    assert result.groups[0].wrong == "type" and result.groups[1].inherited == [2]
    own = TypeChange("mm", 0, TensorSpec((2,), "float32"), TensorSpec((2,), "int64"))
    result = group_causes("llvm", ops, points, {0: [own]})
    assert [[op.name for op in group.ops] for group in result.groups] == [["mm"]]


def test_the_import_error_group_needs_an_error():
    ops = [_op(0, "addmm_p0", "aten.addmm.default", []), _op(1, "addmm", "aten.addmm.default", ["addmm_p0"])]
    ops[1].fx_node = ops[0].fx_node = "addmm"
    assert stock_import_group(ops, {}, {}) is None
    assert stock_import_group(ops, {"fixes": ["matmul-dtype"], "error": None}, {}) is None
    group = stock_import_group(ops, {"fixes": ["matmul-dtype"], "error": "TVM import of x failed: E: bad. More",
                                     "reason": "E: bad. More", "error_op": "addmm", "error_node": "addmm"}, {})
    assert (group.wrong, group.cause, group.first.name) == ("import-error", "addmm: the stock import fails: E: bad",
                                                            "addmm")
    assert stock_import_group(ops, {"error": "x", "error_op": "addmm"}, {}, kept={1}) is None


def test_old_op_tables_load_and_bad_stock_outputs_are_refused():
    """`stock_outputs` is optional (traces recorded before it load with []), and checked when present."""
    assert OpInfo.from_json({"index": 0, "name": "a", "op": "", "relax_op": "", "layer": ""}).stock_outputs == []
    table = validate_op_table([{"index": 0, "name": "a", "outputs": [{"shape": [2], "dtype": "int64"}]}])
    assert table[0]["stock_outputs"] == []
    good = {"index": 0, "name": "a", "outputs": [{"shape": [2], "dtype": "int64"}],
            "stock_outputs": [{"output": 0, "shape": [2], "dtype": "float32"}]}
    op = OpInfo.from_json(validate_op_table([good])[0])
    assert op.stock_outputs == [(0, TensorSpec((2,), "float32"))]
    assert OpInfo.from_json(op.to_json()) == op
    for bad in ([{"output": 1, "shape": [2], "dtype": "float32"}], [{"output": 0, "shape": [2], "dtype": "nope"}],
                {"output": 0}, [{"output": 0, "shape": [2], "dtype": "float32"}] * 2):
        with pytest.raises(SchemaError):
            validate_op_table([{**good, "stock_outputs": bad}])
