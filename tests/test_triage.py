"""`triage`: every divergence of a model, grouped by cause, on real TVM 0.27 bugs and planted faults.

The issue's model, examples/qwen2_several_bugs.py (a tiny transformers Qwen2 without an attention mask,
`logits[:, -1]` and an int count times 0.5: five distinct TVM 0.27 bugs), is docs/triage.md's
transcript, compared line by line: its five causes (the bool `cumsum` that does not build, the two
bool `index` ops as one cause, the bool `eq`, the out-of-bounds `select`, the int64 `mul` with the
`sub` it hands its failure on folded in), every op in one cause. Here: its report's table of causes.
"""

from __future__ import annotations

import io
import json

from conftest import fault_transform, fresh, run_cli
from tapml_dbg.engine.report import OpPoint
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.triage import group_causes, triage
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Status, Verdict, WrongClass
from tapml_dbg.model.graph import OpInfo, TensorSpec
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.ui.cli import strict_json
from tapml_dbg.ui.repl.app import Repl, make_console


def _causes(result) -> dict[str, list[int]]:
    return {group.cause: [op.index for op in group.ops] for group in result.groups}


def test_planted_faults_at_two_ops_are_two_causes_with_their_inherited_failures(traces, tmp_path):
    """Two planted faults of different kinds: two causes, each at its op, everything downstream folded."""
    trace = traces.get("mlp")
    with Session.open(trace) as probe:
        names = [op.name for op in probe.ops if op.op == "aten.gelu.default"]
    transform = tmp_path / "two_faults.py"
    scale = fault_transform(tmp_path, "scale", names[0], scale=1.5).split(":")[0]
    nan = fault_transform(tmp_path, "nan", names[1]).split(":")[0]
    transform.write_text(
        "import importlib.util\n"
        "def _load(path):\n"
        "    spec = importlib.util.spec_from_file_location(path.rsplit('/', 1)[-1][:-3], path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    return module\n"
        f"_SCALE, _NAN = _load({scale!r}), _load({nan!r})\n"
        "def both(mod):\n"
        "    return _NAN.nan(_SCALE.scale(mod))\n")
    with Session.open(trace, TargetSpec(transform=f"{transform}:both"), start_workers=True) as session:
        result = triage(session)
    by_first = {group.first.name: group for group in result.groups}
    assert set(by_first) == {names[0], names[1]}, _causes(result)
    assert by_first[names[0]].wrong == WrongClass.SEMANTIC
    assert by_first[names[1]].wrong == WrongClass.NAN_INF
    assert by_first[names[0]].inherited, "the scaled value's consumers fail propagated, inherited"


def test_a_clean_model_has_no_cause(traces):
    result = run_cli("triage", str(traces.get("mlp")))
    assert result.returncode == 0, result.stderr
    assert "no divergence" in result.stdout


def _op(index: int, name: str, op: str, inputs: list[str]) -> OpInfo:
    return OpInfo(index, name, op, "relax.x", "", inputs=inputs, outputs=[TensorSpec((2,), "float32")])


def _verdict(index: int, name: str, mode, status: Status, wrong=None, message: str = "") -> Verdict:
    return Verdict(index, name, mode, status, message=message, wrong=wrong)


def test_grouping_rule_on_given_verdicts():
    """Two compile errors of one aten op whose messages differ only in numbers are one cause; a
    propagated failure with nothing wrong upstream is a cause of its own; failures downstream of a
    cause are inherited, never causes."""
    ops = [_op(0, "a", "aten.cumsum.default", []), _op(1, "b", "aten.cumsum.default", ["a"]),
           _op(2, "c", "aten.add.Tensor", []), _op(3, "d", "aten.mul.Tensor", ["c"]),
           _op(4, "e", "aten.mul.Tensor", ["d", "b"])]
    fail = lambda i, mode, status, **k: _verdict(i, ops[i].name, mode, status, **k)  # noqa: E731
    points = [OpPoint(0, "a", ops[0].op, "", "float32", fail(0, ISOLATED, Status.COMPILE_ERROR, message="error at %12 line 3"),
                      fail(0, PROPAGATED, Status.COMPILE_ERROR, message="x")),
              OpPoint(1, "b", ops[1].op, "", "float32", fail(1, ISOLATED, Status.COMPILE_ERROR, message="error at %40 line 9"),
                      fail(1, PROPAGATED, Status.COMPILE_ERROR, message="x")),
              OpPoint(2, "c", ops[2].op, "", "float32", fail(2, ISOLATED, Status.PASS),
                      fail(2, PROPAGATED, Status.FAIL, wrong=WrongClass.PRECISION)),
              OpPoint(3, "d", ops[3].op, "", "float32", fail(3, ISOLATED, Status.PASS),
                      fail(3, PROPAGATED, Status.FAIL, wrong=WrongClass.PRECISION)),
              OpPoint(4, "e", ops[4].op, "", "float32", fail(4, ISOLATED, Status.PASS),
                      fail(4, PROPAGATED, Status.FAIL, wrong=WrongClass.PRECISION))]
    result = group_causes("llvm", ops, points, {})
    assert [[op.index for op in group.ops] for group in result.groups] == [[0, 1], [2]]
    assert result.groups[0].wrong == "compile-error"
    assert result.groups[1].ops[0].verdict == "propagated"
    assert result.groups[1].inherited == [3, 4] or result.groups[0].inherited == [4]
    folded = result.groups[0].inherited + result.groups[1].inherited
    assert sorted(folded) == [3, 4]


def test_triage_in_the_repl_and_its_json_give_each_op_its_source_line(demo_session):
    """The REPL's `triage` on the README's example (the engine session the REPL, docs and report tests
    share; `replay -c` through the CLI is tests/test_repl.py's), then what `triage --json` prints of the
    same session (`triage --json` itself: tests/test_stock_import.py, tests/test_sticky_faults.py)."""
    out = io.StringIO()
    console = make_console(out)
    repl = Repl(fresh(demo_session), out=console, err=console, launch={"trace": str(demo_session.reader.path)},
                show_progress=False)
    repl.execute("triage")
    assert "cause(s) of divergence" in out.getvalue()
    assert "_softmax (float16): precision" in out.getvalue()
    found = json.loads(strict_json(triage(demo_session).to_json()))
    first = found["groups"][0]["ops"][0]
    assert first["index"] == 9
    assert first["source_location"] == {"file": "examples/fp16_memory_attention.py", "line": 21,
                                        "code": "weights = torch.softmax(q @ self.keys.t(), dim=-1)"}


def test_the_report_lists_every_cause_with_its_repro_command(traces, tmp_path):
    """`report` shows triage's answer too: each cause, its ops, the user's line and a dump command."""
    trace = traces.get("qwen2_several_bugs")
    result = run_cli("report", str(trace), "-o", str(tmp_path / "page"))
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "page" / "index.html").read_text()
    causes = page[page.index('<table id="causes">'):]
    causes = causes[:causes.index("</table>")]
    assert causes.count("<tr>") == 1 + 5, "a header and the model's five causes"
    assert f"tapml-dbg dump {trace} --op 14 -o repro/cumsum/" in causes
    assert "examples/qwen2_several_bugs.py:15" in causes, "the select and the mul come from the user's last line"
