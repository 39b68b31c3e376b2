"""Mixed runs (the offload set on the target, the rest re-executed on the source) and `migrate`.

The traces are the suite's shared ones (examples/mlp.py: blocks.0..2; tiny_gpt2: transformer.h.0..1;
the README's fp16_memory_attention: a real TVM 0.27 divergence at op 9 `_softmax`).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import PLANTED_OP, fresh
from tapml_dbg.engine.migrate import AFTER_BLOCKS, BEFORE_BLOCKS
from tapml_dbg.engine.mixed import parse_offload, top_level_blocks, unit_bounds
from tapml_dbg.errors import TraceError, UsageError
from tapml_dbg.judge.verdict import ISOLATED, WrongClass
from tapml_dbg.ui.cli import main

PLANTED_LAYER = "blocks.1"  # the layer of PLANTED_OP (gelu_1) in examples/mlp.py


@pytest.fixture(scope="module")
def mlp(traces):
    from tapml_dbg.engine.session import Session

    with Session.open(traces.get("mlp")) as session:
        yield session


@pytest.fixture(scope="module")
def gpt2(traces):
    from tapml_dbg.engine.session import Session

    with Session.open(traces.get("tiny_gpt2")) as session:
        yield session


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", ["mlp", "gpt2"])
def test_nothing_offloaded_reproduces_the_recording_bit_for_bit(name, request):
    session = request.getfixturevalue(name)
    run = session.mixed_runner.run([], keep_values=True)
    assert run.units == 0 and run.passed and run.error == 0.0
    differing = [op.name for op in session.ops
                 if not all(_same_bits(mine, recorded) for mine, recorded in
                            zip(run.values[op.name], session.source_values(op.index)))]
    assert differing == []
    assert all(check.top1 in (None, 1.0) for check in run.outputs)


def test_everything_offloaded_equals_the_propagated_replay(mlp):
    fresh(mlp)
    run = mlp.mixed_runner.run(range(len(mlp.ops)), verdicts=True, keep_values=True)
    assert run.units == len(unit_bounds(mlp.ops, top_level_blocks(mlp.ops))) - 1  # one unit per block span
    last = mlp.ops[-1]
    assert run.verdicts[last.index].status == mlp.verdicts.propagated(last.index).status
    replayed = mlp.replay.values  # the propagated replay's value of every op upstream of the output
    assert len(replayed) == len(mlp.ops)
    assert [name for name, values in replayed.items()
            if not all(_same_bits(a, b) for a, b in zip(run.values[name], values))] == []


def test_a_mixed_run_feeds_target_values_into_source_ops(planted_mlp):
    """Only the planted layer on the target: the source ops after it compute from its wrong value."""
    session = fresh(planted_mlp)
    run = session.run_mixed(parse_offload(session.op_table, PLANTED_LAYER))
    failing = run.failing_ops()
    planted = session.by_name[PLANTED_OP].index
    assert failing and failing[0] == planted and not run.passed
    after_layer = [i for i in failing if i > max(session.op_table.layer_ops(PLANTED_LAYER))]
    assert after_layer, "the error must reach the source ops downstream"
    assert session.replay.offload == set(range(len(session.ops)))  # a mixed run leaves the session's state alone


def test_a_fault_in_one_layer_fails_exactly_the_steps_that_include_it(planted_mlp):
    session = fresh(planted_mlp)
    result = session.migrate()
    assert [step.label for step in result.steps] == ["blocks.0 +3 ops outside the blocks", "blocks.1",
                                                      "blocks.2 +5 ops outside the blocks"]
    assert [step.passed for step in result.steps] == [True, False, False]  # steps 2 and 3 hold blocks.1
    assert result.first_failing_step == 2
    assert result.steps[0].offload == list(range(result.steps[0].new[-1] + 1))  # ops before block 0 join step 1
    assert result.steps[-1].offload == list(range(len(session.ops)))  # the head joins the last step
    assert result.culprit.name == PLANTED_OP and result.culprit.verdict == ISOLATED
    assert result.compiled <= len(result.steps)  # a step compiles only its new block


def test_one_at_a_time_ranks_the_faulty_layer_first(planted_mlp):
    session = fresh(planted_mlp)
    result = session.migrate(one_at_a_time=True)
    labels = [step.label for step in result.steps]
    assert labels == [BEFORE_BLOCKS, "blocks.0", "blocks.1", "blocks.2", AFTER_BLOCKS]
    by_number = {step.number: step for step in result.steps}
    assert by_number[result.ranking[0]].label == PLANTED_LAYER
    assert [step.label for step in result.steps if not step.passed] == [PLANTED_LAYER]
    assert result.culprit.name == PLANTED_OP


def test_a_real_fp16_divergence_shows_where_the_output_breaks(demo_session):
    session = fresh(demo_session)
    result = session.migrate()
    assert [step.label.split()[0] for step in result.steps] == ["query", "out"]  # no numbered blocks: modules
    assert [step.passed for step in result.steps] == [True, False]
    broken = result.steps[1]
    assert broken.run.top1 is not None and broken.run.top1 < 1.0  # the argmax of the output moves
    assert result.culprit.name == "_softmax" and result.culprit.verdict == ISOLATED
    assert result.culprit.wrong == WrongClass.PRECISION


def test_run_json_shape_and_exit_code(traces, capsys):
    trace = str(traces.get("mlp"))
    assert main(["run", trace, "--offload", "none", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["offload"] == [] and data["passed"] is True
    assert [set(output) >= {"passed", "metrics"} for output in data["outputs"]] == [True]
    assert data["outputs"][0]["metrics"]["max_abs_err"] == 0.0 and data["failing"] == []


def test_migrate_json_shape(traces, planted_faults, capsys):
    trace = str(traces.get("mlp"))
    assert main(["migrate", trace, "--json", "--transform", f"{planted_faults}:scale"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [{"metrics", "offload", "passed"} <= set(step) for step in data["steps"]] == [True] * 3
    assert data["first_failing_step"] == 2
    assert {"index", "name", "op", "layer", "verdict"} <= set(data["culprit"])
    assert data["culprit"]["name"] == PLANTED_OP and data["culprit"]["verdict"] == "isolated"


def test_bad_offload_spec_is_a_one_line_error(traces, capsys):
    assert main(["run", str(traces.get("mlp")), "--offload", "blocks.9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "blocks.9" in err and len(err.splitlines()) == 1


def test_offload_specs(mlp):
    table = mlp.op_table
    assert parse_offload(table, "all") == list(range(len(mlp.ops)))
    assert parse_offload(table, "none") == []
    assert parse_offload(table, "0:3,blocks.2") == [0, 1, 2] + mlp.op_table.layer_ops("blocks.2")
    with pytest.raises(UsageError):
        parse_offload(table, " ")


def test_a_trace_without_source_graph_refuses_source_ops_fed_by_the_target():
    """trace v1.1 (no source graph): offloaded values cannot cross into the source; one line says what to do."""
    from pathlib import Path

    from tapml_dbg.engine.session import Session

    fixture = Path(__file__).parent / "fixtures" / "trace_v1_1.h5"
    with Session.open(fixture) as session:
        with pytest.raises(TraceError, match="no source graph") as refused:
            session.run_mixed([1], verdicts=False)
        assert "--offload all" in str(refused.value) and "\n" not in str(refused.value)


def test_repl_run_after_boundary_is_the_cli_run(planted_mlp):
    import io

    from tapml_dbg.ui.console import make_console
    from tapml_dbg.ui.repl.app import Repl
    from tapml_dbg.ui.repl.completion import suggest

    session = fresh(planted_mlp)
    buffer = io.StringIO()
    console = make_console(buffer)
    repl = Repl(session, out=console, err=console, launch={"trace": str(session.reader.path)}, show_progress=False)
    boundary = max(session.op_table.layer_ops(PLANTED_LAYER)) + 1
    for line in (f"boundary {boundary}", "where", "run", "run blocks.9"):
        repl.execute(line)
    text = buffer.getvalue()
    assert f"offload  0..{boundary - 1} ({boundary} of {len(session.ops)} ops) on the target" in text
    assert f"mixed run on llvm: 0..{boundary - 1} ({boundary} of" in text and "the output is wrong" in text
    assert f"#13 {PLANTED_OP} FAIL" in text
    assert "error: no op or layer named 'blocks.9'" in text  # the session survives a bad selector
    assert {s.text for s in suggest("migrate --by ", session=session)} == {"layer", "op"}
    assert "all" in {s.text for s in suggest("run a", session=session)}
