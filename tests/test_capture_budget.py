"""Capture budgets (`record --window` / `--max-bytes`) and the recorder's exact host helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import EXAMPLES, fault_transform, run_cli
from tapml_dbg.errors import UsageError
from tapml_dbg.record.recorder import record
from tapml_dbg.engine.session import Session
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.capture import CapturePlan, op_bytes, parse_size, plan_capture

MLP = str(EXAMPLES / "mlp.py")
LAYER = "blocks.1"


@pytest.fixture(scope="module")
def recorded(traces, tmp_path_factory):
    """Full and windowed recordings of examples/mlp.py: the full one is the suite's shared recording,
    the window of ops is recorded through the CLI (`record --window 8:16`, what it printed kept), the
    layer window through `record()`."""
    folder = tmp_path_factory.mktemp("capture")
    mlp_window, printed = traces.record(MLP, "--window", "8:16", name="mlp")
    paths = {"mlp": traces.get("mlp"), "mlp_window": mlp_window, "mlp_layer": folder / "mlp_layer.h5"}
    results = {"mlp_layer": record(MLP, paths["mlp_layer"], window=LAYER), "mlp_window": printed}
    return paths, results


def _same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _op_tensor_bytes(reader: TraceReader) -> int:
    return sum(sum(a.nbytes for a in reader.tensors.op_outputs(i)) for i in reader.recorded.finished_ops())


def _boundary(ops: list[dict], first: int, end: int) -> set[int]:
    index = {op["name"]: op["index"] for op in ops}
    return {index[name] for op in ops[first:end] for name in op["inputs"] if index.get(name, end) < first}


@pytest.mark.parametrize("full,windowed,first,end", [("mlp", "mlp_window", 8, 16), ("mlp", "mlp_layer", None, None)])
def test_window_stores_tensors_only_there_and_stats_everywhere(recorded, full, windowed, first, end):
    paths, results = recorded
    with TraceReader(paths[full]) as whole, TraceReader(paths[windowed]) as part:
        ops = part.outline.ops
        capture = part.outline.capture
        if first is None:  # a layer: the window spans the layer's ops
            inside = [op["index"] for op in ops if op["layer"] == LAYER or op["layer"].startswith(LAYER + ".")]
            first, end = min(inside), max(inside) + 1
            assert capture["layer"] == LAYER
        assert (capture["first"], capture["end"]) == (first, end)
        assert part.complete and part.version >= (1, 1)
        stored = set(part.recorded.finished_ops())
        assert stored == set(range(first, end)) | _boundary(ops, first, end)
        assert stored == set(CapturePlan.from_meta(capture).stored)
        assert set(part.recorded.stats_only_ops()) == set(range(len(ops))) - stored
        for index in range(len(ops)):  # every op has stats, and the same as in the full trace
            assert part.recorded.has_stats(index)
            assert part.tensors.op_stats(index) == whole.tensors.op_stats(index), index
            assert part.recorded.op_note(index) == whole.recorded.op_note(index)
        for index in stored:  # stored values are the full recording's, bit for bit
            assert all(_same_bits(a, b) for a, b in zip(part.tensors.op_outputs(index), whole.tensors.op_outputs(index)))
        window_bytes, full_bytes = _op_tensor_bytes(part), _op_tensor_bytes(whole)
        assert window_bytes == capture["stored_bytes"]
        assert window_bytes < 0.6 * full_bytes
        assert part.file_size < whole.file_size - 0.8 * (full_bytes - window_bytes)
        assert len(stored) < len(whole.recorded.finished_ops()) == len(ops)
    if windowed == "mlp_layer":
        assert results[windowed].stored_ops == len(stored)
    else:  # `record --window` through the CLI says how many ops it stored
        assert f"tensors stored for {len(stored)} of {len(ops)} ops" in results[windowed], results[windowed]


def test_isolated_verdicts_inside_pass_outside_say_what_to_record(recorded):
    paths, _ = recorded
    with Session.open(paths["mlp_layer"]) as session:
        capture = session.reader.outline.capture
        first, end = capture["first"], capture["end"]
        verdicts = session.verdicts.isolated_many(list(range(first, end)))
        assert all(v.status == "pass" for v in verdicts.values()), [v for v in verdicts.values() if not v.passed]
        # past the window, an op in no layer as deep as the window's (the head): a window of ops is suggested
        outside = next(i for i in range(end + 2, len(session.ops)) if session.ops[i].layer.count(".") < LAYER.count("."))
        verdict = session.isolated(outside)
        assert verdict.status == "missing"
        name = session.ops[outside].name
        message = verdict.message
        assert message.startswith(f"op {outside} ({name}) has only stats in this trace")
        assert f"recorded with --window {LAYER}" in message
        assert f"record that window: tapml-dbg record {MLP} --window " in message
        suggested = message.rsplit("--window ", 1)[1]
        a, b = (int(x) for x in suggested.split(":"))
        assert a <= outside < b
        inner = next(i for i in range(first) if session.ops[i].layer.startswith("blocks.0."))
        assert "--window blocks.0" in session.isolated(inner).message  # a layer window suggests layers
        boundary = first - 1  # stored (the window reads it) but its own inputs are not
        if boundary in session.recorded:
            assert "reads op" in session.isolated(boundary).message
        with pytest.raises(Exception, match="has only stats"):
            session.source_values(outside)


def test_planted_fault_inside_the_window_is_found(recorded, tmp_path):
    paths, _ = recorded
    with Session.open(paths["mlp_layer"]) as session:
        first, end = session.reader.outline.capture["first"], session.reader.outline.capture["end"]
        target = next(op for op in session.ops[first + (end - first) // 2:end]
                      if op.relax_op.startswith("relax.") and op.outputs and op.outputs[0].dtype == "float32"
                      and not op.is_tuple and "reshape" not in op.relax_op)
    transform = fault_transform(tmp_path, "scale", target.name)
    with Session.open(paths["mlp_layer"], transform=transform) as session:
        result = session.bisect()
    assert result.diverged and result.culprit.name == target.name
    assert result.culprit.verdict == "isolated"
    assert all(first <= k < end for k, _ in result.search), result.search  # it searched the window
    assert any("holds tensors for ops" in note for note in result.notes)


def test_max_bytes_is_respected(traces, tmp_path):
    path = tmp_path / "budget.h5"
    with TraceReader(traces.get("mlp")) as whole:
        ops = whole.outline.ops
        budget = sum(op_bytes(op) for op in ops[:10]) + 1  # roughly the first 10 ops
    result = record(MLP, path, max_bytes=budget)
    with TraceReader(path) as part:
        capture = part.outline.capture
        assert capture["first"] == 0 and capture["truncated"] and capture["max_bytes"] == budget
        stored_bytes = _op_tensor_bytes(part)
        assert stored_bytes == capture["stored_bytes"] <= budget
        end = capture["end"]
        assert set(part.recorded.finished_ops()) == set(range(end))
        assert stored_bytes + op_bytes(ops[end]) > budget  # the next op would not have fitted
        assert len(part.recorded.stats_only_ops()) == len(ops) - end
    assert result.stored_ops == end
    # a window and a budget together: the budget cuts the window short
    plan = plan_capture(ops, "12:24", budget)
    assert plan.first == 12 and plan.end < 24 and plan.stored_bytes <= budget
    with pytest.raises(UsageError, match="too small"):
        plan_capture(ops, None, 1)


def test_bad_windows_and_sizes_are_usage_errors():
    ops = [{"index": i, "name": f"op{i}", "layer": "blocks.0.fc" if i < 3 else "head", "inputs": [],
            "outputs": [{"shape": [2, 2], "dtype": "float32"}]} for i in range(5)]
    assert plan_capture(ops) is None
    assert (plan_capture(ops, "blocks.0").first, plan_capture(ops, "blocks.0").end) == (0, 3)
    assert (plan_capture(ops, "3:").first, plan_capture(ops, "3:").end) == (3, 5)
    assert (plan_capture(ops, "op4").first, plan_capture(ops, "op4").end) == (4, 5)
    with pytest.raises(UsageError, match="did you mean blocks.0"):
        plan_capture(ops, "blocks.9")
    with pytest.raises(UsageError, match="holds no op"):
        plan_capture(ops, "4:2")
    assert parse_size("200M") == 200_000_000 and parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("4096") == 4096
    with pytest.raises(UsageError, match="bad size"):
        parse_size("lots")


def test_cli_record_window_and_info(recorded, tmp_path):
    paths, results = recorded
    path = paths["mlp_window"]  # `tapml-dbg record examples/mlp.py --window 8:16`
    assert "tensors stored for" in results["mlp_window"]
    info = json.loads(run_cli("info", str(path), "--json").stdout)
    assert info["capture"]["window"] == "8:16" and info["capture"]["layer"] is None
    assert info["stats_only_ops"] > 0 and all(op["stats"] for op in info["ops"])
    assert sum(op["recorded"] for op in info["ops"]) == info["recorded_ops"] < info["num_ops"]
    human = run_cli("info", str(path))
    assert human.returncode == 0 and "capture" in human.stdout and "--window 8:16" in human.stdout
    bad = run_cli("record", MLP, "-o", str(tmp_path / "x.h5"), "--window", "blokcs.1")
    assert bad.returncode == 1 and "did you mean" in bad.stderr


def test_writer_stats_only_ops_and_what_a_v1_0_reader_sees(tmp_path):
    import h5py

    from tapml_dbg.errors import TraceError
    from tapml_dbg.trace import TraceWriter, tensor_stats

    path = tmp_path / "t.h5"
    x = np.array([[1.0, np.nan], [-3.0, 2.5]], np.float32)
    ops = [{"index": i, "name": f"lv{i}", "layer": "fc", "inputs": [], "outputs": []} for i in range(3)]
    capture = {"window": "0:1", "max_bytes": None, "first": 0, "end": 1, "layer": None, "stored": [[0, 0]],
               "stored_bytes": 16, "truncated": False}
    with TraceWriter(path, meta={"model": "m.py", "capture": capture}, graph_json="{}", tvmscript="", ops=ops,
                     inputs={}, params={}, capture=True) as writer:
        writer.write_op(0, [x], note="a")
        writer.write_op_stats(1, [x.T], note="b")  # stats of a transposed view = of its contiguous copy
        with pytest.raises(ValueError, match="already written"):
            writer.write_op(1, [x])
    with TraceReader(path) as reader:
        assert reader.recorded.finished_ops() == [0] and reader.recorded.stats_only_ops() == [1]
        assert reader.recorded.has_stats(1) and not reader.recorded.has_stats(2) and not reader.recorded.has_op(1)
        assert reader.tensors.op_stats(1) == [tensor_stats(np.ascontiguousarray(x.T))] and reader.recorded.op_note(1) == "b"
        with pytest.raises(TraceError, match=r"op 1 \(lv1\) has only stats in this trace \(recorded with "
                                             r"--window 0:1.*record that window: tapml-dbg record m.py --window"):
            reader.tensors.op_outputs(1)
    with h5py.File(path, "r") as f:  # what a v1.0 reader looks at: op 1 is simply not recorded
        assert f["ops/1"].attrs["done"] == 0 and len(f["ops/1"]) == 0 and f["ops/0"].attrs["done"] == 1
    plain = tmp_path / "plain.h5"
    with TraceWriter(plain, meta={}, graph_json="{}", tvmscript="", ops=ops, inputs={}, params={}) as writer:
        with pytest.raises(ValueError, match="capture=True"):
            writer.write_op_stats(0, [x])


KILLED_CHILD = """
import sys
import numpy as np
from tapml_dbg.trace import TraceWriter

n = 3000
w = TraceWriter(sys.argv[1], meta={"model": "kill", "capture": {"first": 0, "end": n}}, graph_json="{}",
                tvmscript="", ops=[{"index": i, "name": f"op{i}"} for i in range(n)], inputs={}, params={},
                capture=True)
for i in range(n):
    values = [np.full((i % 5 + 1, 40), i, np.float32)]
    if i % 3:
        w.write_op_stats(i, values, note=f"op {i}")
    else:
        w.write_op(i, values, note=f"op {i}")
    print(i, flush=True)
"""


def test_sigkill_during_a_capture_recording_leaves_readable_stats(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tapml_dbg.trace import tensor_stats

    path = tmp_path / "killed.h5"
    root = str(EXAMPLES.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                             env=env)
    printed = []
    try:
        while len(printed) < 200:
            line = child.stdout.readline()
            assert line, "writer exited early"
            printed.append(int(line))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    with TraceReader(path) as reader:
        assert not reader.complete
        with_stats = [i for i in range(3000) if reader.recorded.has_stats(i)]
        assert set(printed) <= set(with_stats) and len(with_stats) < 3000
        for i in with_stats:
            want = tensor_stats(np.full((i % 5 + 1, 40), i, np.float32))
            assert reader.tensors.op_stats(i) == [want] and reader.recorded.op_note(i) == f"op {i}"
            assert reader.recorded.has_op(i) == (i % 3 == 0)
