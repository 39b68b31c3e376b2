"""The live source reference: the source graph in the trace, the source runner, type verdicts, the
noise floor, undefined values and the class of wrong (docs/tolerance.md, docs/trace-format.md)."""

from __future__ import annotations

import json
import shutil
import textwrap

import h5py
import numpy as np
import pytest

from conftest import fault_transform
from tapml_dbg.engine.references import load_source_graph
from tapml_dbg.engine.search import TYPE_NOTE
from tapml_dbg.engine.session import Session
from tapml_dbg.errors import TraceError
from tapml_dbg.judge.classify import Evidence, Facts, classify
from tapml_dbg.judge.compare import Metrics, PolicyKind, TolerancePolicy
from tapml_dbg.judge.verdict import Status, WrongClass
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.record.recorder import record
from tapml_dbg.host import source_runner
from tapml_dbg.host.source_runner import SourceRunner
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace import schema as S
from tapml_dbg.trace.inspect import trace_info
from tapml_dbg.trace.source_graph import parse_source_graph

# Models whose TVM 0.27 import changes what the source computes, and a few that exercise the other classes.
MODELS = {
    # a float result imported as an integer one: int64 * 0.5 -> TVM declares an int64 product (of 0.5 made 0)
    "int_scale": """
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)
            def forward(self, x, counts):
                return torch.relu(self.fc(x) + (counts * 0.5).float())
        def build():
            return M().eval(), (torch.randn(4, 8), torch.arange(32).reshape(4, 8) * 2)
    """,
    # a float width narrowed: a float64 convolution imported with a float32 result
    "f64_conv": """
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv1d(4, 4, 3, padding=1, bias=False)
            def forward(self, x):
                return torch.tanh(self.conv(x) * 2.0)
        def build():
            return M().double().eval(), (torch.randn(2, 4, 16, dtype=torch.float64),)
    """,
    # a reduction imported with another output shape: mean over dim=() is all dims in torch, none in TVM
    "mean_shape": """
        class M(torch.nn.Module):
            def forward(self, x):
                return torch.sigmoid(x - x.mean(dim=()))
        def build():
            return M().eval(), (torch.randn(4, 8),)
    """,
    # circular padding is built on torch.empty: the uninitialised parts are never judged
    "circular_pad": """
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv1d(2, 2, 3)
            def forward(self, x):
                return self.conv(torch.nn.functional.pad(x, (1, 1), mode="circular"))
        def build():
            return M().eval(), (torch.randn(1, 2, 8),)
    """,
    # a negative index: TVM 0.27 imports a "fast" take that reads outside the tensor
    "neg_index": """
        class M(torch.nn.Module):
            def forward(self, x):
                return x[:, [-1]] * 2.0
        def build():
            return M().eval(), (torch.randn(4, 6),)
    """,
    # fp16 reductions that TVM 0.27's llvm legalization sums in fp16 (the README's findings, small)
    "fp16_sums": """
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.down = torch.nn.Linear(4096, 8)
            def forward(self, x):
                return self.down(x), x.mean(dim=1)
        def build():
            return M().half().eval(), (torch.randn(2, 4096).half(),)
    """,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Record each model once, in this process (no CLI start-up)."""
    folder = tmp_path_factory.mktemp("source_reference")
    paths = {}

    def get(name: str):
        if name not in paths:
            model = folder / f"{name}.py"
            model.write_text("import torch\n" + textwrap.dedent(MODELS[name]))
            paths[name] = folder / f"{name}.h5"
            record(str(model), paths[name])
        return paths[name]
    return get


def _op(session, name: str) -> int:
    return session.by_name[name].index


# ---------------------------------------------------------------------------- the source graph and runner
@pytest.mark.parametrize("example", ["mlp", "cnn", "tiny_gpt2"])
def test_source_runner_reproduces_every_recorded_value_bit_for_bit(traces, example):
    with TraceReader(traces.get(example)) as reader:
        graph = load_source_graph(reader)
        ops = [OpInfo.from_json(op) for op in reader.outline.ops]
        index = {op.name: op.index for op in ops}
        runner = SourceRunner(graph, lambda name: reader.tensors.op_outputs(index[name]),
                              lambda kind, name: reader.tensors.input(name) if kind == "input" else reader.tensors.param(name))
        checked = 0
        for op in ops:
            if not runner.holds(op.name):
                continue  # a helper binding: no FX node of its own
            again, recorded = runner.op_value(op), reader.tensors.op_outputs(op.index)
            assert len(again) == len(recorded)
            for a, b in zip(again, recorded):
                a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
                assert (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes(), op.name
            checked += 1
        assert checked >= len(ops) // 2  # most ops hold their FX node's value
        promoted = runner.op_value(next(op for op in ops if runner.holds(op.name) and op.outputs[0].dtype == "float32"),
                                   promote=True)
        assert promoted[0].dtype == np.float64


def test_crafted_source_graph_is_refused_and_runs_nothing(traces, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(source_runner, "resolve_target", lambda target: calls.append(target))
    original = TraceReader(traces.get("mlp"))
    text = original.outline.source_graph_json
    original.close()
    graph = json.loads(text)
    crafted = {
        "an overload outside the allowlist": ("nodes", 0, "target", "aten._foreach_add.List"),
        "a Python callable": ("nodes", 0, "target", "builtins.eval"),
        "a reference to a Python object": ("nodes", 0, "args", [{"callable": "os.system"}]),
        "a reference to an undefined node": ("nodes", 0, "args", [{"node": "later"}]),
    }
    for why, (key, number, field, value) in crafted.items():
        bad = json.loads(text)
        bad[key][number][field] = value
        path = tmp_path / f"{len(why)}.h5"
        shutil.copy(traces.get("mlp"), path)
        data = np.frombuffer(json.dumps(bad).encode(), dtype=np.uint8)
        with h5py.File(path, "r+") as f:
            del f[S.DS_SOURCE_GRAPH]
            f.create_dataset(S.DS_SOURCE_GRAPH, data=data)
            if hasattr(S, "ATTR_CHECKSUM"):  # the trace stays intact: only its content is crafted
                f[S.DS_SOURCE_GRAPH].attrs[S.ATTR_CHECKSUM] = np.uint32(S.checksum(data))
        with pytest.raises(TraceError, match="source graph is refused"):
            Session.open(path)
    with pytest.raises(TraceError, match="allowlist"):
        parse_source_graph(json.dumps({**graph, "nodes": [{**graph["nodes"][0], "target": "aten._foreach_add.List"}]}))
    deep = {"tuple": []}
    for _ in range(40):
        deep = {"tuple": [deep]}
    with pytest.raises(TraceError, match="deeper"):
        parse_source_graph(json.dumps({**graph, "nodes": [{**graph["nodes"][0], "args": [deep]}]}))
    assert calls == []  # nothing was looked up on torch, let alone run


def test_old_traces_have_no_source_graph_and_use_the_fixed_rule():
    with TraceReader("tests/fixtures/trace_v1.h5") as reader:
        assert reader.outline.source_graph_json is None
        assert load_source_graph(reader) is None


# ---------------------------------------------------------------------------- type verdicts
@pytest.mark.parametrize("model,op,what", [("int_scale", "mul", "dtype int64 vs source float32"),
                                           ("f64_conv", "convolution", "dtype float32 vs source float64"),
                                           ("mean_shape", "mean", "shape (4, 8) vs source ()")])
def test_an_import_that_changes_the_type_is_bisected_to_that_op(models, model, op, what):
    path = models(model)
    with Session.open(path) as session:
        result = session.bisect(sweep=False)  # found by its type alone, without the isolated sweep
        assert result.diverged and result.culprit.name == op
        assert result.culprit.wrong == WrongClass.TYPE and result.culprit.verdict == "isolated"
        assert what in result.culprit.summary
        assert result.culprit.to_json()["class"] == "type"
        assert session.verdicts.type_changed_ops()[0] == _op(session, op)
    with TraceReader(path) as reader:  # the trace keeps the source's own value, not a cast of it
        index = next(o["index"] for o in reader.outline.ops if o["name"] == op)
        source = what.split("source ")[1]
        recorded = reader.tensors.op_outputs(index)[0]
        assert (str(recorded.dtype) if "dtype" in what else str(tuple(recorded.shape))) == source
        assert reader.recorded.op_note(index).startswith(S.TYPE_NOTE_PREFIX)
    changes = trace_info(str(path))["type_changes"]
    assert changes["dtype" if "dtype" in what else "shape"] >= 1


def test_a_type_change_no_value_shows_is_found_and_cast_at_replay(models):
    with Session.open(models("f64_conv")) as session:
        result = session.bisect()
        assert result.search[0][1] is False  # the model's output agrees with the source...
        assert result.culprit.name == "convolution" and TYPE_NOTE in result.notes  # ...yet the op is named
    with Session.open(models("int_scale")) as session:
        mul = _op(session, "mul")
        fed = session.requests.recorded_ref("mul", -1)  # consumers get the declared type, cast at replay
        assert fed[0] == "value" and fed[1].dtype == np.int64
        consumer = next(op.index for op in session.ops if "mul" in op.inputs)
        assert "cast at replay time" in session.isolated(consumer).message
        assert session.isolated(mul).wrong == WrongClass.TYPE


# ---------------------------------------------------------------------------- the noise floor
def test_a_1e_4_fault_in_an_fp32_elementwise_op_is_caught_where_the_fixed_rule_misses_it(traces, tmp_path):
    transform = fault_transform(tmp_path, "scale", "gelu_1", scale="1.0001")
    with Session.open(traces.get("mlp"), transform=transform) as session:
        verdict = session.isolated(_op(session, "gelu_1"))
        assert verdict.failed and verdict.worst.policy == PolicyKind.NOISE_FLOOR
        assert verdict.worst.ratio > 100  # "target ...x the source's own error"
        assert verdict.wrong == WrongClass.SEMANTIC
        result = session.bisect()
        assert result.culprit.name == "gelu_1" and result.culprit.verdict == "isolated"
        session.verdicts.set_policy(TolerancePolicy(kind=PolicyKind.FIXED))  # `tol fixed`
        assert session.isolated(_op(session, "gelu_1")).passed


def test_nan_fault_is_classed_nan_inf(traces, tmp_path):
    with Session.open(traces.get("mlp"), transform=fault_transform(tmp_path, "nan", "gelu_1")) as session:
        verdict = session.isolated(_op(session, "gelu_1"))
        assert verdict.failed and verdict.wrong == WrongClass.NAN_INF and "NaN" in verdict.evidence


def test_fp16_accumulations_are_classed_precision(models):
    with Session.open(models("fp16_sums")) as session:
        for name in ("addmm_p0", "mean"):  # the matmul inside the Linear, and the mean over 4096
            verdict = session.isolated(_op(session, name))
            assert verdict.failed and verdict.wrong == WrongClass.PRECISION, (name, verdict.evidence)
            assert "accumulating in float16" in verdict.evidence


def test_negative_index_gather_is_nondeterministic_or_semantic(models):
    with Session.open(models("neg_index")) as session:
        result = session.bisect()
        assert result.culprit.name == "index"
        assert result.culprit.wrong in (WrongClass.NONDETERMINISTIC, WrongClass.SEMANTIC)


def test_classes_from_evidence():
    """The order of the checks (judge/classify.py), on synthetic values."""
    source = [np.ones(8, dtype=np.float32)]
    target = [np.full(8, 1.5, dtype=np.float32)]
    failing = [Metrics(passed=False, ratio=1e4, scale_rel_err=0.5)]
    rerun = [np.full(8, 1.25, dtype=np.float32)]
    assert classify(failing, target, source, [None], Facts(), Evidence(rerun=rerun)).wrong == WrongClass.NONDETERMINISTIC
    assert classify(failing, target, source, [None], Facts(), Evidence(rerun=list(target))).wrong == WrongClass.SEMANTIC
    explained = classify(failing, target, source, [source[0].astype(np.float64)], Facts(),
                         Evidence(low_precision=[np.full(8, 1.49, dtype=np.float32)]))
    assert explained.wrong == WrongClass.PRECISION
    assert classify(failing, target, source, [None], Facts(cast_inputs=["mul (output 0 as int64 (8,))"])).wrong \
        == WrongClass.TYPE


# ---------------------------------------------------------------------------- undefined values
def test_uninitialised_memory_is_not_judged(models):
    with Session.open(models("circular_pad")) as session:
        empty = _op(session, "empty")
        assert session.isolated(empty).status == Status.UNDEFINED
        assert session.verdicts.propagated(empty).status == Status.UNDEFINED
        assert not session.bisect().diverged  # TVM imports zeros for torch.empty: no false alarm
        session.verdicts.set_policy(TolerancePolicy(kind=PolicyKind.FIXED))
        assert session.isolated(empty).status == Status.UNDEFINED  # whatever the rule


def test_the_fixed_rule_judges_traces_without_a_source_graph(models, tmp_path):
    bare = tmp_path / "bare.h5"  # as a v1.1 trace, or one recorded with --source tvm:TARGET
    shutil.copy(models("neg_index"), bare)
    with h5py.File(bare, "r+") as f:
        del f[S.DS_SOURCE_GRAPH]
    with Session.open(bare) as session:
        assert not session.reference.available
        verdict = session.isolated(_op(session, "mul"))
        assert verdict.passed and verdict.worst.policy == PolicyKind.FIXED and verdict.worst.ratio is None
        assert "no source graph" in verdict.message
    with Session.open(models("neg_index"), policy=TolerancePolicy(kind=PolicyKind.FIXED)) as session:  # `tol fixed`
        assert session.isolated(_op(session, "mul")).worst.policy == PolicyKind.FIXED
