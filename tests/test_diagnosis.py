"""One diagnosis per op: bisect, compare, show, the report's culprit card and the dump's README word
what an op's verdicts say with the same sentence (judge/diagnosis.py); a dump's repro.py and its
`--tvmscript-only` script judge with the session's bound and carry their data; `tol` refuses a
setting the active rule ignores.

Two real TVM 0.27 divergences: the bool cumsum of examples/qwen2_several_bugs.py (the import declares
bool where torch computes int64, and llvm does not compile it: a frontend divergence, not a kernel
bug) and the fp16 softmax of examples/fp16_memory_attention.py (the README's #9: a kernel summing in
fp16, judged by the noise floor).
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from conftest import fresh
from test_repl import Transcript as ReplTranscript
from test_repro import run_blocked
from tapml_dbg.engine.report import build_report
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.diagnosis import MEANINGS, PASSED, TYPE_MEANING, diagnose, diagnosis
from tapml_dbg.judge.verdict import FUSED, ISOLATED, PROPAGATED, Status, Verdict, WrongClass
from tapml_dbg.portable.standalone import standalone_script
from tapml_dbg.repro.dump import dump_op
from tapml_dbg.report.html import page

CUMSUM = 14  # examples/qwen2_several_bugs.py: aten.cumsum over a bool mask
SOFTMAX = 9  # examples/fp16_memory_attention.py: the README's fp16 softmax
KERNEL = MEANINGS[ISOLATED]


class Transcript(ReplTranscript):
    """tests/test_repl.py's REPL transcript, its output compared as words (tables wrap)."""

    def run(self, line: str) -> str:
        return flat(super().run(line))


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def qwen2(traces):
    with Session.open(traces.get("qwen2_several_bugs")) as session:
        yield session


@pytest.fixture(scope="module")
def fp16(traces):
    with Session.open(traces.get("fp16_memory_attention")) as session:
        yield session


# ------------------------------------------------------------------ the rule (no model)
def _verdict(mode, status, wrong=None) -> Verdict:
    return Verdict(0, "op", mode, Status(status), wrong=wrong)


def test_the_rule_decides_by_class_then_by_the_deciding_verdicts_kind():
    compile_error = _verdict(ISOLATED, "compile-error", WrongClass.TYPE)
    assert diagnose(compile_error, _verdict(PROPAGATED, "compile-error", WrongClass.TYPE)) == TYPE_MEANING
    assert diagnose(_verdict(ISOLATED, "compile-error"), None) == MEANINGS[Status.COMPILE_ERROR]
    assert diagnose(_verdict(ISOLATED, "fail", WrongClass.PRECISION), _verdict(PROPAGATED, "pass")) == KERNEL
    # right alone: the propagated verdict decides, even when the class it inherits is upstream's type
    assert diagnose(_verdict(ISOLATED, "pass"), _verdict(PROPAGATED, "fail", WrongClass.TYPE)) == MEANINGS[PROPAGATED]
    assert diagnose(_verdict(ISOLATED, "pass"), _verdict(PROPAGATED, "pass")) == PASSED
    assert diagnose(None, None) == ""
    assert diagnosis(FUSED, WrongClass.FUSED) == MEANINGS[FUSED]
    assert diagnosis("crash") == MEANINGS[Status.CRASH]


# ------------------------------------------------------------------ one sentence everywhere
def test_the_bool_cumsum_is_a_frontend_divergence_in_bisect_compare_show_and_its_dump(qwen2, tmp_path):
    t = Transcript(qwen2)
    bisect = t.run("bisect")
    assert f"first divergent op: #{CUMSUM} cumsum (aten.cumsum.default)" in bisect, bisect
    compare, show = t.run(f"compare {CUMSUM}"), t.run(f"show {CUMSUM}")
    dump = tmp_path / "cumsum"
    t.run(f"dump {CUMSUM} {dump}")
    readme = flat((dump / "README.md").read_text())
    for text in (bisect, compare, show, readme):
        assert TYPE_MEANING in text, text
        assert KERNEL not in text and "kernel (or codegen)" not in text
    assert f"→ {TYPE_MEANING}" in compare and f"→ {TYPE_MEANING}" in show
    assert "class type: output 0: the import declares bool (1," in compare  # the class, as bisect's
    assert "class: type: output 0: the import declares bool (1, 8) but the source computed int64 (1, 8)" in bisect
    seen = json.loads((dump / "meta.json").read_text())["seen"]
    assert (seen["status"], seen["class"], seen["diagnosis"]) == ("compile-error", "type", TYPE_MEANING)
    culprit = qwen2.bisect().culprit
    assert culprit.to_json()["diagnosis"] == TYPE_MEANING == qwen2.compare(CUMSUM).diagnosis


def test_the_fp16_softmax_is_a_kernel_bug_in_bisect_compare_show_the_report_and_its_dump(fp16, tmp_path):
    t = Transcript(fp16)
    stop = t.run("continue")
    assert f"stopped after #{SOFTMAX} _softmax" in stop and KERNEL in stop
    bisect = t.run("bisect")
    assert f"first divergent op: #{SOFTMAX} _softmax" in bisect
    compare, show = t.run(f"compare {SOFTMAX}"), t.run(f"show {SOFTMAX}")
    dump = tmp_path / "softmax"
    t.run(f"dump {SOFTMAX} {dump}")
    readme = flat((dump / "README.md").read_text())
    report = build_report(fp16, fp16.bisect())
    html = flat(page(report))
    card = html[html.index('id="culprit"'):]
    for text in (stop, bisect, compare, show, readme, card):
        assert KERNEL in text, text
        assert TYPE_MEANING not in text
    assert f"<th>diagnosis</th><td>{KERNEL}</td>" in card
    assert f"isolated verdict: {KERNEL}." in html  # the headline


# ------------------------------------------------------------------ repros judge with the session's bound
def test_repro_and_its_standalone_script_judge_with_the_sessions_bound_after_a_move(fp16, tmp_path):
    fresh(fp16)
    verdict = fp16.isolated(SOFTMAX)
    bound = verdict.worst.noise_bound
    assert verdict.failed and bound is not None  # the noise floor judged it
    written = tmp_path / "written"
    dump_op(fp16, SOFTMAX, written)
    script = run_blocked(written / "repro.py", tmp_path, "--tvmscript-only")  # tvm + numpy only, as the two below
    assert script.returncode == 0, script.stderr
    assert str(written) in script.stdout  # the fallback folder: where the repro was when the script was written
    (written / "standalone.py").write_text(script.stdout)
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(str(written), str(moved))  # the folder it was written in is gone
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    repro, standalone = run_blocked(moved / "repro.py", elsewhere), run_blocked(moved / "standalone.py", elsewhere)
    expected = f"bound {bound:.3g}: the noise floor"
    for run in (repro, standalone):
        assert run.returncode == 1 and "REPRODUCED" in run.stdout, run.stdout + run.stderr
        assert expected in run.stdout, run.stdout
        assert [float(b) for b in re.findall(r"bound ([0-9.e+-]+)", run.stdout)] == [float(f"{bound:.3g}")]


# ------------------------------------------------------------------ `tol` and the active rule
def test_tol_refuses_what_the_noise_floor_ignores_and_takes_it_under_the_fixed_rule(fp16):
    t = Transcript(fp16)
    before = fp16.verdicts.policy.to_json()
    out = t.run("tol float16 0.1")
    assert "`tol float16 0.1` changes nothing: the noise-floor rule" in out and "`tol fixed` first" in out
    out = t.run("tol propagated 20")
    assert "`tol propagated 20` changes nothing: the noise-floor rule" in out and "`tol fixed` first" in out
    assert fp16.verdicts.policy.to_json() == before  # nothing was set
    assert "op #9 _softmax: rtol=0.1" in t.run("tol op 9 0.1")  # a per-op tolerance counts under either rule
    assert "float16: rtol=0.1 atol=0.001" in t.run("tol fixed") + t.run("tol float16 0.1")
    assert "propagated verdicts use 20x" in t.run("tol propagated 20")
    fresh(fp16)


def test_a_small_repro_carries_its_float64_reference_inline():
    """Small data is inlined, the float64 reference with it: the script needs no file at all."""
    reference = np.linspace(0, 1, 6)
    out = {"key": "op/a/0", "dtype": "float16", "rtol": 0.01, "atol": 0.001,
           "noise": {"reference": {"key": "reference/a/0"}, "source_factor": 16.0, "relative_floor": 0.004}}
    op = {"inputs": [{"key": "input/x/0"}], "outputs": [out]}
    text = standalone_script("/nowhere", {"target": "llvm"}, op, [np.ones(6, np.float16)],
                             [reference.astype(np.float16)], "# from tvm.script import relax as R\n", "op #0 a",
                             [reference])
    compile(text, "standalone.py", "exec")
    assert "RULES = [('noise-floor', 16.0, 0.004)]" in text and "REFERENCES = [\n    np.array(" in text
    assert "np.load" not in text and "/nowhere" not in text
