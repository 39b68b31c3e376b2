"""`tapml-dbg report` of a generation trace ([15]): the Generation section charts the worst propagated
op error and the logits' KL per step, marks the first bad token and tables the steps; a trace of one
forward gets no such section.

The model is examples/plain_qwen2.py with a prompt of 8 positions and 3 decode steps (as in
tests/test_generation.py); the planted fault negates step 2's logits.
"""

from __future__ import annotations

import re

import pytest

from conftest import fault_transform, fresh
from tapml_dbg.engine.report import build_report
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.tokens import BUG, SAME
from tapml_dbg.report.html import page

STEPS = 3
SECTION = '<h2 id="generation-section">Generation</h2>'


@pytest.fixture(scope="module")
def generation(traces):
    return traces.get("plain_qwen2", "--generate", str(STEPS))


def _report(trace, **options):
    with Session.open(trace, **options) as session:
        return session.ops, build_report(session)


def _step_rows(text: str) -> list[str]:
    """The rows of the steps' table, the header left out."""
    table = text[text.index('<table id="generation">'):]
    return table[:table.index("</table>")].split("<tr")[2:]


def test_a_clean_generation_has_every_step_the_same(generation):
    ops, report = _report(generation)
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
    with Session.open(generation) as session:
        logits = [op for op in session.ops if op.step == 2 and op.layer == "lm_head"][-1]
    _, report = _report(generation, transform=fault_transform(tmp_path, "scale", logits.name, scale=-1))
    first = report.generation.first_bad
    assert (first.step, first.verdict) == (2, BUG)
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


def test_a_forward_trace_has_no_generation_section(demo_session):
    report = build_report(fresh(demo_session))  # the README's example, shared with tests/test_report.py
    assert report.generation is None
    text = page(report)
    assert "Generation" not in text and "generation-chart" not in text and "step 1" not in text
