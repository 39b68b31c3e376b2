"""Issue [18], the smaller ones: each test fails without its fix.

1. `record`'s timing line gives no ratio against an eager forward too short to time.
2. Every folder the CLI suggests for -o is git-ignored.
3. A failing torch.export is one error line, not two pages of graph dump.
4. A missing model file is reported before torch (or tvm) is imported.
5. A target error's text (TVM's, or a transform's) is printed once per result, not on every line.
6. A passing `migrate` and `info` end with a `next:` line.
7. An op range past the ends is a UsageError naming the op count, not silently clamped.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT, rendered, run_cli
from tapml_dbg.errors import UsageError
from tapml_dbg.record.recorder import EAGER_RATIO_MIN_SECONDS, RecordResult
from tapml_dbg.ui import cli

# a transform that fails for every module, with a message to count in the output
PASS_ERROR = "Cannot convert from type"  # TVM's own error compiling what the pass below returns
# a pass that returns a module TVM then refuses to compile (an attribute of the wrong type): a compile error
# of every unit, raised after the pass (an exception inside the pass is the pass's own failure instead)
RAISING_TRANSFORM = ("import tvm\nfrom tvm import relax\n\n\ndef boom(mod):\n"
                     "    return tvm.IRModule({gv: f.with_attr('tir_var_upper_bound', {'n': 'oops'})\n"
                     "                         if isinstance(f, relax.Function) else f for gv, f in mod.functions_items()})\n")


def _record_result(eager_seconds: float, run_seconds: float) -> RecordResult:
    return RecordResult(ROOT / "t.h5", ops=26, seconds=run_seconds + 2.0, eager_seconds=eager_seconds, helper_ops=0,
                        file_bytes=1000, prepare_seconds=2.0, run_seconds=run_seconds)


# ------------------------------------------------------------------ 1. the timing line
def test_no_overhead_ratio_against_an_eager_forward_too_short_to_time():
    short = _record_result(eager_seconds=EAGER_RATIO_MIN_SECONDS / 80, run_seconds=0.04)
    assert short.overhead_ratio is None
    text = rendered(short)
    assert "x the bare eager forward" not in text and "too short for a ratio" in text
    assert "(0.00 s" not in text  # the eager time with digits that say something
    assert re.search(r"the bare eager forward: 125 us, warm", text), text


def test_the_ratio_stays_for_a_forward_long_enough_to_time():
    long = _record_result(eager_seconds=EAGER_RATIO_MIN_SECONDS * 5, run_seconds=EAGER_RATIO_MIN_SECONDS * 20)
    assert long.overhead_ratio == pytest.approx(4.0)
    assert "run 0.20 s = 4.0x the bare eager forward (50 ms, warm)" in rendered(long)


# ------------------------------------------------------------------ 2. suggested folders are git-ignored
def test_every_folder_the_cli_suggests_is_git_ignored():
    folders = {value for name, value in vars(cli).items() if re.fullmatch(r"DEFAULT_\w+_DIR", name)}
    assert {"repro/", "report/"} <= folders
    for folder in sorted(folders):
        for path in (folder, f"{folder}op_14/repro.py"):
            result = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT)
            assert result.returncode == 0, f"{path} (suggested by `next:` lines for -o) is not in .gitignore"
    assert subprocess.run(["git", "check-ignore", "--no-index", "-q", "tapml_dbg/repro/carve.py"],
                          cwd=ROOT).returncode == 1  # the package of the same name is not


# ------------------------------------------------------------------ 3. a failing export: one line
DATA_DEPENDENT = ("import torch\n"
                  "class M(torch.nn.Module):\n"
                  "    def forward(self, x):\n"
                  "        if x.sum() > 0:\n"
                  "            return x * 2\n"
                  "        return x - 1\n"
                  "def build():\n"
                  "    return M(), (torch.randn(4, 4),)\n")


def test_a_failing_export_is_one_line_and_its_graph_only_on_request(tmp_path):
    model = tmp_path / "data_dependent.py"
    model.write_text(DATA_DEPENDENT)
    result = run_cli("record", str(model), "-o", str(tmp_path / "t.h5"), env={"TAPML_DEBUG": "0"})
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # torch printed the partial graph twice before
    assert lines[0].startswith("error: torch.export failed: ")
    assert f"at {model}:4: if x.sum() > 0:" in lines[0]  # the user's line that raised
    assert "no data-dependent control flow" in lines[0] and "TAPML_DEBUG=1" in lines[0]
    assert "def forward" not in result.stderr + result.stdout
    verbose = run_cli("record", str(model), "-o", str(tmp_path / "t.h5"), env={"TAPML_DEBUG": "1"})
    assert verbose.returncode == 1
    assert verbose.stderr.count("def forward") == 1  # the graph exported up to the failure, once
    assert [line for line in verbose.stderr.splitlines() if line.startswith("error:")] == \
        [lines[0].replace(" (set TAPML_DEBUG=1 for the full text)", "")]


# ------------------------------------------------------------------ 4. a missing model file fails first
def test_a_missing_model_file_is_reported_before_torch_is_imported(tmp_path):
    driver = ("import sys\n"
              "from tapml_dbg.ui.cli import main\n"
              f"code = main(['record', {str(tmp_path / 'nope.py')!r}, '-o', {str(tmp_path / 't.h5')!r}])\n"
              "print(code, 'torch' in sys.modules, 'tvm' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.split() == ["1", "False", "False"], (result.stdout, result.stderr)
    assert "model file not found" in result.stderr and not (tmp_path / "t.h5").exists()


# ------------------------------------------------------------------ 5. a target error's text, once
@pytest.fixture(scope="module")
def raising_transform(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("raising") / "raising.py"
    path.write_text(RAISING_TRANSFORM)
    return f"{path}:boom"


def test_a_compile_error_is_said_once_in_bisect(traces, raising_transform):
    result = run_cli("bisect", str(traces.get("mlp")), "--transform", raising_transform)
    assert result.returncode == 0, result.stderr
    assert "verdict: compile-error" in result.stdout
    assert result.stdout.count(PASS_ERROR) == 1, result.stdout  # the culprit's line and every table row before
    assert re.search(r"→\s+0\s+permute .* compile-error \(as above\)", result.stdout), result.stdout


def test_a_stopped_mixed_run_says_its_error_once(traces, raising_transform):
    result = run_cli("run", str(traces.get("mlp")), "--offload", "0:5", "--transform", raising_transform)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(PASS_ERROR) == 1, result.stdout  # `stopped:`, the output line and 5 ops before
    assert "stopped: op #0 permute of the target run of ops #0..#4 ended with compile-error: TypeError" in result.stdout
    assert "output output[0]: FAIL no value (as above)" in result.stdout
    assert "5 op(s) fail in this run: #0 permute compile-error, #1" in result.stdout


def test_compare_says_a_compile_error_once_when_both_runs_fail_with_it(traces, raising_transform):
    result = run_cli("replay", str(traces.get("mlp")), "--transform", raising_transform, "-c", "compare 3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(PASS_ERROR) == 1, result.stdout  # the isolated and the propagated column before
    # the propagated run stopped at op 0 upstream (the pass fails every unit), with the same error
    assert re.search(rf"message\s+TypeError: {PASS_ERROR}.*\s+op permute: \(as isolated\)", result.stdout), result.stdout


# ------------------------------------------------------------------ 6. `next:` after migrate and info
def test_a_passing_migrate_ends_with_what_to_run_next(traces):
    trace = str(traces.get("mlp"))
    result = run_cli("migrate", trace)
    assert result.returncode == 0, result.stderr
    assert "the output stays right at every step" in result.stdout
    tail = result.stdout.splitlines()[-2:]
    assert tail[0].startswith(f"next: tapml-dbg bisect {trace} ")
    assert tail[1].lstrip().startswith(f"tapml-dbg report {trace} -o report/ ")


def test_info_ends_with_what_to_run_next(traces, capsys):
    trace = str(traces.get("mlp"))
    assert cli.main(["info", trace]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith(f"next: tapml-dbg bisect {trace} ") and "replay" in lines[-1]
    assert cli.main(["info", trace, "--verify"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"next: tapml-dbg bisect {trace} ")
    assert cli.main(["info", trace, "--json"]) == 0
    assert "next:" not in capsys.readouterr().out  # scripts read one JSON object


def test_info_of_an_unfinished_recording_suggests_recording_it_again():
    commands = [command for command, _why in cli._info_next("t.h5", {"complete": False, "model": "m.py"}).commands]
    assert commands[0] == "tapml-dbg record m.py -o t.h5" and commands[1] == "tapml-dbg bisect t.h5"


# ------------------------------------------------------------------ 7. ranges past the ends
def test_an_offload_range_past_the_last_op_is_a_usage_error(traces, capsys):
    assert cli.main(["run", str(traces.get("mlp")), "--offload", "0:999"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("error: `0:999` is out of range: the trace has 26 ops (0..25), so each bound of a:b is from -26 "
                   "to 26 (b excluded); write `0:26` (or `:` to the last op)")


def test_the_repl_and_the_engine_read_ranges_alike(traces):
    from tapml_dbg.engine.mixed import parse_offload
    from tapml_dbg.engine.session import Session

    with Session.open(traces.get("mlp"), start_workers=False) as session:
        assert parse_offload(session.op_table, "20:26") == list(range(20, 26))
        for spec in ("20:40", "-30:2", "blocks.0,0:27"):
            with pytest.raises(UsageError, match=rf"is out of range: the trace has 26 ops"):
                parse_offload(session.op_table, spec)
            with pytest.raises(UsageError, match=rf"is out of range: the trace has 26 ops"):
                session.resolve_ops(spec)
    result = run_cli("replay", str(traces.get("mlp")), "-c", "offload remove 20:40; plot -30:2; ops 0:27")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and all("is out of range: the trace has 26 ops" in line for line in errors), result.stderr
