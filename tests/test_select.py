"""The one op-selector parser (tapml_dbg.model.select) and every caller that uses it.

Most tests run on a hand-built op table (no model, no TVM). A few drive the real callers, the
engine session, the recorder's `--window` and the REPL, to show they now agree: `-1` and
`-3:` work everywhere, and an empty range like `5:3` is refused everywhere.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from tapml_dbg.errors import UsageError
from tapml_dbg.model.select import LAYER, OP, RANGE, OpTable, Selection, is_index, is_positional
from tapml_dbg.trace.capture import plan_capture, resolve_window
from test_repl import Transcript, trace  # noqa: F401  (the recorded mlp trace, shared with the REPL tests)

# index  name     layer
OPS = [("permute", "proj"),
       ("addmm", "proj"),
       ("norm", "blocks.0.norm"),
       ("addmm_1", "blocks.0.fc"),
       ("gelu", "blocks.0.fc"),
       ("norm_1", "blocks.1.norm"),
       ("addmm_2", "blocks.1.fc"),
       ("gelu_1", "blocks.1.fc"),
       ("add", "blocks.10"),  # `blocks.1` must not take it: a layer is a path, not a string prefix
       ("out", "")]  # top level
LAST = len(OPS) - 1


@pytest.fixture
def table() -> OpTable:
    return OpTable([name for name, _ in OPS], [layer for _, layer in OPS])


def op_dicts() -> list[dict]:
    """The recorder's op-table dicts for OPS."""
    return [{"index": i, "name": name, "layer": layer, "inputs": [], "outputs": [{"shape": [2], "dtype": "float32"}]}
            for i, (name, layer) in enumerate(OPS)]


# ------------------------------------------------------------------ one op
@pytest.mark.parametrize("text,index", [("3", 3), ("#3", 3), (3, 3), (" 3 ", 3), ("-1", LAST), ("#-1", LAST),
                                        (-1, LAST), (f"-{len(OPS)}", 0), ("gelu_1", 7)])
def test_op_by_index_from_either_end_or_by_name(table, text, index):
    assert table.op(text) == index


@pytest.mark.parametrize("text", [str(len(OPS)), f"#{len(OPS)}", f"-{len(OPS) + 1}"])
def test_op_index_out_of_range_names_the_valid_range(table, text):
    with pytest.raises(UsageError, match=rf"op index {text} is out of range \(0\.\.{LAST}\)"):
        table.op(text)


def test_unknown_op_suggests_close_names(table):
    with pytest.raises(UsageError, match="no op named 'gelu_2'; did you mean gelu_1"):
        table.op("gelu_2")
    with pytest.raises(UsageError, match="`ops PATTERN` lists op names"):
        table.op("zzzz")


def test_op_of_an_empty_table_says_there_are_none():
    with pytest.raises(UsageError, match="the trace has no ops"):
        OpTable([], []).op("0")


# ------------------------------------------------------------------ ranges
@pytest.mark.parametrize("text,indices,label", [
    ("2:5", (2, 3, 4), "2:5"),
    ("#2:#5", (2, 3, 4), "2:5"),
    (" 2 : 5 ", (2, 3, 4), "2:5"),
    (":2", (0, 1), "0:2"),
    ("8:", (8, 9), "8:10"),
    (":", tuple(range(len(OPS))), f"0:{len(OPS)}"),
    ("-3:", (7, 8, 9), "7:10"),  # negative bounds count from the end
    (":-8", (0, 1), "0:2"),
    ("5:10", (5, 6, 7, 8, 9), "5:10"),  # the bounds may reach both ends, and no further
    ("-10:2", (0, 1), "0:2"),
])
def test_ranges_are_python_slices(table, text, indices, label):
    assert table.select(text) == Selection(RANGE, indices, label)


@pytest.mark.parametrize("text,write", [("5:100", "`5:10` (or `5:` to the last op)"), ("-100:2", "`0:2`"),
                                        ("100:200", "`0:10` (or `:` to the last op)")])
def test_a_bound_past_the_ends_is_an_error_not_clamped(table, text, write):
    with pytest.raises(UsageError, match=rf"`{text}` is out of range: the trace has 10 ops \(0\.\.{LAST}\), so each "
                                         rf"bound of a:b is from -10 to 10 \(b excluded\); write {re.escape(write)}$"):
        table.select(text)


@pytest.mark.parametrize("text", ["5:3", "0:0", "-1:-2", "2:-8"])
def test_a_range_that_selects_no_op_is_an_error(table, text):
    with pytest.raises(UsageError, match=rf"`{text}` selects no op \(ops are 0\.\.{LAST}\)"):
        table.select(text)


# ------------------------------------------------------------------ names, layers, precedence
def test_select_an_op_by_index_or_name(table):
    assert table.select("-1") == Selection(OP, (LAST,), "out")
    assert table.select("gelu") == Selection(OP, (4,), "gelu")


def test_a_layer_holds_its_nested_layers_and_only_them(table):
    assert table.select("blocks.1") == Selection(LAYER, (5, 6, 7), "blocks.1")
    assert table.select("blocks.1.fc").indices == (6, 7)
    assert table.layer_ops("blocks") == [2, 3, 4, 5, 6, 7, 8]
    assert table.layer_ops("blocks.10") == [8]
    selection = table.select("blocks.0")
    assert (selection.first, selection.end) == (2, 5)


def test_layers_lists_every_prefix_in_first_seen_order(table):
    assert table.layers() == ["proj", "blocks", "blocks.0", "blocks.0.norm", "blocks.0.fc", "blocks.1",
                              "blocks.1.norm", "blocks.1.fc", "blocks.10"]


def test_unknown_layer_suggests_close_layers(table):
    with pytest.raises(UsageError, match="no layer named 'blocks.7'; did you mean"):
        table.layer_ops("blocks.7")
    with pytest.raises(UsageError, match="`layers` lists them"):
        table.layer_ops("zzzz")


def test_index_beats_name_beats_layer():
    table = OpTable(["x", "head", "y"], ["0.fc", "0.fc", "head"])
    assert table.select("0") == Selection(OP, (0,), "x")  # an index, though a layer is called `0`
    assert table.select("0.fc").kind == LAYER
    assert table.select("head") == Selection(OP, (1,), "head")  # the op, not the layer `head`


def test_no_op_or_layer_suggests_both(table):
    with pytest.raises(UsageError, match="no op or layer named 'blocks.7'; did you mean .*blocks"):
        table.select("blocks.7")
    with pytest.raises(UsageError, match="no op or layer named 'gelu_2'; did you mean .*gelu_1"):
        table.select("gelu_2")
    with pytest.raises(UsageError, match="`ops` and `layers` list them"):
        table.select("zzzz")
    with pytest.raises(UsageError, match="empty selector"):
        table.select("  ")


# ------------------------------------------------------------------ several selectors
def test_select_many_is_a_sorted_union(table):
    assert table.select_many("9,0:3,1") == [0, 1, 2, 9]
    assert table.select_many("blocks.1.fc,proj") == [0, 1, 6, 7]
    assert table.select_many("-1") == [LAST]
    with pytest.raises(UsageError, match="empty selector"):
        table.select_many("1,,2")
    with pytest.raises(UsageError, match="selects no op"):
        table.select_many("0:2,5:3")


def test_positional_syntax_tells_a_selector_from_a_search():
    assert all(is_positional(text) for text in ("3", "#3", "-1", "3:5", ":", "-3:", "0:5,9"))
    assert not any(is_positional(text) for text in ("gelu", "blocks.1", "3:x", "add*", "1.5"))
    assert is_index("-1") and is_index(4) and not is_index("3:5")


def test_built_from_op_info_objects_or_dicts():
    objects = [SimpleNamespace(name="a", layer="m.x"), SimpleNamespace(name="b", layer="")]
    assert OpTable.of(objects).layers() == ["m", "m.x"]
    dicts = [{"index": 0, "name": "a"}, {"index": 1, "name": "b", "layer": "m"}]  # `layer` may be missing
    assert OpTable.of(dicts).select("m").indices == (1,)


# ------------------------------------------------------------------ the recorder's --window
def test_window_uses_the_same_rules():
    ops = op_dicts()
    assert resolve_window(ops, "-1") == (LAST, LAST + 1, None)  # refused before: "-1" was no op name
    assert resolve_window(ops, "-3:") == (7, 10, None)  # refused before: not A:B with digits
    assert resolve_window(ops, "#2:#4") == (2, 4, None)
    assert resolve_window(ops, "gelu_1") == (7, 8, None)
    assert resolve_window(ops, "blocks.1") == (5, 8, "blocks.1")
    assert resolve_window(ops, "5:10") == (5, 10, None)
    with pytest.raises(UsageError, match="`5:100` is out of range: the trace has 10 ops"):
        resolve_window(ops, "5:100")
    for empty in ("5:3", "0:0"):
        with pytest.raises(UsageError, match=rf"--window {empty} holds no op: `{empty}` selects no op"):
            resolve_window(ops, empty)
    with pytest.raises(UsageError, match="did you mean blocks.1"):
        resolve_window(ops, "blokcs.1")
    with pytest.raises(UsageError, match=r"no op or layer named 'zzzz'; `tapml-dbg info TRACE --json` lists"):
        resolve_window(ops, "zzzz")  # the REPL's `ops` and `layers` do not exist at record time


def test_a_layer_window_spans_first_to_last_op():
    ops = op_dicts()
    ops[8]["layer"] = "blocks.0.fc"  # a layer with a gap: the window must still be contiguous
    plan = plan_capture(ops, "blocks.0")
    assert (plan.first, plan.end, plan.layer) == (2, 9, "blocks.0")


# ------------------------------------------------------------------ the engine session and the REPL
@pytest.fixture(scope="module")
def session(trace):
    from tapml_dbg.engine.session import Session

    with Session.open(trace) as opened:
        yield opened


@pytest.fixture
def repl(session) -> Transcript:
    return Transcript(session)


def test_session_lookup_follows_the_rules(session):
    last = len(session.ops) - 1
    assert session.resolve("-1") is session.ops[last]
    assert session.resolve_ops("-1") == [last]
    assert session.resolve_ops("-3:") == [last - 2, last - 1, last]  # was "no op named '-3:'"
    with pytest.raises(UsageError, match="`5:3` selects no op"):
        session.resolve_ops("5:3")  # was silently []
    assert session.resolve_ops("blocks.1") == session.op_table.layer_ops("blocks.1")
    assert "blocks.1.fc" in session.op_table.layers()


def test_repl_selectors_agree_with_the_session(repl, session):
    last = len(session.ops) - 1
    out = repl.run("ops -1", "ops -3:", "ops 5:3")
    rows = [line.split()[0] for line in out.splitlines() if "float32" in line]
    assert rows == [str(last), str(last - 2), str(last - 1), str(last)]
    assert "error: `5:3` selects no op" in out
    out = repl.run("offload add 5:3", "boundary 0", "offload add -1", "offload add 0:2,blocks.1.fc")
    assert "error: `5:3` selects no op" in out
    assert f"offload  {last} (1 of {last + 1} ops)" in out
    assert f"offload  0..1, 10..12, {last} (6 of {last + 1} ops)" in out
    out = repl.run("break 3:5", "break -1", "boundary -1")
    assert "error: break: break takes one op or a layer, not the range '3:5'" in out
    assert f"breakpoint 1: op #{last} {session.ops[last].name}" in out
    assert f"error: boundary must be between 0 and {last + 1}" in out
