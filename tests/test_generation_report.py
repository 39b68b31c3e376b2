"""A generation trace end to end: `tapml-dbg report`'s Generation section ([15]) charts the worst
propagated op error and the logits' KL per step, marks the first bad token and tables the steps (a
trace of one forward gets no such section); one session each for the clean generation (bisect, `run`'s
outputs, the report) and for one planted fault (the first bad token in bisect, free running, the
report, a search again from the trace's memo), so that every command judges the ops once.

The model is examples/plain_qwen2.py with a prompt of 8 positions and 3 decode steps (as in
tests/test_generation.py); the planted fault negates step 2's logits.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import fault_transform, fresh, rendered
from tapml_dbg.api import Replay
from tapml_dbg.engine.generation import free_running
from tapml_dbg.engine.report import build_report
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.tokens import BUG, SAME
from tapml_dbg.report.html import page
from tapml_dbg.ui.cli import strict_json

PROMPT, STEPS = 8, 3
SECTION = '<h2 id="generation-section">Generation</h2>'


@pytest.fixture(scope="module")
def generation(traces):
    return traces.get("plain_qwen2", "--generate", str(STEPS))


def _step_rows(text: str) -> list[str]:
    """The rows of the steps' table, the header left out."""
    table = text[text.index('<table id="generation">'):]
    return table[:table.index("</table>")].split("<tr")[2:]


def test_a_clean_generation_has_every_step_the_same(generation):
    """One session on the clean generation, every command on it (the CLI prints what these return:
    ui/cli.py):
    - `bisect` finds no op and no bad token: every step chooses the source's token, KL ~0, and
      `bisect --json` says so (`op`, `first_bad_token` null, a token verdict per step);
    - `run --offload all` names each output: the steps' logits (the one with an argmax), the state a
      next step reads, each layer's cache (text and JSON `label`);
    - the report of that bisect: every step the same, its worst error one of its own ops', none failing;
      the Generation section, its chart and table, the step boundaries on the per-op chart."""
    with Session.open(generation) as session:
        replay = Replay(session)
        result = replay.bisect()
        run = replay.run("all")
        ops, report = session.ops, build_report(session, bisect=result)
    assert not result.diverged, result.culprit
    assert result.first_bad_token is None
    assert [s.verdict for s in result.tokens.steps] == [SAME] * (STEPS + 1)
    assert max(s.kl for s in result.tokens.steps) < 1e-6
    found = json.loads(strict_json(result.to_json()))
    assert found["first_bad_token"] is None and found["op"] is None
    assert [s["step"] for s in found["tokens"]["steps"]] == list(range(STEPS + 1))
    assert {s["verdict"] for s in found["tokens"]["steps"]} == {SAME}

    lines = [line for line in rendered(run).splitlines() if line.startswith("  output ")]
    assert lines[0].startswith(f"  output output[0] (logits of steps 0..{STEPS}, each step's last position): pass")
    assert "argmax agrees" in lines[0]
    assert "(keys, model.layers.0.self_attn)" in lines[5] and "(values, model.layers.0.self_attn)" in lines[6]
    assert "(cache length, model.layers.1.self_attn)" in lines[-1]
    assert not any("argmax" in line for line in lines[1:])  # a cache's argmax means nothing
    assert json.loads(strict_json(run.to_json()))["outputs"][1]["label"] == "next token index"

    steps = report.generation.steps
    assert [s.step for s in steps] == list(range(STEPS + 1))
    assert [s.kind for s in steps] == ["prefill"] + ["decode"] * STEPS
    assert [s.token.verdict for s in steps] == [SAME] * (STEPS + 1) and report.generation.first_bad is None
    assert report.generation.tokens.runs == 1  # the teacher-forced chain, once
    for s in steps:  # each step's worst error is that of one of its own ops, read from the report's verdicts
        assert ops[s.worst_op].step == s.step and s.worst == report.points[s.worst_op].error("propagated")
        assert s.failing == 0 and s.worst < 1e-4
    text = page(report)
    assert SECTION in text and 'id="generation-chart"' in text and "<b>First bad token" not in text
    rows = _step_rows(text)
    assert len(rows) == STEPS + 1 and all('<span class="pass">same</span>' in row for row in rows)
    assert "[0, 8)" in rows[0] and "[10, 11)" in rows[3]
    chart = text[text.index('<svg id="error-chart"'):]
    chart = chart[:chart.index("</svg>")]
    assert all(f"step {k}" in chart for k in range(1, STEPS + 1))  # the step boundaries on the per-op chart
    assert "<script" not in text and "src=" not in text and "<link" not in text


def test_a_wrong_step_2_logits_is_the_first_bad_token(generation, tmp_path):
    """Step 2's logits (its lm_head output) negated: its top-1 is the source's worst token. One planted
    fault, every command that meets it:
    - bisect names that op in step 2 (`op.step` in its JSON) and step 2 the first bad token, a bug
      outside the top-k (random weights: flat logits, yet KL > 1e-3), the steps before the same;
    - free running feeds the target its own token at step 2 on to step 3;
    - the report of that bisect: the Generation section marks step 2 (the worst error, failing ops,
      the chart's mark, the table's culprit row), the steps before pass;
    - a search again (its chain from a checkpoint, the sweep from the memo, runtime/run_memo.py) names
      the same op, step and token, and more runs come from the memo: a generation's chain hands back
      its output for the tokens (`also_keep`), it never starts past it. (The suite's compile cache is
      shared: other tests' searches of this trace may have left records too.)"""
    with Session.open(generation) as session:
        logits = [op for op in session.ops if op.step == 2 and op.layer == "lm_head"][-1]
        recorded = [step["token"] for step in session.reader.meta["generation"]["steps"]]
    transform = fault_transform(tmp_path, "scale", logits.name, scale=-1)
    with Session.open(generation, transform=transform) as session:
        result = session.bisect()
        remembered = session.lanes.cache.remembered
        free = free_running(session)
        report = build_report(session, bisect=result)
    assert (result.culprit.name, result.culprit.step) == (logits.name, 2)
    first = result.first_bad_token
    assert (first.step, first.position, first.in_top_k) == (2, PROMPT + 2, False)
    assert first.source == recorded[2] and first.target != first.source
    assert [s.verdict for s in result.tokens.steps[:2]] == [SAME, SAME]
    assert result.tokens.steps[2].verdict == BUG and result.tokens.steps[2].kl > 1e-3
    found = json.loads(strict_json(result.to_json()))
    assert (found["op"]["name"], found["op"]["step"]) == (logits.name, 2)
    assert found["first_bad_token"] == {"step": 2, "position": PROMPT + 2, "source": first.source,
                                        "target": first.target, "in_top_k": False}
    assert free.runs >= 2  # the target's own token at step 2 fed to step 3
    assert free.steps[2].target == first.target and free.first_bad.step == 2

    first_bad = report.generation.first_bad
    assert (first_bad.step, first_bad.verdict) == (2, BUG)
    steps = report.generation.steps
    assert [s.token.verdict for s in steps[:2]] == [SAME, SAME] and steps[2].token.kl > 1e-3
    assert steps[2].worst > 1 and steps[2].failing >= 1 and steps[1].failing == 0
    text = page(report)
    assert "<b>First bad token: step 2</b>" in text
    rows = _step_rows(text)
    assert re.match(r' class="culprit"><td class="num">2</td>', rows[2]), rows[2]
    assert '<span class="FAIL">bug</span>' in rows[2]
    assert all('<span class="pass">same</span>' in rows[k] for k in (0, 1))
    chart = text[text.index('<svg id="generation-chart"'):]
    assert "first bad token: step 2 (bug)" in chart[:chart.index("</svg>")]

    with Session.open(generation, transform=transform) as session:
        again = session.bisect()
        assert session.lanes.cache.remembered > remembered
    assert (again.culprit.name, again.culprit.step) == (logits.name, 2)
    assert (again.first_bad_token.step, again.first_bad_token.target, again.first_bad_token.source) == \
        (2, first.target, first.source)


def test_a_forward_trace_has_no_generation_section(demo_session):
    report = build_report(fresh(demo_session))  # the README's example, shared with tests/test_report.py
    assert report.generation is None
    text = page(report)
    assert "Generation" not in text and "generation-chart" not in text and "step 1" not in text
