"""Steps as a dimension of a generation trace: `@K` selectors, `where`/`show`/`ops` naming the step,
stepping across step boundaries, the `tokens` command and the Python API's `tokens()` and `step`
column (model/select.py, ui/repl/commands.py, api.py).

One recording of examples/plain_qwen2.py (a prompt of 8 positions, 3 decode steps) and one engine
session serve the generation tests, the frozen v1.1 fixture the trace without steps; a hand-built op
table covers the parser's corner cases without TVM.
"""

from __future__ import annotations

import pytest

from conftest import ROOT, fresh
from tapml_dbg.api import Replay
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.tokens import SAME
from tapml_dbg.model.select import STEP, OpTable, is_positional
from tapml_dbg.trace.capture import resolve_window
from test_repl import Transcript, lines_with

PROMPT, STEPS = 8, 3
LAST_STEP = STEPS  # steps 0 (the prefill) .. STEPS
LAYER = "model.layers.1"
PLAIN_TRACE = ROOT / "tests" / "fixtures" / "trace_v1_1.h5"  # one forward, no steps: nothing to record


@pytest.fixture(scope="module")
def session(traces):
    """One engine session on the generation trace, shared by the module (tests reset it)."""
    with Session.open(traces.get("plain_qwen2", "--generate", str(STEPS))) as opened:
        yield opened


@pytest.fixture
def t(session) -> Transcript:
    return Transcript(session)


def in_step(session, step: int) -> list[int]:
    return [op.index for op in session.ops if op.step == step]


def in_layer(session, layer: str) -> set[int]:
    return {op.index for op in session.ops if op.layer == layer or op.layer.startswith(layer + ".")}


# ------------------------------------------------------------------ the parser (no engine)
@pytest.fixture
def table() -> OpTable:
    return OpTable(["emb", "fc", "out", "emb_1", "fc_1", "out_1"], ["embed", "blocks.0", "", "embed", "blocks.0", ""],
                   steps=[0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("text,indices", [("@0", [0, 1, 2]), ("@1", [3, 4, 5]), ("@-1", [3, 4, 5]),
                                          ("@1/blocks.0", [4]), (" @ 1 / blocks ", [4]), ("@0/0:2", [0, 1]),
                                          ("@1/fc_1", [4]), ("@0/blocks.0,@1/embed", [1, 3])])
def test_a_step_selects_its_ops_and_scopes_another_selector(table, text, indices):
    assert table.select_many(text) == indices


def test_a_step_selection_is_labelled_as_typed_and_normalized(table):
    assert (table.select("@-1").kind, table.select("@-1").label) == (STEP, "@1")
    assert table.select("@1/blocks.0").label == "@1/blocks.0"
    assert table.step_ops(-1) == [3, 4, 5] and table.steps() == [0, 1]
    assert is_positional("@2") and is_positional("@2/model.layers.1,3:5") and not is_positional("model.layers.1")


@pytest.mark.parametrize("text,message", [
    ("@2", r"`@2`: step 2 is out of range: the trace has steps 0\.\.1 \(0 is the prefill, 1 decode; @-1 is the last\)"),
    ("@-3", r"step -3 is out of range: the trace has steps 0\.\.1"),
    ("@1/emb", r"`@1/emb` selects no op: emb is in step 0, not step 1 \(ops 3\.\.5\)"),
    ("@1/", r"nothing after `@1/`"),
])
def test_a_bad_step_names_the_valid_steps(table, text, message):
    with pytest.raises(UsageError, match=message):
        table.select(text)


def test_a_trace_without_steps_says_it_is_not_a_generation_trace():
    plain = OpTable.of([{"name": "a", "layer": "x"}, {"name": "b", "layer": "x", "step": None}])
    with pytest.raises(UsageError, match="`@0`: not a generation trace: its ops have no step"):
        plain.select("@0")
    assert plain.select("x").indices == (0, 1)


# ------------------------------------------------------------------ the real trace's selectors
def test_step_selectors_on_the_generation_trace(session):
    table = session.op_table
    assert table.steps() == list(range(LAST_STEP + 1))
    assert session.resolve_ops("@2") == in_step(session, 2)
    assert session.resolve_ops(f"@2/{LAYER}") == sorted(set(in_step(session, 2)) & in_layer(session, LAYER))
    assert session.resolve_ops(f"@2/{LAYER}.self_attn") == \
        sorted(set(in_step(session, 2)) & in_layer(session, f"{LAYER}.self_attn"))
    assert session.resolve_ops("@-1") == in_step(session, LAST_STEP)
    assert session.resolve_ops("@0,@1") == in_step(session, 0) + in_step(session, 1)
    # every step runs the whole model: the layer alone is in every step, the step prefix picks one
    assert len(session.resolve_ops(LAYER)) == sum(len(session.resolve_ops(f"@{k}/{LAYER}")) for k in range(STEPS + 1))
    with pytest.raises(UsageError, match=rf"step {LAST_STEP + 1} is out of range: the trace has steps 0..{LAST_STEP}"):
        session.resolve_ops(f"@{LAST_STEP + 1}")
    # record --window reads the recorder's op-table dicts by the same rules
    ops = [op.to_json() for op in session.ops]
    first, end, layer = resolve_window(ops, "@1")
    assert (first, end, layer) == (in_step(session, 1)[0], in_step(session, 1)[-1] + 1, None)


# ------------------------------------------------------------------ the REPL
def test_where_show_and_ops_name_the_step(t, session):
    out = t.run("where")
    assert f"step     0 of 0..{LAST_STEP} (prefill, positions [0, {PROMPT})), op 1 of {len(in_step(session, 0))}" in out
    decode = in_step(session, 2)[0]
    assert f"layer {session.ops[decode].layer or '<top>'}, step 2 (decode)" in t.run(f"show {decode}")
    out = t.run(f"ops @2/{LAYER}.self_attn.q_proj")
    rows = [line.split() for line in out.splitlines()[1:]]
    expected = sorted(set(in_step(session, 2)) & in_layer(session, f"{LAYER}.self_attn.q_proj"))
    assert [int(row[0]) for row in rows] == expected and {row[4] for row in rows} == {"2"}
    assert "step" in out.splitlines()[0].split()
    out = t.run(f"ops @{LAST_STEP + 1}")
    assert out.startswith("error: ") and f"steps 0..{LAST_STEP}" in out and len(out.strip().splitlines()) == 1


def test_stepping_crosses_a_step_boundary(t, session):
    last_of_prefill, first_of_decode = in_step(session, 0)[-1], in_step(session, 1)[0]
    assert last_of_prefill + 1 == first_of_decode  # the steps are one list of ops
    out = t.run("break @1", "continue")
    assert f"ran #0..#{first_of_decode} ({first_of_decode + 1} ops)" in out
    assert f"stopped after #{first_of_decode}" in out and "breakpoint 1 (step @1)" in out
    assert f"step     1 of 0..{LAST_STEP} (decode, positions [{PROMPT}, {PROMPT + 1})), op 2 of" in t.run("where")
    # `next` from the top-level ops that end the prefill runs on through those that begin step 1
    assert session.ops[last_of_prefill].layer == session.ops[first_of_decode].layer == ""
    t.run("delete", "reset", f"break {last_of_prefill - 1}", "continue", "delete")
    assert t.repl.debugger.position == last_of_prefill
    t.run("next")
    after_next = t.repl.debugger.position
    assert after_next > first_of_decode and session.ops[after_next].layer and session.ops[after_next].step == 1
    out = t.run("step 2")
    assert f"#{after_next} " in out and f"#{after_next + 1} " in out
    assert f"op {after_next + 2 - first_of_decode + 1} of {len(in_step(session, 1))} in the step" in t.run("where")


def test_tokens_shows_every_step_source_beside_target(t, session):
    out = t.run("tokens")
    assert "tokens on llvm (teacher-forced, 1 run(s)): every step chooses the source's token" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    recorded = [step["token"] for step in session.reader.meta["generation"]["steps"]]
    assert [int(row[0]) for row in rows] == list(range(LAST_STEP + 1))
    assert [(int(row[2]), int(row[3]), row[4]) for row in rows] == [(token, token, SAME) for token in recorded]
    assert "(free-running" in t.run("tokens free")
    out = t.run("tokens foo")
    assert "error: tokens: expected `free` or nothing, not 'foo'" in out


def test_a_trace_without_steps_refuses_tokens_and_step_selectors():
    with Session.open(PLAIN_TRACE) as plain:
        t = Transcript(plain)
        out = t.run("tokens")
        assert out.startswith("error: ") and len(out.strip().splitlines()) == 1 and "is not a generation trace" in out
        assert "`@1`: not a generation trace" in t.run("ops @1")
        assert not lines_with(t.run("where"), "step  ") and "step" not in t.run("ops 0:3").splitlines()[0].split()
        with pytest.raises(UsageError, match="is not a generation trace"):
            Replay(plain).tokens()


# ------------------------------------------------------------------ the Python API
def test_api_tokens_and_the_step_column(session):
    fresh(session)
    replay = Replay(session)  # the module's session: not closed here
    report = replay.tokens()
    assert [s.step for s in report.steps] == list(range(LAST_STEP + 1)) and report.first_bad is None
    assert replay.tokens(free=True).mode == "free-running"
    replay.keep(",".join(f"@{k}" for k in range(1, LAST_STEP + 1)))  # verdicts of the prefill only: fast
    try:
        frame = replay.table()
    finally:
        replay.keep("none")
    assert str(frame["step"].dtype) == "Int64" and not frame["step"].isna().any()
    assert frame["step"].tolist() == [op.step for op in session.ops]
    judged = frame[frame["isolated"].notna()]
    assert set(judged["step"]) == {0}
