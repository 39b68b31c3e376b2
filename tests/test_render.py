"""The one renderer: the CLI and the REPL draw a result the same way, markup escaped.

Results are built by hand (no model is recorded); the CLI runs in-process through `main` with
`Session.open` replaced by a stub session that returns the hand-built result.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tapml_dbg.engine.results import BisectResult, CompileReport, Culprit, StepResult
from tapml_dbg.judge.compare import Metrics, metrics_text
from tapml_dbg.judge.verdict import Mode, Status, Verdict
from tapml_dbg.record.recorder import RecordResult
from tapml_dbg.repro.carve import CarveResult
from tapml_dbg.repro.dump import DumpResult
from tapml_dbg.repro.files import human_bytes
from tapml_dbg.ui import cli
from tapml_dbg.ui.console import make_console
from tapml_dbg.ui.render import TraceSummary, render, size_text, verdict_cell
from tapml_dbg.ui.repl.app import Repl

MARKUP = "x[bold]y[/]"  # reads as rich markup unless escaped
JSON_TARGET = '{"kind":"llvm","mcpu":"haswell"}'  # braces: a str.format field unless kept out of formats
CULPRIT_INDEX = 13


def _metrics(rel: float, nan: int = 0, inf: int = 0) -> Metrics:
    return Metrics(max_abs_err=0.5, max_rel_err=0.3, scale_rel_err=rel, cosine=0.99, nan_mismatch=nan,
                   inf_mismatch=inf, mismatched=4, numel=16, passed=rel < 1e-3, rtol=1e-4, atol=1e-6)


def _isolated(index: int, name: str, status: str, rel: float) -> Verdict:
    return Verdict(index, name, Mode.ISOLATED, Status(status), [_metrics(rel)])


def bisect_result() -> BisectResult:
    """A divergence whose culprit and a neighbour carry markup in every text field."""
    name, op, layer, neighbour = f"gelu_{MARKUP}", f"aten.{MARKUP}", f"blocks.{MARKUP}", f"relu[/]{MARKUP}"
    rows = [StepResult(12, neighbour, "aten.relu.default", layer, isolated=_isolated(12, neighbour, "pass", 1e-7)),
            StepResult(CULPRIT_INDEX, name, op, layer, isolated=_isolated(CULPRIT_INDEX, name, "fail", 1e-2))]
    culprit = Culprit(CULPRIT_INDEX, name, op, layer, "isolated", _metrics(1e-2), "")
    return BisectResult(True, 26, 7, 1.25, "llvm", culprit, rows, notes=[f"note {MARKUP}"])


class StubSession:
    """Just enough of an engine session for `tapml-dbg bisect` and the REPL's `bisect`."""

    target = "llvm"

    def __init__(self, result: BisectResult):
        self.result = result

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        return None

    def close(self) -> None:  # the CLI's Replay closes the session it opened
        return None

    def bisect(self, sweep: bool = True, progress=None) -> BisectResult:
        return self.result

    def notice_transform_edit(self) -> str:
        return ""

    @property
    def observers(self):  # the REPL's Debugger follows what the session forgot
        return self

    def observe(self, _listener) -> None:
        return None


def cli_output(monkeypatch, capsys, result: BisectResult) -> str:
    from tapml_dbg.engine.session import Session

    monkeypatch.setattr(Session, "open", classmethod(lambda cls, *args, **kwargs: StubSession(result)))
    assert cli.main(["bisect", "stub.h5"]) == 0
    return capsys.readouterr().out


def repl_output(result: BisectResult) -> str:
    buffer = io.StringIO()
    console = make_console(buffer)
    repl = Repl(StubSession(result), out=console, err=console, show_progress=False)
    assert repl.execute("bisect").ok
    return buffer.getvalue()


def test_cli_bisect_shows_markup_literally_and_no_propagated_column(monkeypatch, capsys):
    out = cli_output(monkeypatch, capsys, bisect_result())
    assert f"first divergent op: #{CULPRIT_INDEX} gelu_{MARKUP} (aten.{MARKUP}) in layer blocks.{MARKUP}" in out
    assert f"relu[/]{MARKUP}" in out and f"note: note {MARKUP}" in out
    header = next(line for line in out.splitlines() if "source op" in line)
    assert header.split() == ["#", "name", "source", "op", "layer", "isolated"]
    assert "propagated" not in out.split("next:")[0]


def test_cli_bisect_ends_with_the_commands_to_run_next(monkeypatch, capsys):
    """The README's first command ended on a note and no next step."""
    lines = cli_output(monkeypatch, capsys, bisect_result()).rstrip().splitlines()
    tail = [line.split("  #")[0].strip() for line in lines[-4:]]
    assert tail == [f"next: tapml-dbg dump stub.h5 --op {CULPRIT_INDEX} -o repro/",
                    "tapml-dbg report stub.h5 -o report/", f'tapml-dbg replay stub.h5 -c "compare {CULPRIT_INDEX}"',
                    f"tapml-dbg bisect stub.h5 --keep {CULPRIT_INDEX}"]  # then past it: the next divergence
    from tapml_dbg.engine.session import Session

    monkeypatch.setattr(Session, "open", classmethod(lambda cls, *a, **k: StubSession(bisect_result())))
    assert cli.main(["bisect", "my trace.h5", "--target", JSON_TARGET, "--transform", "f.py:g"]) == 0
    first = capsys.readouterr().out.split("next: ")[1].split("  #")[0]
    assert first == (f"tapml-dbg dump 'my trace.h5' --op {CULPRIT_INDEX} -o repro/ --target '{JSON_TARGET}' "
                     "--transform f.py:g")  # copyable: the options as given, quoted for the shell


def test_repl_and_cli_render_a_bisect_the_same_then_each_hints_its_own_commands(monkeypatch, capsys):
    result = bisect_result()
    cli_text, repl_text = cli_output(monkeypatch, capsys, result), repl_output(result)
    shared = cli_text.split("next:")[0]
    assert repl_text.startswith(shared)
    hint = repl_text[len(shared):].strip()
    assert hint.startswith(f"next: `dump {CULPRIT_INDEX} DIR` (a standalone repro)") and "\n" not in hint


def test_no_divergence_suggests_the_picture():
    clean = BisectResult(False, 26, 5, 0.5, "llvm", notes=[MARKUP])
    text = repl_output(clean)
    assert "no divergence: 26 ops checked on llvm" in text and f"note: {MARKUP}" in text
    assert text.rstrip().splitlines()[-1] == "  next: `plot` (how close every op came to its tolerance)"


def _text(result) -> str:
    buffer = io.StringIO()
    render(result, Console(file=buffer, width=200, color_system=None))
    return buffer.getvalue()


PATH = f"/tmp/{MARKUP}"
ESCAPED_RESULTS = {
    "record": RecordResult(path=Path(PATH), ops=26, seconds=1.5, eager_seconds=0.01, helper_ops=3, file_bytes=2048),
    "dump": DumpResult(index=3, name=MARKUP, op="aten.mm.default", layer="", path=PATH, bytes=2048, target="llvm",
                       status="fail"),
    "carve": CarveResult(tests=2, path=PATH, bytes=2048, skipped=[f"op 1 {MARKUP} left out"]),
    "compile": CompileReport(target="llvm", ops=26, failures=[{"verdict": "compile-error", "index": 3,
                                                               "name": MARKUP, "op": "aten.mm.default",
                                                               "message": MARKUP}]),
}


FIRST_WORDS = {"record": "recorded", "dump": "wrote repro", "carve": "carved", "compile": "compiled"}


@pytest.mark.parametrize("kind", sorted(ESCAPED_RESULTS))
def test_cli_results_escape_paths_names_and_messages(kind):
    text = _text(ESCAPED_RESULTS[kind])
    assert text.startswith(FIRST_WORDS[kind]) and MARKUP in text


def test_cli_result_wording_is_kept():
    assert _text(ESCAPED_RESULTS["dump"]).strip() == (f"wrote repro of op #3 {MARKUP} to {PATH} (2.0 KiB); "
                                                      f"run: python {PATH}/repro.py")
    assert _text(ESCAPED_RESULTS["carve"]).startswith(f"carved 2 op tests into {PATH} (2.0 KiB); run: pytest {PATH}")
    assert "compiled 26 ops for llvm: 1 failed" in _text(ESCAPED_RESULTS["compile"])
    assert _text(ESCAPED_RESULTS["record"]).startswith(f"recorded 26 ops to {PATH} (2.0 KiB) in 1.50 s")


def test_trace_summary_from_info_dict():
    info = {"path": PATH, "format": "v1.1", "model": "m.py", "source": "torch", "versions": {"tvm": "0.27"},
            "created": "today", "complete": False, "num_ops": 26, "recorded_ops": 10, "num_layers": 4,
            "num_inputs": 1, "num_params": 8, "file_bytes": 2048, "activation_bytes": 1024,
            "eager_output_max_abs_diff": 0.0, "import_fixes": [], "capture": None, "stats_only_ops": 0,
            "record_seconds": 1.0, "ops": [{"index": 0}]}
    text = _text(TraceSummary.from_info(info))
    assert PATH in text and "NO: 10 of 26 ops recorded" in text and "bit-exact" in text and "2.0 KiB" in text


def test_cli_error_line_is_escaped(capsys, tmp_path):
    assert cli.main(["info", str(tmp_path / f"{MARKUP}.h5")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and MARKUP in err


@pytest.mark.parametrize("count, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536 * 1024, "1.5 MiB"),
                                         (3 * 2**30, "3.0 GiB"), (5 * 2**40, "5120.0 GiB")])
def test_human_bytes(count, text):
    assert human_bytes(count) == text


def test_size_text_of_an_unknown_size():
    assert size_text(None) == "?" and size_text(2048) == "2.0 KiB"


def test_metrics_text_full_and_compact():
    plain = _metrics(1e-2)
    assert metrics_text(plain) == "max_abs=0.5 rel=0.01 cos=0.990000"
    assert metrics_text(plain, compact=True) == "rel=1.0e-02"
    assert metrics_text(_metrics(1e-2, nan=3)) == "max_abs=0.5 rel=0.01 cos=0.990000 nan!=3"
    assert metrics_text(_metrics(1e-2, inf=2), compact=True) == "rel=1.0e-02 inf!=2"
    shape = Metrics(shape_mismatch="(2,) vs (3,)", passed=False)
    assert metrics_text(shape) == metrics_text(shape, compact=True) == "shape (2,) vs (3,)"


def test_every_summary_uses_the_one_wording():
    verdict = _isolated(1, "a", "fail", 1e-2)
    culprit = Culprit(1, "a", "aten.a", "", "isolated", _metrics(1e-2))
    assert verdict.summary == culprit.summary == _metrics(1e-2).summary() == metrics_text(_metrics(1e-2))
    assert verdict_cell(verdict) == f"[bold red]FAIL[/] {metrics_text(_metrics(1e-2), compact=True)}"


# ------------------------------------------------------------------ nothing cut, at 80 columns or piped
LONG_NAME = "_native_batch_norm_legit_no_training_p0"
LONG_OP = "aten._native_batch_norm_legit_no_training.default"
LONG_LAYER = "features.0.block.1.bn"


def _long_results():
    from tapml_dbg.model.graph import OpInfo, TensorSpec
    from tapml_dbg.ui.repl import results as R

    verdict = _isolated(CULPRIT_INDEX, LONG_NAME, "fail", 1.1919e-2)
    rows = [StepResult(CULPRIT_INDEX, LONG_NAME, LONG_OP, LONG_LAYER, isolated=verdict)]
    culprit = Culprit(CULPRIT_INDEX, LONG_NAME, LONG_OP, LONG_LAYER, "isolated", _metrics(1.1919e-2))
    bisect = BisectResult(True, 26, 7, 1.25, "llvm", culprit, rows)
    op = OpInfo(CULPRIT_INDEX, LONG_NAME, LONG_OP, "relax.nn.batch_norm", LONG_LAYER,
                outputs=[TensorSpec((2, 8, 16, 16), "float32"), TensorSpec((8,), "float32")])
    ops = R.OpsResult([R.OpRow(op, True, False, rows[0])], 1, "")
    return {"bisect": bisect, "ops": ops}


@pytest.mark.parametrize("kind", ["bisect", "ops"])
@pytest.mark.parametrize("where", ["terminal-80", "pipe"])
def test_tables_never_cut_names_or_numbers(kind, where):
    """`_native_batch_norm_leg…` and `1.19e-…`: names must survive to be copied into the next command."""
    buffer = io.StringIO()
    console = (Console(file=buffer, width=80, force_terminal=True, color_system=None) if where == "terminal-80"
               else make_console(buffer))
    render(_long_results()[kind], console)
    text = buffer.getvalue()
    assert "…" not in text
    row = next(line for line in text.splitlines() if line.split()[:2] in (["→", str(CULPRIT_INDEX)], [str(CULPRIT_INDEX), LONG_NAME]))
    for word in (LONG_NAME, LONG_OP, LONG_LAYER, "rel=1.2e-02" if kind == "bisect" else "float32"):
        assert word in row.split(), (word, row)  # whole, on the op's one row


def test_messages_are_cut_on_a_terminal_only():
    """A compile error's message is cut to one line on a terminal; piped (or in a file) it is whole."""
    message = "InternalError: Check failed: (t.MatchesCode(DLDataTypeCode::kDLFloat)) is false: " + "x" * 80
    from tapml_dbg.engine.triage import CauseGroup, TriagedOp, TriageResult

    op = TriagedOp(3, "cumsum", "aten.cumsum.default", "lm", "compile-error", message)
    triaged = TriageResult("llvm", 9, [CauseGroup("cumsum: compile-error", "compile-error", [op])])
    terminal, pipe = io.StringIO(), io.StringIO()
    render(triaged, Console(file=terminal, width=200, force_terminal=True, color_system=None))
    render(triaged, make_console(pipe))
    assert "…" in terminal.getvalue() and message not in terminal.getvalue()
    assert "…" not in pipe.getvalue() and message in pipe.getvalue()


def test_the_progress_label_is_text_not_a_format(capsys):
    """A JSON target in the label raised KeyError('"kind"') inside rich (the label was a format string)."""
    from tapml_dbg.ui.console import progress

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with progress(f"step on {JSON_TARGET} {MARKUP}", console, show=True) as report:
        report(1, 2, f"#0 {MARKUP} {{x}}")
    assert JSON_TARGET in buffer.getvalue() and MARKUP in buffer.getvalue()


# ------------------------------------------------------------------ --help and --version
def test_help_opens_with_what_the_tool_does_and_every_option_says_what_it_is(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Argument parsing only" not in out
    assert out.split("\n\n")[1].startswith("Record a model's every operator once on PyTorch")
    assert "tapml-dbg bisect traces/demo.h5" in out
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    missing = [f"{name} {action.dest}" for name, sub in subcommands.choices.items() for action in sub._actions
               if action.help is None]
    assert not missing, missing
    assert all(sub.description for sub in subcommands.choices.values())
    assert "JSON dict" in subcommands.choices["replay"].format_help()  # the only target form TVM 0.27 takes


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("tapml-dbg 0.1.0 (apache-tvm ") and "torch " in out
