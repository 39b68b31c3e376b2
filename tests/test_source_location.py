"""Source locations: every op knows the file, line and code line it comes from.

The rule (frontend/source_location.py): the innermost frame of the op's FX node stack trace that is in
the user's files or in a library's model code (transformers' modeling_llama.py, with the user's frame
above it); None when there is none. Recorded into the trace with the code line, shown by bisect (and its
--json), the REPL's compare and show, the report's culprit card, `table()` and the repro READMEs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import EXAMPLES, ROOT, fault_transform, fresh, rendered
from tapml_dbg.api import Replay
from tapml_dbg.engine.results import BisectResult, Culprit, StepResult
from tapml_dbg.engine.session import Session
from tapml_dbg.frontend.source_location import source_location_of
from tapml_dbg.judge.compare import Metrics
from tapml_dbg.judge.verdict import Mode, Status, Verdict
from tapml_dbg.model.graph import OpInfo, SourceLocation, TensorSpec
from tapml_dbg.trace.validate import SchemaError, validate_op_table
from tapml_dbg.ui.cli import strict_json
from tapml_dbg.ui.console import make_console
from tapml_dbg.ui.repl.app import Repl
from test_causal_lm import recorded as recorded_causal_lm

DEMO = EXAMPLES / "fp16_memory_attention.py"  # the README's example: #9 _softmax diverges on llvm
DEMO_LINE = 21
DEMO_CODE = "weights = torch.softmax(q @ self.keys.t(), dim=-1)"
OLD_FIXTURES = [ROOT / "tests" / "fixtures" / name for name in ("trace_v1.h5", "trace_v1_1.h5")]  # frozen, older
LIBRARY_FILE = torch.nn.modules.linear.__file__  # a frame of torch's: never the user's


def shown(path: Path) -> str:
    """The file as a trace recorded in this directory names it: relative under it, else absolute."""
    path, here = path.resolve(), Path.cwd().resolve()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def frame(file, line: int, code: str, func: str = "forward") -> str:
    return f'  File "{file}", line {line}, in {func}\n    {code}\n'


def node(stack: str | None) -> SimpleNamespace:
    return SimpleNamespace(meta={} if stack is None else {"stack_trace": stack})


def repl_transcript(session, *lines: str) -> str:
    buffer = io.StringIO()
    console = make_console(buffer)
    repl = Repl(fresh(session), out=console, err=console, launch={"trace": str(session.reader.path)},
                show_progress=False)
    for line in lines:
        repl.execute(line)
    return buffer.getvalue()


# ------------------------------------------------------------------ the rule, on stack traces
def test_the_innermost_user_frame_wins_and_library_frames_never_do(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef forward(x):\n    return torch.relu(x)  # the user's line\n"
                     "def inner(x):\n    return outer(x)\n")
    stack = frame(model, 6, "return outer(x)", "inner") + frame(model, 4, "stale text") + \
        frame(LIBRARY_FILE, 134, "return F.linear(input, self.weight, self.bias)")
    location = source_location_of(node(stack), cwd=tmp_path)
    # the innermost user frame (line 4), the code read from the file, not the trace's own text
    assert location == SourceLocation("model.py", 4, "return torch.relu(x)  # the user's line")
    elsewhere = source_location_of(node(stack), cwd=tmp_path / "sub")
    assert elsewhere.file == str(model.resolve())  # not under the directory: absolute


def test_an_op_without_a_user_frame_has_none():
    library_only = frame(LIBRARY_FILE, 134, "return F.linear(input, self.weight, self.bias)")
    assert source_location_of(node(library_only)) is None
    assert source_location_of(node(None)) is None and source_location_of(None) is None
    assert source_location_of(node(frame("<eval_with_key>.3", 5, "x = y"))) is None
    tapml_own = ROOT / "tapml_dbg" / "frontend" / "importer.py"
    assert source_location_of(node(frame(tapml_own, 1, "x"))) is None


def test_a_torch_module_used_directly_has_no_source_locations():
    """Every frame of torch.nn.Linear's ops is torch's: None, rather than a line of torch's own."""
    from tapml_dbg.frontend.importer import export_program, import_program

    with torch.no_grad():
        program = export_program(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),))
    graph, _ = import_program(program)
    assert graph.ops and all(op.source_location is None for op in graph.ops)


def test_a_library_frame_names_the_library_line_and_the_users_call_above_it(tmp_path):
    """transformers' forward is the innermost frame that is not torch's: its line, relative to the folder
    the package is installed in, with the user's innermost frame above it (`user`); torch's own frame
    below it (nn.Linear's F.linear) is never the line."""
    import transformers.models.llama.modeling_llama as modeling

    model = tmp_path / "model.py"
    model.write_text("def forward(self, ids):\n    return self.lm(ids).logits  # the user's call\n")
    line = next(k for k, text in enumerate(Path(modeling.__file__).read_text().splitlines(), 1) if "self.q_proj(" in text)
    stack = frame(model, 2, "stale") + frame(modeling.__file__, line, "stale", "forward") + \
        frame(LIBRARY_FILE, 134, "return F.linear(input, self.weight, self.bias)")
    location = source_location_of(node(stack), cwd=tmp_path)
    code = Path(modeling.__file__).read_text().splitlines()[line - 1].strip()
    assert location == SourceLocation("transformers/models/llama/modeling_llama.py", line, code, "transformers",
                                      SourceLocation("model.py", 2, "return self.lm(ids).logits  # the user's call"))
    assert location.to_json()["user"] == {"file": "model.py", "line": 2, "code": location.user.code}
    assert SourceLocation.from_json(location.to_json()) == location
    bare = source_location_of(node(frame(modeling.__file__, line, "stale") + frame(LIBRARY_FILE, 134, "x")))
    assert bare.library == "transformers" and bare.user is None and bare.to_json()["user"] is None
    assert validate_op_table([{"index": 0, "name": "a", "source_location": location.to_json()}])[0][
        "source_location"] == location.to_json()


# ------------------------------------------------------------------ transformers models, recorded
MODELING_LLAMA = "transformers/models/llama/modeling_llama.py"


def modeling_line(line: int) -> str:
    """Line `line` of the installed transformers' modeling_llama.py, as a location stores it."""
    import transformers.models.llama.modeling_llama as modeling

    return Path(modeling.__file__).read_text().splitlines()[line - 1].strip()


def test_a_planted_fault_in_a_transformers_llama_names_its_modeling_llama_line(traces, tmp_path):
    """A bare LlamaForCausalLM (no frame of the user's at all; tests/test_causal_lm.py's, recorded once a
    run): the fault planted at the first RMSNorm's rsqrt is named at modeling_llama.py's `torch.rsqrt`
    line, in bisect's --json, its text and table()."""
    trace, _spec, _printed = recorded_causal_lm(traces, "llama")
    with Session.open(trace, transform=fault_transform(tmp_path, "scale", "rsqrt")) as session:
        # every op of the model has its line (none had one before); the positions tapml-dbg computes from
        # the attention mask (frontend/causal_lm.py, no layer) have none: no frame of the user's or a library's
        assert all(op.source_location is not None for op in session.ops if op.fx_node and op.layer)
        replay = Replay(session)
        result = replay.bisect()
        assert result.diverged and result.culprit.name == "rsqrt"
        where = result.to_json()["op"]["source_location"]
        assert (where["file"], where["library"], where["user"]) == (MODELING_LLAMA, "transformers", None)
        assert "torch.rsqrt(" in where["code"] and where["code"] == modeling_line(where["line"])
        assert rendered(result).splitlines()[1] == f"  at {MODELING_LLAMA}:{where['line']}  {where['code']}"
        row = next(row for row in replay.rows() if row["name"] == "rsqrt")
        assert (row["file"], row["line"], row["code"], row["library"]) == (MODELING_LLAMA, where["line"],
                                                                          where["code"], "transformers")
        assert row["user_file"] is None and row["isolated"] == "fail"


def test_a_wrapped_transformers_llama_names_the_library_line_and_the_users_call(traces):
    """examples/tiny_llama.py's LlamaLogits calls LlamaForCausalLM.forward from the user's file: each op
    names modeling_llama.py's line and, under it, the user's line 16 (`return super().forward(...)`)."""
    with Session.open(traces.get("tiny_llama")) as session:
        op = next(op for op in session.ops if op.op == "aten.rsqrt.default")
        where = op.source_location
        assert (where.file, where.library) == (MODELING_LLAMA, "transformers") and "torch.rsqrt(" in where.code
        assert where.code == modeling_line(where.line)
        assert where.user == SourceLocation(shown(EXAMPLES / "tiny_llama.py"), 16, "return super().forward(input_ids="
                                            "input_ids, attention_mask=attention_mask, use_cache=False).logits")
        located = Culprit(op.index, op.name, op.op, op.layer, "isolated", _metrics(), "", source_location=where)
        result = BisectResult(True, 5, 3, 0.5, "llvm", located, [])
        assert rendered(result).splitlines()[1:3] == [f"  at {MODELING_LLAMA}:{where.line}  {where.code}",
                                                     f"    called from {where.user}  {where.user.code}"]


def test_the_report_card_and_a_repro_readme_show_a_library_line_and_the_users_call():
    from tapml_dbg.repro.files import markdown_location
    from tapml_dbg.report.html import _location_rows

    where = SourceLocation(MODELING_LLAMA, 66, "x = y | z", "transformers", SourceLocation("m.py", 3, "out = lm(ids)"))
    assert _location_rows(where) == [("library line", f"<code>{MODELING_LLAMA}:66</code> <code>x = y | z</code>"),
                                     ("model line", "<code>m.py:3</code> <code>out = lm(ids)</code>")]
    assert _location_rows(SourceLocation("m.py", 3, "y")) == [("model line", "<code>m.py:3</code> <code>y</code>")]
    assert markdown_location(where.to_json()) == (f"`{MODELING_LLAMA}:66` `x = y \\| z` called from `m.py:3` "
                                                  "`out = lm(ids)`")


# ------------------------------------------------------------------ the README example, recorded
def test_the_readme_culprit_points_at_its_model_line(demo_session):
    """bisect on the README example: #9 _softmax at examples/fp16_memory_attention.py:21, in its text (the
    line under the culprit) and in `bisect --json` (what the CLI prints of this result: ui/cli.py)."""
    result = Replay(fresh(demo_session)).bisect()
    lines = rendered(result).splitlines()
    assert lines[0].startswith("first divergent op: #9 _softmax")
    assert lines[1] == f"  at {shown(DEMO)}:{DEMO_LINE}  {DEMO_CODE}"
    op = json.loads(strict_json(result.to_json()))["op"]
    assert (op["index"], op["name"]) == (9, "_softmax")
    assert op["source_location"] == {"file": shown(DEMO), "line": DEMO_LINE, "code": DEMO_CODE}
    if Path.cwd().resolve() == ROOT:  # the README's spelling, from the repository root
        assert op["source_location"]["file"] == "examples/fp16_memory_attention.py"


def test_every_op_of_the_trace_knows_its_line(demo_session):
    lines = {op.index: op.source_location.line for op in demo_session.ops if op.source_location}
    assert lines[0] == 20 and lines[9] == DEMO_LINE and lines[17] == 22  # q = ..., softmax, self.out(...)
    assert demo_session.ops[-1].name == "output" and demo_session.ops[-1].source_location is None


def test_compare_and_show_headers_carry_the_model_line(demo_session):
    at = f"  at {shown(DEMO)}:{DEMO_LINE}  {DEMO_CODE}"
    for command, first in (("compare 9", "#9 _softmax (aten._softmax.default)"), ("show 9", "#9 _softmax  source op")):
        lines = repl_transcript(demo_session, command).splitlines()
        header = next(k for k, line in enumerate(lines) if line.startswith(first))
        assert lines[header + 1] == at
    assert "  at " not in repl_transcript(demo_session, "show output")  # the output tuple: no line of its own


def test_the_report_card_and_the_repro_readmes_name_the_model_line(demo_session, tmp_path):
    from tapml_dbg.engine.report import build_report
    from tapml_dbg.repro.carve import carve
    from tapml_dbg.repro.dump import dump_op
    from tapml_dbg.report.html import page

    session = fresh(demo_session)
    html = page(build_report(session))
    card = html[html.index('id="culprit"'):]
    assert (f"<tr><th>model line</th><td><code>{shown(DEMO)}:{DEMO_LINE}</code> "
            "<code>weights = torch.softmax(q @ self.keys.t(), dim=-1)</code></td></tr>") in card

    dump_op(session, "9", tmp_path / "repro")
    readme = (tmp_path / "repro" / "README.md").read_text()
    assert f"| model line | `{shown(DEMO)}:{DEMO_LINE}` `{DEMO_CODE}` |" in readme
    meta = json.loads((tmp_path / "repro" / "meta.json").read_text())
    assert meta["ops"][0]["source_location"] == {"file": shown(DEMO), "line": DEMO_LINE, "code": DEMO_CODE}

    carve(session, tmp_path / "suite", verify=True)  # checked on llvm: the README lists what failed
    readme = (tmp_path / "suite" / "README.md").read_text()
    assert f"- op 9 `_softmax` (aten._softmax.default) at `{shown(DEMO)}:{DEMO_LINE}` `{DEMO_CODE}`: fail" in readme


# ------------------------------------------------------------------ unknown locations and older traces
def _metrics() -> Metrics:
    return Metrics(max_abs_err=0.5, max_rel_err=0.3, scale_rel_err=1e-2, cosine=0.99, nan_mismatch=0,
                   inf_mismatch=0, mismatched=4, numel=16, passed=False, rtol=1e-4, atol=1e-6)


def test_an_unknown_location_renders_nothing_and_is_null_in_json():
    verdict = Verdict(3, "add", Mode.ISOLATED, Status.FAIL, [_metrics()])
    culprit = Culprit(3, "add", "aten.add.Tensor", "", "isolated", _metrics(), "")
    result = BisectResult(True, 5, 3, 0.5, "llvm", culprit, [StepResult(3, "add", "aten.add.Tensor", "", verdict)])
    assert result.to_json()["op"]["source_location"] is None
    assert "  at " not in rendered(result)
    located = Culprit(3, "add", "aten.add.Tensor", "", "isolated", _metrics(), "",
                      source_location=SourceLocation("m.py", 7, "y = x + 1  # [bold]not markup[/]"))
    result.culprit = located
    assert result.to_json()["op"]["source_location"] == {"file": "m.py", "line": 7,
                                                         "code": "y = x + 1  # [bold]not markup[/]"}
    assert rendered(result).splitlines()[1] == "  at m.py:7  y = x + 1  # [bold]not markup[/]"  # escaped


def test_an_old_trace_without_source_locations_still_opens(tmp_path):
    """The frozen fixtures, written before source locations: no op has one; compare and show print none."""
    from tapml_dbg.trace import TraceReader

    for fixture in OLD_FIXTURES:
        with TraceReader(fixture) as reader:
            assert reader.outline.ops and all(OpInfo.from_json(op).source_location is None for op in reader.outline.ops)
    with Session.open(OLD_FIXTURES[-1]) as session:  # the v1.1 one replays (v1.0's graph format is older)
        assert session.ops and all(op.source_location is None for op in session.ops)
        compare, show = repl_transcript(session, "compare 0"), repl_transcript(session, "show 0")
        assert compare.startswith("#0 ") and show.startswith("#0 ") and "  at " not in compare + show
    op = OpInfo.from_json({"index": 0, "name": "a", "op": "aten.relu.default", "relax_op": "relax.nn.relu",
                           "layer": "", "outputs": [{"shape": [2], "dtype": "float32"}]})
    assert op.source_location is None and op.outputs == [TensorSpec((2,), "float32")]
    assert OpInfo.from_json(op.to_json()) == op


def test_the_op_table_accepts_code_with_quotes_and_refuses_control_characters():
    code = 'x = torch.where(m, a, b)  # "quoted" \\ and \'single\''
    ok = validate_op_table([{"index": 0, "name": "a", "source_location": {"file": "m.py", "line": 3, "code": code}}])
    assert ok[0]["source_location"] == {"file": "m.py", "line": 3, "code": code}
    assert validate_op_table([{"index": 0, "name": "a"}])[0]["source_location"] is None
    for bad in ({"file": "m.py", "line": 3, "code": "x = 1\n!rm -rf"}, {"file": "m.py", "line": 3, "code": "\x1b[2J"},
                {"file": "m.py", "line": 0, "code": ""}, {"file": "", "line": 1, "code": ""},
                {"file": "m.py", "line": "3", "code": ""}, "m.py:3"):
        with pytest.raises(SchemaError):
            validate_op_table([{"index": 0, "name": "a", "source_location": bad}])
