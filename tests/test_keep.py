"""Kept ops (engine/kept.py): getting past a known bug, on the issue's Qwen2 with several real TVM 0.27
bugs (examples/qwen2_several_bugs.py: #14 bool cumsum, #35/#36 bool index, #37 bool eq, #155 the
out-of-bounds select, #156 `counts * 0.5` as int64) and on planted faults."""

from __future__ import annotations

import json

import pytest

from conftest import fault_transform, fresh, run_cli
from tapml_dbg.engine.kept import kept_selector, segments
from tapml_dbg.engine.search import Bisection
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.triage import triage
from tapml_dbg.errors import UsageError
from tapml_dbg.ui.repl.app import Repl, make_console

CUMSUM, INDEX, EQ, SELECT, MUL = 14, (35, 36), 37, 155, 156  # the real bugs of the Qwen2 example


@pytest.fixture(scope="module")
def qwen2(traces):
    return traces.get("qwen2_several_bugs")


@pytest.fixture(scope="module")
def session(qwen2):
    with Session.open(qwen2) as opened:
        yield opened


@pytest.fixture
def clean(session):
    """The module's session with nothing kept, back at op 0."""
    session.set_kept(())
    session.reset()
    yield session
    session.set_kept(())


def test_selectors_and_spans():
    assert kept_selector([37, 14, 35, 36]) == "14,35:38"
    assert kept_selector([1, 2]) == "1,2"
    assert segments(list(range(8)), {0, 3, 4}) == [[1, 2], [5, 6, 7]]


def test_a_bad_selector_is_one_usage_error(clean, qwen2):
    with pytest.raises(UsageError, match="--keep nosuchop: no op or layer named 'nosuchop'"):
        clean.keep("nosuchop")
    with pytest.raises(UsageError, match="empty --keep"):
        clean.keep("  ")
    assert clean.keep("none") == [] and not clean.kept
    result = run_cli("bisect", str(qwen2), "--keep", "0:999")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--keep 0:999" in lines[0] and "out of range" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_kept_op_is_kept_with_its_source_op(clean):
    helper = next(op for op in clean.ops if op.name == "sub_2_p0")  # a helper binding of `sub_2`
    kept = clean.set_kept([helper.index])
    assert [clean.ops[i].name for i in kept] == ["sub_2_p0", "sub_2"]


def test_a_kept_op_lets_the_next_fused_block_compile(clean):
    """`run --offload all`: the unit after the bool cumsum holds the bool eq, which does not build on
    llvm; with both kept on the source every target unit builds and runs."""
    stuck = clean.run_mixed(list(range(len(clean.ops))))
    assert "compile-error" in stuck.failure
    clean.set_kept([CUMSUM, EQ])
    mixed = clean.run_mixed(list(range(len(clean.ops))), verdicts=True)
    assert not mixed.failure, mixed.failure
    assert CUMSUM not in mixed.offload and EQ not in mixed.offload and mixed.kept == [CUMSUM, EQ]
    assert CUMSUM not in mixed.verdicts and EQ not in mixed.verdicts  # no verdict to name
    assert all(check.metrics is not None for check in mixed.outputs)  # the output was computed
    assert any("kept on the source: #14 cumsum, #37 eq" in note for note in mixed.notes)
    # every cause kept (and the sub that reads `counts * 0.5` in its declared int64): the output is right
    clean.set_kept([CUMSUM, *INDEX, EQ, SELECT, MUL, 158])
    assert clean.run_mixed(list(range(len(clean.ops)))).passed


def test_bisect_goes_on_past_kept_ops(clean):
    assert clean.bisect().culprit.index == CUMSUM
    clean.set_kept([CUMSUM])
    found = clean.bisect()
    assert found.culprit.index == INDEX[0], found.culprit
    assert any("kept on the source: #14 cumsum" in note for note in found.notes)
    clean.set_kept([CUMSUM, *INDEX, EQ])
    found = clean.bisect()
    assert found.culprit.index == SELECT and found.culprit.verdict == "isolated", found.culprit
    clean.set_kept([CUMSUM, *INDEX, EQ, SELECT])
    assert clean.bisect().culprit.index == MUL


def test_a_fused_probe_is_cut_around_kept_ops(clean):
    """The fused search's probe of a prefix holding the bool eq does not build; with the eq (and what
    feeds it) kept, it builds without them, their recorded values its inputs, and its values pass."""
    last = SELECT - 1
    stuck = Bisection(clean).prefixes
    assert stuck.fails(last) and stuck.results[last].status == "compile-error"
    clean.set_kept([CUMSUM, *INDEX, EQ])
    prefixes = Bisection(clean).prefixes
    assert not prefixes.fails(last), prefixes.results[last].message
    assert prefixes.results[last].ok


def test_triage_skips_kept_ops_and_lists_the_rest(clean):
    clean.set_kept([CUMSUM])
    result = triage(clean)
    firsts = [group.first.index for group in result.groups]
    assert CUMSUM not in firsts and firsts == [INDEX[0], EQ, SELECT, MUL], [g.cause for g in result.groups]
    assert result.kept == [CUMSUM] and result.to_json()["kept"] == [CUMSUM]
    every = [op.index for group in result.groups for op in group.ops] + \
        [i for group in result.groups for i in group.inherited]
    assert CUMSUM not in every


def test_a_planted_fault_behind_kept_ops_is_found(qwen2, tmp_path):
    """rsqrt (#54, layer 0's RMSNorm) made 1.5x wrong: bisect names the cumsum first; with the real
    bugs before it kept on the source, it names the planted fault, isolated."""
    transform = fault_transform(tmp_path, "scale", "rsqrt", scale=1.5)
    with Session.open(qwen2, transform=transform) as planted:
        assert planted.bisect().culprit.index == CUMSUM
        planted.keep("14,35:38")
        found = planted.bisect()
        assert (found.culprit.index, found.culprit.name, found.culprit.verdict) == (54, "rsqrt", "isolated")


def test_a_fault_planted_at_a_kept_op_is_never_seen(planted_mlp):
    """Every unit is cut around a kept op: a fault the transform plants at it (gelu_1, op 13 of the
    MLP) reaches no unit, so nothing diverges, in the search nor in the mixed run."""
    planted = fresh(planted_mlp)  # conftest's session: faults.py:scale on gelu_1
    try:
        assert planted.bisect().culprit.index == 13
        planted.keep("gelu_1")
        assert not planted.bisect().diverged
        assert planted.run_mixed(list(range(len(planted.ops)))).passed
        assert not triage(planted).groups
    finally:
        planted.set_kept(())
        planted.reset()


def test_the_repl_keep_command(session):
    import io

    session.set_kept(())
    buffer = io.StringIO()
    console = make_console(buffer)
    repl = Repl(session, out=console, err=console, launch={"trace": str(session.reader.path)}, show_progress=False)
    try:
        for line in ("keep", "keep cumsum", "keep 35:38", "keep", "bisect", "keep remove 35:37", "keep bogus",
                     "continue", "keep none"):
            repl.execute(line)
    finally:
        session.set_kept(())
    text = buffer.getvalue()
    assert "kept     none on the source" in text
    assert "kept     #14 cumsum, #35 index_2, #36 index_3, #37 eq on the source" in text
    assert "first divergent op: #155 select" in text
    assert "`keep 155` (keep it on the source" in text  # the REPL's next: line offers it
    assert "kept     #14 cumsum, #37 eq on the source" in text  # after `keep remove 35:37`
    assert "error: keep bogus: no op or layer named 'bogus'" in text
    assert "stopped after #35 index_2" in text  # `continue` ran past the kept cumsum
    assert text.rstrip().endswith("kept     none on the source")


def test_the_first_answer_offers_to_keep_the_culprit(qwen2):
    """bisect's `next:` line: keep the culprit (a compile error, a type) and search on; run again as
    suggested, it names the next divergence and suggests keeping that one too."""
    first = run_cli("bisect", str(qwen2))
    assert first.returncode == 0, first.stderr
    nexts = [line for line in first.stdout.splitlines() if "tapml-dbg" in line]
    assert nexts[0].startswith("next: tapml-dbg bisect") and f"--keep {CUMSUM}" in nexts[0], first.stdout
    second = run_cli("bisect", str(qwen2), "--keep", str(CUMSUM), "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["op"]["index"] == INDEX[0]
    third = run_cli("bisect", str(qwen2), "--keep", "14,35")
    assert "next: tapml-dbg bisect" in third.stdout and "--keep 14,35,36" in third.stdout, third.stdout
    assert f"#{INDEX[1]} index_3" in third.stdout
