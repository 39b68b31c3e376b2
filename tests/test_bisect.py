"""Bisection on planted faults at known ops, on real TVM 0.27 divergences, and on clean replays."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import EXAMPLES, fault_transform, run_cli
from tapml_dbg.engine.references import SourceReference
from tapml_dbg.engine.search import LOST_CHAIN_NOTE
from tapml_dbg.engine.session import Session
from tapml_dbg.runtime.target import DEFAULT_UNIT_TIMEOUT_S

HANG_LIMIT_S = 2  # the planted hang never ends: the limit only sets how long the test waits for it


def _bisect(path, folder=None, fault=None, op=None, sweep=True, **settings):
    transform = fault_transform(folder, fault, op, **settings) if fault else None
    with Session.open(path, transform=transform) as session:
        return session.bisect(sweep=sweep), session


def _middle_float_op(path) -> str:
    with Session.open(path) as session:
        ops = session.ops
        for op in ops[len(ops) // 2:]:
            if op.relax_op.startswith("relax.") and op.outputs and op.outputs[0].dtype == "float32" \
                    and not op.is_tuple and "reshape" not in op.relax_op:
                return op.name
    raise AssertionError("no float op in the second half")


@pytest.mark.parametrize("example", ["cnn", "tiny_gpt2", "tiny_llama"])  # mlp: test_sticky_faults, test_api
def test_clean_replay_reports_nothing(traces, example):
    result, _ = _bisect(traces.get(example))
    assert not result.diverged, result.culprit


@pytest.mark.parametrize("op,index", [("permute", 0), ("gelu_1", 13), ("_softmax", 24)])
def test_planted_fault_first_middle_last_mlp(traces, tmp_path, op, index):
    result, session = _bisect(traces.get("mlp"), tmp_path, "scale", op)
    assert result.diverged
    assert (result.culprit.index, result.culprit.name) == (index, op)
    assert result.culprit.verdict == "isolated"
    assert math.isclose(result.culprit.metrics.scale_rel_err, 0.01, rel_tol=0.05)


@pytest.mark.parametrize("example", ["cnn", "tiny_gpt2", "tiny_llama"])
def test_planted_fault_in_the_middle(traces, tmp_path, example):
    path = traces.get(example)
    op = _middle_float_op(path)
    result, session = _bisect(path, tmp_path, "scale", op, sweep=False)
    assert result.diverged and result.culprit.name == op
    assert result.culprit.verdict == "isolated"
    n = result.ops
    searched = [probe for probe in result.search]
    assert len(searched) <= math.ceil(math.log2(n)) + 1  # O(log N) prefix probes
    assert result.probes <= len(searched) + 2  # plus the isolated confirmation


def test_fault_below_tolerance_is_not_reported(traces, tmp_path):
    result, _ = _bisect(traces.get("mlp"), tmp_path, "scale", "gelu_1", scale="1.0000001")
    assert not result.diverged


def test_fault_that_shows_only_on_large_inputs(traces, tmp_path):
    result, _ = _bisect(traces.get("mlp"), tmp_path, "clip", "addmm", limit=8)
    assert not result.diverged  # small random inputs never reach the clamp
    np.savez(tmp_path / "big.npz", x=(np.random.default_rng(0).standard_normal((4, 16)) * 60).astype(np.float32))
    big = tmp_path / "big.h5"
    assert run_cli("record", str(EXAMPLES / "mlp.py"), "-o", str(big), "--inputs", str(tmp_path / "big.npz")).returncode == 0
    result, _ = _bisect(big, tmp_path, "clip", "addmm", limit=8)
    assert result.diverged and result.culprit.name == "addmm"


def test_fault_that_washes_out_is_still_found(traces, tmp_path):
    op = "_native_batch_norm_legit_no_training"  # followed by a ReLU that erases the fault
    path = traces.get("cnn")
    transform = fault_transform(tmp_path, "scale_negative", op)
    with Session.open(path, transform=transform) as session:
        last = len(session.ops) - 1
        assert session.verdicts.propagated(last).passed  # the model's output is fine...
        for sweep in (True, False):  # ...yet the op is found, by the chain that judges every value
            result = session.bisect(sweep=sweep)
            assert result.diverged and result.culprit.name == op
            assert result.culprit.verdict == "isolated"


def test_crashing_kernel_is_a_finding_and_the_session_survives(traces, tmp_path, monkeypatch):
    """A kernel that crashes its worker (SIGSEGV) is the culprit, verdict `crash`, and the session goes
    on. The chain dies without saying where, so fused prefix probes search; a probe's values that clear
    the propagated screen pass without a full verdict, whose float64 reference is a run of the whole
    source graph (on the 1.1B Llama, most of a crash's bisect): no such run is made, and the answer is
    the same."""
    runs = []
    full_run = SourceReference.full_run
    monkeypatch.setattr(SourceReference, "full_run", lambda self: runs.append(1) or full_run(self))
    result, session = _bisect(traces.get("mlp"), tmp_path, "out_of_bounds", "gelu_1")
    assert result.diverged and result.culprit.name == "gelu_1"
    assert result.culprit.verdict == "crash"
    assert "SIGSEGV" in result.culprit.message
    assert any(note.startswith(LOST_CHAIN_NOTE) for note in result.notes)  # the chain died with it
    assert result.probes >= 2
    assert runs == []


def test_hanging_compile_times_out(traces, tmp_path):
    """The hang sleeps for an hour: any limit cuts it; the fresh worker's first unit (a worker started
    and a unit compiled, on a loaded machine) gets the default limit."""
    transform = fault_transform(tmp_path, "hang", "gelu")
    with Session.open(traces.get("mlp"), transform=transform, timeout_s=HANG_LIMIT_S) as session:
        verdict = session.isolated(7)
        assert verdict.status == "timeout"
        session.pool.timeout_s = DEFAULT_UNIT_TIMEOUT_S
        assert session.isolated(3).status == "pass"  # a fresh worker takes over


# fp16_memory_attention's #9 _softmax: the README's bisect transcript and test_api (`bisect --json` = the API's answer)
@pytest.mark.parametrize("example,op,aten", [
    ("fp16_stats_pool", "mean", "aten.mean.dim"),
])
def test_real_tvm_divergence_found_in_the_middle(traces, example, op, aten):
    result = run_cli("bisect", str(traces.get(example)), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["diverged"]
    culprit = data["op"]
    assert (culprit["name"], culprit["op"], culprit["verdict"]) == (op, aten, "isolated")
    assert 0 < culprit["index"] < data["ops"] - 2  # in the middle of the model
    assert culprit["metrics"]["scale_rel_err"] > 0.03


def test_cli_json_contract_on_planted_fault(traces, tmp_path):
    result = run_cli("bisect", str(traces.get("tiny_gpt2")), "--transform",
                     fault_transform(tmp_path, "scale", "tanh_1"), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) >= {"diverged", "ops", "probes", "op"}
    op = data["op"]
    assert data["diverged"] and op["name"] == "tanh_1" and op["op"] == "aten.tanh.default"
    assert op["layer"] == "transformer.h.1.mlp.act" or op["layer"].startswith("transformer.h.1")
    assert op["verdict"] == "isolated" and op["metrics"]["max_abs_err"] > 0
