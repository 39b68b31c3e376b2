"""The replay REPL, driven like pdb's session tests: a scripted session in, a transcript out.

One trace of examples/mlp.py is recorded per test run; most tests share one engine session
with a planted fault (`scale` on op 13, gelu_1), each with a fresh REPL state.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

import fork_cli
from conftest import PLANTED_OP, fault_transform, fresh
from tapml_dbg.engine.session import Session
from tapml_dbg.ui.repl import commands as C
from tapml_dbg.ui.repl.app import Repl, make_console
from tapml_dbg.ui.repl.completion import suggest
from tapml_dbg.ui.repl.parsing import ArgError, parse_slice, split_commands

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "transforms" / "faults.py"
FAULT_OP = PLANTED_OP  # op 13, layer blocks.1
FAULT_INDEX = 13


@pytest.fixture(scope="session")
def trace(traces) -> Path:
    """examples/mlp.py recorded once per test run (shared by the REPL test files)."""
    return traces.get("mlp")


@pytest.fixture(scope="session")
def faults(planted_faults) -> Path:
    """tests/transforms/faults.py planting on FAULT_OP (conftest.planted_faults)."""
    return planted_faults


@pytest.fixture(scope="session")
def faulty_session(planted_mlp):
    """An engine session whose target multiplies gelu_1's result by 1.01 (conftest.planted_mlp)."""
    return planted_mlp


class Transcript:
    """A REPL whose output (and errors) land in one string, like a terminal would show them."""

    def __init__(self, session):
        fresh(session)
        self.buffer = io.StringIO()
        console = make_console(self.buffer)
        self.repl = Repl(session, out=console, err=console, launch={"trace": str(session.reader.path)},
                         show_progress=False)

    def run(self, *lines: str) -> str:
        start = self.buffer.tell()
        for line in lines:
            self.repl.execute(line)
        return self.buffer.getvalue()[start:]

    def interact(self, keys: str) -> str:
        """Type `keys` into the real prompt-toolkit loop through a pipe."""
        from prompt_toolkit.history import InMemoryHistory
        from prompt_toolkit.input import create_pipe_input
        from prompt_toolkit.output import DummyOutput

        start = self.buffer.tell()
        with create_pipe_input() as pipe:
            pipe.send_text(keys)
            code = self.repl.interact(input=pipe, output=DummyOutput(), history=InMemoryHistory())
        assert code == 0
        return self.buffer.getvalue()[start:]


@pytest.fixture
def t(faulty_session) -> Transcript:
    return Transcript(faulty_session)


def lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def verdict_rows(text: str) -> list[list[str]]:
    """The `verdict` rows of `compare` tables."""
    return [line.split() for line in text.splitlines() if line.startswith("verdict ")]


# ------------------------------------------------------------------ parsing and completion (no engine)
def test_slices_parse_without_eval():
    assert parse_slice("0,:4") == (0, slice(None, 4))
    assert parse_slice("...,-1") == (Ellipsis, -1)
    assert parse_slice("[1:8:2]") == (slice(1, 8, 2),)
    for bad in ("__import__('os')", "0,,1", "1:2:3:4", "a:b", "::0", "...,..."):
        with pytest.raises(ArgError):
            parse_slice(bad)


def test_split_commands_respects_quotes_and_comments():
    assert split_commands("step 2; where;; ops 'a;b'\n# note\nquit") == ["step 2", "where", "ops 'a;b'", "quit"]


def test_help_is_generated_from_the_table(t):
    out = t.run("help")
    for command in C.COMMANDS:
        assert command.usage.split()[0] in out
    out = t.run("help continue")
    assert "usage: continue" in out and "aliases: c, cont" in out and "new divergence" in out


def test_the_commands_both_front_ends_share_are_declared_once():
    """bisect, run, migrate, triage and dump: the CLI's options and the REPL's usage, help and parsing from
    one entry of the table of commands (tapml_dbg.api.COMMANDS)."""
    import argparse
    import re

    from tapml_dbg.api import COMMANDS, find_command
    from tapml_dbg.ui import cli, verbs

    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    shared = [entry for entry in COMMANDS if entry.repl_help is not None]
    assert {entry.name for entry in shared} == {"bisect", "run", "migrate", "triage", "dump"}
    for entry in COMMANDS:
        assert subcommands[entry.name].description[1:].startswith(entry.summary[1:])
        cli_options = {a.option_strings[-1]: a for a in subcommands[entry.name]._actions if a.option_strings}
        for option in (arg for arg in entry.arguments if not arg.positional):
            assert cli_options[option.flag].help == option.help
            assert tuple(cli_options[option.flag].choices or ()) == option.choices
    for entry in shared:
        command = C.lookup(entry.name)
        assert (command.usage, command.help) == (verbs.usage(entry), entry.repl_help)
    assert C.lookup("migrate").usage == "migrate [--by layer|op] [--one-at-a-time]"
    bisect, migrate = find_command("bisect"), find_command("migrate")
    assert verbs.parse(bisect, []) == {"no_sweep": False} and verbs.parse(bisect, ["--no-sweep"]) == {"no_sweep": True}
    assert verbs.parse(migrate, ["--one-at-a-time", "--by", "op"]) == {"by": "op", "one_at_a_time": True}
    for words in (["--by"], ["layer"]):
        with pytest.raises(ArgError, match=re.escape("give --by layer|op and/or --one-at-a-time")):
            verbs.parse(migrate, words)


def test_suggest_commands_ops_layers_keywords(faulty_session):
    names = lambda text: [s.text for s in suggest(text, len(text), faulty_session)]
    assert names("ste") == ["step"]
    assert "continue" in names("co") and "compare" in names("co")
    assert names("show gelu_") == ["gelu_1", "gelu_2"]
    assert names("break blocks.1.") == ["blocks.1.norm", "blocks.1.fc"]
    assert {"nan", "diverge"} <= set(names("break "))
    assert names("offload re") == ["remove"]
    assert names("tol op gelu_1 ") == ["clear"]
    assert "propagated" in names("tol p")
    assert names("mode i") == ["isolated"]
    assert names("help bis") == ["bisect"]
    assert names("show layer_norm_2") == ["native_layer_norm_2"]  # substring when no prefix matches
    assert names("frobnicate ") == []
    first = suggest("show gelu_", len("show gelu_"), faulty_session)[0]
    assert first.start == -len("gelu_") and first.kind == "op" and first.meta == "#13 aten.gelu.default"


def test_prompt_toolkit_completer_only_maps_suggest(faulty_session):
    from prompt_toolkit.document import Document

    from tapml_dbg.ui.repl.completion import make_completer

    completions = list(make_completer(faulty_session).get_completions(Document("print gelu"), None))
    assert [(c.text, c.start_position) for c in completions] == [("gelu", -4), ("gelu_1", -4), ("gelu_2", -4)]
    assert completions[1].display_meta_text == "#13 aten.gelu.default"


# ------------------------------------------------------------------ scripted sessions through the real prompt
def test_prompt_session_step_where_typo(t):
    out = t.interact("step 2\rw\rstpe\rshow nosuchop\rlayers\r\x04")
    assert lines_with(out, "#0 ")[0].split()[:2] == ["#0", "permute"]
    assert "#1    addmm_p0" in out
    assert "next op  #2 addmm (aten.addmm.default) in layer proj  [2/26]" in out
    assert "error: unknown command 'stpe'; did you mean `step`?" in out
    assert "error: no op named 'nosuchop'" in out
    assert "blocks.1.fc" in out  # the session went on after the errors
    assert out.rstrip().endswith("quit")  # Ctrl-D leaves
    assert "Traceback" not in out


def test_prompt_shows_position_and_target(t):
    assert t.repl.prompt_text() == "(llvm) #0 permute [proj]> "
    t.run("step 24")
    assert t.repl.prompt_text() == "(llvm) #24 _softmax [<top>]> "
    t.run("step 5")
    assert t.repl.prompt_text() == "(llvm) #26 <end>> "


def test_failed_commands_stay_out_of_the_history(t):
    """A typo came back from Up and as a grey auto-suggestion: only commands that ran are kept."""
    from prompt_toolkit.history import InMemoryHistory
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    history = InMemoryHistory()  # what open_history's file would be: it only ever sees kept lines
    history.store_string("layers")  # from an earlier session
    with create_pipe_input() as pipe:
        pipe.send_text("stpe\rwhere\rstep x\rshow nosuchop\rstep 1\r\x04")
        assert t.repl.interact(input=pipe, output=DummyOutput(), history=history) == 0
    assert list(history.load_history_strings()) == ["step 1", "where", "layers"]  # newest first


def test_ctrl_c_at_the_prompt_clears_the_line(t):
    out = t.interact("stpe\x03where\r\x04")
    assert "unknown command" not in out and "next op  #0 permute" in out


# ------------------------------------------------------------------ finding the planted fault
def test_continue_stops_at_the_planted_fault(t):
    out = t.run("continue")
    assert "ran #0..#13 (14 ops): 13 passed, 1 failed (isolated or propagated verdict)" in out
    assert "stopped after #13 gelu_1: divergence: the isolated and propagated verdicts failed" in out
    assert "the op alone, fed the recorded source inputs, is wrong on the target: a kernel or codegen bug" in out
    assert out.rstrip().splitlines()[-1].startswith("  next: `compare 13`")  # the result ends with what to run
    assert t.repl.prompt_text() == "(llvm) #14 add_1 [blocks.1]> "
    out = t.run("where")
    assert "last op  #13 gelu_1  isolated FAIL rel=1.0e-02  propagated FAIL" in out
    # downstream failures are inherited (isolated passes): continue runs on to the end
    out = t.run("continue")
    assert "(inherited)" in lines_with(out, "#14   add_1")[0]
    assert "end of the trace" in out and "stopped" not in out


def test_isolated_mode_and_break_diverge(t):
    out = t.run("mode isolated", "break diverge", "continue")
    assert "stopped after #13 gelu_1: breakpoint 1 (diverge)" in out
    out = t.run("mode propagated", "step 3")
    # with `break diverge`, inherited failures stop `step N` too
    assert len(lines_with(out, "isolated pass")) == 1 and "stopped after #14 add_1: breakpoint 1 (diverge)" in out


def test_bisect_finds_the_planted_fault(t):
    out = t.run("bisect")
    assert "first divergent op: #13 gelu_1 (aten.gelu.default) in layer blocks.1" in out
    assert "verdict: isolated" in out
    assert lines_with(out, "→")[0].split()[:3] == ["→", "13", "gelu_1"]


def test_plot_marks_the_fault_and_its_layer_range(t):
    out = t.run("plot")
    lines = out.splitlines()
    marker = next(line for line in lines if "▼" in line)
    assert marker.strip() == "▼ #13 gelu_1"
    column = marker.index("▼")
    at_column = {line.split()[0]: line[column] for line in lines if "┤" in line and len(line) > column}
    rows = list(at_column)  # labels from the top (largest error) down
    tolerance = next(r for r, c in at_column.items() if c == "┄")  # the noise-floor bound ([8]), ~3e-05 here
    assert rows.index(next(r for r, c in at_column.items() if c == "✖")) < rows.index(tolerance)
    assert "first divergence: #13 gelu_1 (isolated)" in out and "next: `compare 13`" in out
    out = t.run("plot blocks.2", "plot 3:1")
    assert "ops 15..20" in out and out.splitlines()[1].strip() == ""  # no marker: the culprit is upstream
    assert "first divergence: #13 gelu_1 (isolated), before these ops" in out  # the rule runs from op 0
    assert "error: `3:1` selects no op" in out


def test_breakpoints_on_op_and_layer(t):
    out = t.run("break addmm_1", "break blocks.2", "break 99", "break blocks.7", "break")
    assert "breakpoint 1: op #6 addmm_1" in out and "breakpoint 2: layer blocks.2 (6 ops)" in out
    assert "error: op index 99 is out of range (0..25)" in out
    assert "error: no op or layer named 'blocks.7'; did you mean" in out
    out = t.run("continue")
    assert "stopped after #6 addmm_1: breakpoint 1 (op addmm_1)" in out
    out = t.run("delete 1", "continue")
    assert "deleted 1 breakpoint(s)" in out and "stopped after #13 gelu_1" in out  # the divergence first
    out = t.run("continue")
    assert "stopped after #15 native_layer_norm_2: breakpoint 2 (layer blocks.2)" in out
    out = t.run("delete 5", "delete", "break")
    assert "error: delete: no breakpoint 5" in out and "usage: delete [N]" in out and "no breakpoints" in out


def test_next_runs_to_the_end_of_the_layer(t):
    out = t.run("next")
    assert [line.split()[0] for line in lines_with(out, "isolated")] == ["#0", "#1", "#2"]
    out = t.run("next", "next")
    assert [line.split()[0] for line in lines_with(out, "isolated")] == ["#3", "#4", "#5", "#6"]


def test_compare_and_print_side_by_side(t):
    out = t.run(f"compare {FAULT_OP}")
    assert "#13 gelu_1 (aten.gelu.default) in layer blocks.1" in out
    assert verdict_rows(out) == [["verdict", "FAIL", "FAIL"]]
    assert lines_with(out, "err / absmax")[0].split()[3:6] == ["0.01", "(rtol", "0.0001)"]
    assert "→ the op alone, fed the recorded source inputs, is wrong on the target: a kernel or codegen bug" in out
    out = t.run(f"print {FAULT_OP} 0,:4")
    assert "#13 gelu_1[0,:4]  (4,) float32  (target value: propagated)" in out
    assert lines_with(out, "absmax")[0].split()[0] == "absmax"
    source, target = lines_with(out, "[")[-1].split("]  [")
    values = [float(v) for v in source.strip(" [").split()], [float(v) for v in target.strip(" ]").split()]
    assert len(values[0]) == 4 and all(abs(b - 1.01 * a) < 1e-4 for a, b in zip(*values))  # the planted 1.01
    out = t.run("print gelu_1 0,:4:0", "print gelu_1 7", "print gelu_1 __import__('os')")
    assert "error: print: bad slice item ':4:0': the step cannot be 0" in out
    assert "does not fit shape (4, 32)" in out
    assert out.count("usage: print OP [SLICE]") == 3


def test_print_of_an_op_that_is_not_offloaded(t):
    out = t.run("boundary blocks.0", "print 9 0,:2", "print 9 0,:2")
    assert "boundary 9: ops [0, 9) run on the target" in out and "offload  0..8 (9 of 26 ops)" in out
    # the propagated value of an op outside the offload set, the same on every call
    assert out.count("#9 native_layer_norm_1[0,:2]  (2,) float32  (target value: propagated, op not offloaded)") == 2
    assert "no target value" not in out
    assert "native_layer_norm_1" not in t.repl.session.replay.values  # downstream still reads the source
    out = t.run("mode isolated", "print 9 0,:2")
    assert "(target value: isolated, op not offloaded)" in out


def test_tolerance_changes_verdicts(t):
    held = t.repl.session.verdicts.policy
    as_it_was = held.to_json()
    out = t.run("tol op gelu_1 0.5", f"compare {FAULT_OP}", "tol")
    assert "op #13 gelu_1: rtol=0.5 atol=1e-06" in out
    # replaced through Verdicts.set_policy, never changed in place: whoever holds the old one keeps it
    assert t.repl.session.verdicts.policy is not held and held.to_json() == as_it_was
    assert verdict_rows(out) == [["verdict", "pass", "pass"]]
    assert "op gelu_1   0.5" in out
    out = t.run("tol float32 x", "tol propagated 0", "tol int8 1", "tol reset", f"compare {FAULT_OP}")
    assert "RTOL must be a number" in out and "FACTOR must be a finite positive number" in out
    assert "expected a dtype" in out and "tolerances back to the defaults" in out
    assert verdict_rows(out) == [["verdict", "FAIL", "FAIL"]]


def test_a_pass_edited_between_commands_is_noticed(trace, tmp_path):
    """The engineer fixes the pass between two commands: the REPL says so, and the verdicts come
    from the new text (kept, the first compare's cached isolated FAIL would be shown again)."""
    planted = fault_transform(tmp_path, "scale", FAULT_OP)
    file = Path(planted.rpartition(":")[0])
    with Session.open(trace, transform=planted) as session:
        t = Transcript(session)
        out = t.run(f"compare {FAULT_OP}")
        assert verdict_rows(out) == [["verdict", "FAIL", "FAIL"]] and "changed since" not in out
        file.write_text(file.read_text() + "\nSETTINGS = {'op': 'no_such_op'}  # the fix\n")
        assert t.repl.debugger.seen
        out = t.run("where")
        assert "changed since the last command" in out and not t.repl.debugger.seen
        out = t.run(f"compare {FAULT_OP}")
        assert verdict_rows(out) == [["verdict", "pass", "pass"]]
        assert "changed since" not in t.run(f"compare {FAULT_OP}")


def test_ops_layers_info_offload(t):
    out = t.run("ops gelu", "ops 3:5", "ops 'add*'", "ops nothing_like_this")
    assert [line.split()[1] for line in lines_with(out, "aten.gelu")] == ["gelu", "gelu_1", "gelu_2"]
    assert [line.split()[0] for line in lines_with(out, "float32")][3:5] == ["3", "4"]
    assert "no op matches 'nothing_like_this'" in out
    out = t.run("layers", "info")
    assert "    blocks.1.fc    10..12      3" in out
    assert "transform        " in out and "faults.py:scale" in out
    out = t.run("offload remove blocks.1", "offload add 10:11", "offload add", "offload frob 1")
    assert "offload  0..8, 15..25 (20 of 26 ops)" in out and "offload  0..8, 10, 15..25 (21 of 26 ops)" in out
    assert "error: offload: missing argument" in out and "expected add or remove" in out


def test_offload_counts_what_changed(t):
    """`offload remove LAYER` said "removed 6 op(s)" again when none of them was in the set any more."""
    out = t.run("offload remove blocks.1", "offload remove blocks.1", "offload add 9:12", "offload add 9:12")
    lines = [line for line in out.splitlines() if line.startswith(("removed", "added"))]
    assert lines == ["removed 6 op(s)", "removed 0 op(s) (6 of the 6 selected were not offloaded)",
                     "added 3 op(s)", "added 0 op(s) (3 of the 3 selected were already offloaded)"]


def test_show_op(t):
    out = t.run("show 13")
    assert "#13 gelu_1  source op aten.gelu.default  relax op relax.nn.gelu" in out
    assert "addmm_2  op #12  (4, 32) float32" in out
    assert "R.nn.gelu(addmm_2)" in out


def test_errors_never_show_a_traceback(t, monkeypatch):
    def broken():
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(t.repl.session.op_table, "layers", broken)
    monkeypatch.delenv("TAPML_DEBUG", raising=False)
    out = t.run("layers", "step x", "step 1 2", "where")
    assert "internal error: RuntimeError: boom (set TAPML_DEBUG=1 for the traceback)" in out
    assert "second line" not in out and "Traceback" not in out
    assert "error: step: N must be an integer, not 'x'" in out and "usage: step [N]" in out
    assert "error: step: too many arguments: 2" in out
    assert "next op  #0 permute" in out
    monkeypatch.setenv("TAPML_DEBUG", "1")
    assert "Traceback" in t.run("layers")


def test_ctrl_c_cancels_a_long_command_and_the_session_goes_on(t, monkeypatch):
    session = t.repl.session

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    real_run_op = session.run_op
    calls = []

    def run_op_then_interrupt(index):
        calls.append(index)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the executor kills its worker and re-raises
        return real_run_op(index)

    monkeypatch.setattr(session, "bisect", interrupted)
    monkeypatch.setattr(session, "run_op", run_op_then_interrupt)
    out = t.run("bisect", "step 5", "where")
    assert out.splitlines()[0] == "cancelled"
    assert "cancelled after 2 op(s)" in out
    assert "next op  #2 addmm" in out
    outcome = t.repl.execute("bisect")
    assert outcome.cancelled and not outcome.quit
    assert t.repl.run_commands(["bisect", "where"]) == 130  # a script stops on Ctrl-C


def test_dump_reports_in_one_line(t, tmp_path):
    out = t.run(f"dump {FAULT_OP} {tmp_path / 'repro'}", "dump", "dump nosuchop x")
    assert "Traceback" not in out
    first = out.splitlines()[0]
    assert first.startswith("wrote repro of op #13 gelu_1") or first.startswith("error: dump")
    assert "usage: dump OP DIR" in out and "no op named 'nosuchop'" in out


def test_reset_and_quit(t):
    out = t.run("step 3", "reset", "where")
    assert "back to op 0" in out and "next op  #0 permute" in out
    assert t.repl.execute("quit").quit
    assert t.repl.run_commands(["where", "quit", "step"]) == 0
    assert "isolated" not in t.buffer.getvalue().split("quit")[-1]


# ------------------------------------------------------------------ the real CLI, non-interactively
def _cli(trace: Path, *args: str, fault: str | None = None, faults: Path = FAULTS) -> subprocess.CompletedProcess:
    env = dict(os.environ, TAPML_FAULT_OP=FAULT_OP)
    command = fork_cli.SERVER.command("replay", str(trace))  # `python -m tapml_dbg replay TRACE` (conftest.run_cli)
    if fault:
        command += ["--transform", f"{faults}:{fault}"]
    return subprocess.run(command + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_cli_commands_exit_0(trace):
    """Also: `replay --parallel N` was parsed and then dropped (the session got the default one lane)."""
    done = _cli(trace, "--parallel", "2", "-c", "where; ops gelu; layers; info; quit; step")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "llvm (local, 2 lanes)" in out
    assert "(llvm) #0 permute [proj]> where" in out  # each command is echoed after the prompt
    assert "next op  #0 permute (aten.permute.default) in layer proj  [0/26]" in out
    assert "    blocks.1.fc    10..12      3" in out
    assert "(llvm) #0 permute [proj]> quit" in out and "> step" not in out  # quit ends the script
    assert done.stderr == ""


def test_cli_script_finds_the_fault_and_fails_on_a_bad_command(trace, faults, tmp_path):
    script = tmp_path / "session.tapml"
    script.write_text("# find the fault\nshwo 13\nshow nosuchop\nprint 13 0,:2\n")
    done = _cli(trace, "-c", "break nan; continue; compare", "--script", str(script), fault="nan", faults=faults)
    assert done.returncode == 1
    out = done.stdout
    assert "stopped after #13 gelu_1: breakpoint 1 (nan); divergence: the isolated and propagated verdicts failed" in out
    assert lines_with(out, "nan / inf mismatch")[0].split()[-6:] == ["128", "/", "0", "128", "/", "0"]
    assert "error: unknown command 'shwo'; did you mean `show`?" in done.stderr
    assert "error: no op named 'nosuchop'" in done.stderr
    assert "#13 gelu_1[0,:2]" in out  # commands after a failure still run
    assert [line.split() for line in out.splitlines() if line.startswith("nan  ")] == [["nan", "0", "2"]]
    assert "Traceback" not in done.stderr


def test_a_missing_script_fails_before_the_session_opens(tmp_path):
    import argparse

    from tapml_dbg.ui.cli import main
    from tapml_dbg.errors import UsageError
    from tapml_dbg.ui.repl.app import run_replay

    args = argparse.Namespace(trace=str(tmp_path / "no-trace.h5"), commands=None, script=str(tmp_path / "none.txt"))
    with pytest.raises(UsageError, match="cannot read the script"):
        run_replay(args)
    assert main(["replay", str(tmp_path / "no-trace.h5"), "-c", "where"]) == 1  # no such trace: one line, exit 1


# ------------------------------------------------------------------ one verdict story, any target string
def test_continue_and_bisect_tell_one_story_on_the_readme_example(demo_session):
    """The README's first example: bisect's sweep finds #9 _softmax (isolated; the error washes out
    downstream) while `continue` in propagated mode said all 19 ops pass. Both now stop at #9, by the
    engine's one rule (isolated failures stop `continue` too), and end with the command to run next.
    The README's transcripts show the same trace's `continue` (twice: #9, then #11 mm_1) and
    `tapml-dbg bisect` byte for byte; here the REPL's own bisect, and the looser propagated policy."""
    t = Transcript(demo_session)
    out = t.run("continue")
    assert "ran #0..#9 (10 ops): 9 passed, 1 failed (isolated or propagated verdict)" in out
    # [8]: against the float64 reference the error reaches the softmax's value in the model too
    assert "stopped after #9 _softmax: divergence: the isolated and propagated verdicts failed" in out
    assert out.rstrip().splitlines()[-1].startswith("  next: `compare 9` (both verdicts side by side), `dump 9 DIR`")
    out = t.run("bisect")
    assert "first divergent op: #9 _softmax (aten._softmax.default)" in out
    assert out.rstrip().splitlines()[-1].startswith("  next: `dump 9 DIR` (a standalone repro)")
    # the case, under the fixed policy: the error washes out under the 10x looser propagated
    # tolerance, so only the isolated verdict fails; `continue` still stops where bisect points
    out = t.run("mode propagated", "tol fixed", "reset", "continue")
    assert "stopped after #9 _softmax: divergence: the isolated verdict failed (the propagated verdict passes)" in out
    assert "with the target's own upstream values it stays within the looser propagated tolerance" in out
    assert "first divergent op: #9 _softmax" in t.run("bisect")


JSON_TARGET = '{"kind":"llvm"}'  # the target "llvm" spelled as JSON: the units the suite compiled for llvm serve it


def test_a_json_target_string_in_the_progress_bar(trace):
    """`--target '{"kind":"llvm",...}'`: `step` and `bisect` died with `internal error: KeyError: '"kind"'`
    on a terminal: the progress label went into rich's column format string."""
    from rich.console import Console

    from tapml_dbg.engine.session import Session

    buffer, bar = io.StringIO(), io.StringIO()
    with Session.open(trace, target=JSON_TARGET) as session:
        repl = Repl(session, out=make_console(buffer), err=Console(file=bar, force_terminal=True, width=120),
                    show_progress=True)
        assert repl.execute("step 2").ok and repl.execute("bisect --no-sweep").ok
    assert "internal error" not in bar.getvalue() and "Traceback" not in bar.getvalue()
    out = buffer.getvalue()
    assert "#1    addmm_p0" in out and "no divergence: 26 ops checked on " + JSON_TARGET in out


def test_the_debugger_owns_the_position_and_follows_what_the_session_forgot(traces, tmp_path):
    """`Debugger` keeps the position and the verdicts seen; `Session.observe` tells it when the session
    forgot its state: a reset starts the run over at op 0, an edited pass drops the verdicts seen (the
    REPL clears nothing itself). A debugger that is gone is not kept alive by its session."""
    import gc
    import weakref

    from tapml_dbg.engine.stops import Debugger

    pass_file = tmp_path / "identity_pass.py"
    pass_file.write_text("def identity(mod):\n    return mod\n")
    with Session.open(traces.get("mlp"), transform=f"{pass_file}:identity") as session:
        debugger = Debugger(session)
        run = debugger.step(3)
        assert debugger.position == 3 and len(run.steps) == 3 and sorted(debugger.seen) == [0, 1, 2]
        assert debugger.step(1).steps[0].index == 3  # from where it stopped
        session.reset()
        assert debugger.position == 0 and debugger.last is None
        debugger.step(1)
        pass_file.write_text("def identity(mod):\n    return mod  # edited\n")
        assert session.notice_transform_edit() and debugger.seen == {}
        assert debugger.position == 1  # an edited pass does not move the position
        gone = weakref.ref(debugger)
        del debugger, run
        gc.collect()
        assert gone() is None
        session.reset()  # no observer left to call
