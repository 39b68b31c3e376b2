"""Fused verdicts: a fault that exists only when an add and the matmul feeding it are compiled together.

tests/transforms/fused_epilogue.py scales `add(matmul(x, w), b)` by 1.01 only when both calls sit in
one Relax function: every op passes alone, every input is right, and yet the model's value is
wrong. Bisect must call that `fused` and name the unit; its repro must reproduce it with tvm and
numpy only; a fault in one op must stay `isolated`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PLANTED_OP, fresh
from tapml_dbg.api import Replay
from tapml_dbg import portable as lib
from tapml_dbg.engine import fused
from tapml_dbg.engine.session import Session
from tapml_dbg.repro import carve, dump_op
from tapml_dbg.ui import cli
from test_repro import in_parallel, run_blocked, run_repro

ROOT = Path(__file__).resolve().parent.parent
EPILOGUE = f"{ROOT / 'tests' / 'transforms' / 'fused_epilogue.py'}:epilogue"
LOOKED_THROUGH = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims")


def first_epilogue(session) -> tuple[int, int]:
    """(the first add that reads a matmul's value, possibly reshaped; that matmul), from the op table."""
    for op in session.ops:
        if op.relax_op != "relax.add":
            continue
        for name in op.inputs:
            producer = session.by_name.get(name)
            while producer is not None and producer.relax_op in LOOKED_THROUGH:
                producer = session.by_name.get(producer.inputs[0])
            if producer is not None and producer.relax_op == "relax.matmul":
                return op.index, producer.index
    raise AssertionError("no add over a matmul")


@pytest.fixture(scope="module")
def fused_mlp(traces):
    with Session.open(traces.get("mlp"), transform=EPILOGUE) as session:
        yield session


def check_fused_culprit(session, culprit, add: int, matmul: int) -> None:
    assert culprit.index == add, (culprit, add)
    assert culprit.verdict == "fused" and culprit.wrong == "fused"
    indices = [index for index, _name in culprit.unit]
    assert indices[-1] == add and matmul in indices and indices == sorted(indices)
    assert len(indices) == add - matmul + 1  # the smallest unit: the matmul, what lies between, the add
    assert culprit.metrics.scale_rel_err == pytest.approx(0.01, rel=0.05)
    assert f"#{add} {culprit.name} passes alone; fails compiled with #{matmul} " in culprit.message
    assert culprit.message.endswith(f"fused, {len(indices)} ops")
    assert session.isolated(add).passed  # the add alone is right: only the unit is wrong


def test_bisect_reports_a_fusion_only_fault_fused_at_the_add(fused_mlp):
    fused_mlp.reset()
    result = fused_mlp.bisect(sweep=False)
    assert result.diverged
    check_fused_culprit(fused_mlp, result.culprit, *first_epilogue(fused_mlp))


@pytest.mark.parametrize("example", ["tiny_llama"])
def test_the_fused_phase_names_the_unit_in_transformers(traces, example):
    """The bisect's fused phase on the add its search stops at on a transformer (the search itself is
    test_bisect's and the test above's), fed the target's own values of the add's inputs: tiny_llama's
    residual add over `mm` through a `view`, a unit of 3 ops (tiny_gpt2's, `addmm_p0` + `addmm`, is the
    MLP's of the test above)."""
    with Session.open(traces.get(example), transform=EPILOGUE) as session:
        add, matmul = first_epilogue(session)
        inputs = [name for name in session.ops[add].inputs if name in session.by_name]
        between = [op.name for op in session.ops[matmul:add]]
        run = session.lanes.run(session.requests.ops_request(between, inputs))
        upstream = dict(zip(inputs, run.outputs))  # the matmul's (reshaped) value, as the target computes it
        unit = fused.diagnose(session, add, 0, upstream)
        culprit = unit.culprit(session.ops[unit.index])
        check_fused_culprit(session, culprit, add, matmul)


def test_bisect_json_names_the_fused_unit(fused_mlp, traces, capsys, monkeypatch):
    """`bisect --json`'s fused unit (its text output, `verdict: fused`, the unit, and the `next:` line
    offering `dump --ops 1:3`, is docs/dump-example.md's transcript)."""
    import contextlib

    fused_mlp.reset()
    monkeypatch.setattr(cli, "_open", lambda args, **_: contextlib.nullcontext(Replay(fused_mlp)))
    trace = str(traces.get("mlp"))
    assert cli.main(["bisect", trace, "--transform", EPILOGUE, "--json", "--no-sweep"]) == 0
    data = json.loads(capsys.readouterr().out)
    op = data["op"]
    assert (op["name"], op["verdict"], op["class"]) == ("addmm", "fused", "fused")
    assert op["fused"] == {"first": 1, "last": 2, "size": 2,
                           "ops": [{"index": 1, "name": "addmm_p0"}, {"index": 2, "name": "addmm"}]}


def test_a_one_op_fault_stays_isolated_never_fused(planted_mlp):
    result = fresh(planted_mlp).bisect(sweep=False)  # faults.py:scale on gelu_1 alone
    culprit = result.culprit
    assert (culprit.name, culprit.verdict, culprit.unit) == (PLANTED_OP, "isolated", [])
    assert result.to_json()["op"]["fused"] is None


def test_the_fused_culprit_dumps_as_a_unit_that_reproduces_only_with_the_fault(fused_mlp, tmp_path):
    faulty = dump_op(fused_mlp, "addmm", tmp_path / "faulty")  # `dump --op` of the culprit: its unit
    ranged = dump_op(fused_mlp, None, tmp_path / "clean", ops="1:3")  # `dump --ops 1:3`: ops 1..2
    assert faulty.unit == ranged.unit == [1, 2] and faulty.status == ranged.status == "fail"
    clean_meta = json.loads((tmp_path / "clean" / "meta.json").read_text())
    clean_meta["transform"] = None  # the same repro without the fault: the target's own epilogue
    (tmp_path / "clean" / "meta.json").write_text(json.dumps(clean_meta))
    meta = json.loads((tmp_path / "faulty" / "meta.json").read_text())
    assert [u["name"] for u in meta["ops"][0]["unit"]] == ["addmm_p0", "addmm"]
    assert meta["seen"]["mode"] == "fused"
    readme = (tmp_path / "faulty" / "README.md").read_text()
    assert "## Bug report: `relax.matmul` + `relax.add` compiled as one function (float32)" in readme
    assert "R.matmul(" in readme and "R.add(" in readme and "**class**: fused" in readme
    script = tmp_path / "standalone.py"  # the one-file script for an upstream issue (repro.py --tvmscript-only)
    script.write_text(lib.tvmscript_only(str(tmp_path / "faulty"), meta))
    assert "INPUTS = [\n    np.array([" in script.read_text()  # small inputs are inlined
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reproduced, passed, standalone = in_parallel(
        lambda: run_repro(tmp_path / "faulty", elsewhere), lambda: run_repro(tmp_path / "clean", elsewhere),
        lambda: run_blocked(script, elsewhere))
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr
    assert "REPRODUCED: unit #1..#2 (2 ops compiled as one function: addmm_p0, addmm)" in reproduced.stdout
    assert passed.returncode == 0 and "NOT REPRODUCED" in passed.stdout, passed.stdout + passed.stderr
    assert standalone.returncode == 1 and "REPRODUCED" in standalone.stdout, standalone.stdout + standalone.stderr


def test_carve_by_layer_fails_exactly_the_layers_holding_a_matmul_and_its_add(fused_mlp, tmp_path):
    result = carve(fused_mlp, tmp_path / "layers", unit="layer")
    here = str(tmp_path / "layers")
    meta = lib.read_meta(here)
    assert meta["unit"] == "layer" and result.tests == len(meta["ops"]) < len(fused_mlp.ops)
    runner, data = lib.Runner("llvm"), lib.Data(here)
    try:
        failed = {lib.op_id(op) for op in meta["ops"] if not lib.check_op(here, meta, op, runner, data).passed}
    finally:
        data.close()
    with_epilogue = {lib.op_id(op) for op in meta["ops"]
                     if {"relax.matmul", "relax.add"} <= {u["relax_op"] for u in op.get("unit", [])}}
    assert failed == with_epilogue == {"000-proj", "004-blocks.0.fc", "010-blocks.1.fc", "016-blocks.2.fc",
                                       "021-head"}
