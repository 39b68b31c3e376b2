"""Sticky faults: a fault that poisons its worker's context is named at its own op, and no verdict
is taken from the poisoned process (docs/reliability.md, "Sticky faults").

On the CPU a planted transform (tests/transforms/poison.py) stands in for a CUDA fault: the named
op's unit fails with "CUDA Runtime Error: misaligned address (simulated ...)" and every later unit
of the process that ran it fails the same way, as every call after a CUDA fault does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from tapml_dbg.engine.session import Session
from tapml_dbg.runtime.messages import POISON_PATTERNS_ENV, UnitStatus, poisons_worker

POISON = Path(__file__).parent / "transforms" / "poison.py"
OP, INDEX = "gelu_1", 13  # the mlp's op that poisons its worker
MESSAGE = "CUDA Runtime Error: misaligned address"
RUNS = 3  # the same trace bisected this many times gives the same answer


def poison_transform(folder: Path, op: str, **settings) -> str:
    """A `FILE.py:poison` transform poisoning the process that runs `op` (SETTINGS in the file: the
    compile cache keys on the transform's text)."""
    values = {"op": op, **settings}
    path = folder / ("poison_" + "_".join(f"{k}{v}" for k, v in sorted(values.items())) + ".py")
    path.write_text(POISON.read_text() + f"\n\nSETTINGS = {values!r}\n")
    return f"{path}:poison"


def test_what_poisons_a_worker_is_defined_in_one_place(monkeypatch):
    assert poisons_worker(UnitStatus.CRASH) and poisons_worker(UnitStatus.TIMEOUT)
    for message in ("TVMError: CUDA Runtime Error: misaligned address", "CUDA: an illegal memory access was encountered",
                    "cudaErrorMisalignedAddress", "CUDA_ERROR_LAUNCH_FAILED"):
        assert poisons_worker(UnitStatus.ERROR, message), message
    assert poisons_worker(UnitStatus.COMPILE_ERROR, "CUDA error: misaligned address (querying the device)")
    assert not poisons_worker(UnitStatus.ERROR, "InternalError: Check failed: dtype mismatch")
    assert not poisons_worker(UnitStatus.OK) and not poisons_worker(UnitStatus.TARGET_LOST, MESSAGE)
    monkeypatch.setenv(POISON_PATTERNS_ENV, "VK_ERROR_OUT_OF_DATE|device hung")
    assert poisons_worker(UnitStatus.ERROR, "vulkan: device hung")


def test_bisect_names_only_the_op_that_poisoned_its_worker_the_same_every_run(traces, tmp_path):
    trace, transform = traces.get("mlp"), poison_transform(tmp_path, OP)
    answers = []
    for _ in range(RUNS):
        with Session.open(trace, transform=transform) as session:
            result = session.bisect()
            retired = session.lanes.retired
        culprit = result.culprit
        assert result.diverged and (culprit.index, culprit.name, culprit.verdict) == (INDEX, OP, "error"), culprit
        assert MESSAGE in culprit.message
        around = {step.index: step.isolated.status for step in result.neighbourhood}
        assert around == {i: ("error" if i == INDEX else "pass") for i in range(INDEX - 2, INDEX + 3)}, around
        assert retired >= 1  # every worker the fault reached was retired
        answers.append((culprit.index, culprit.verdict, sorted(around.items())))
    assert answers == [answers[0]] * RUNS


def test_cli_bisect_and_triage_blame_only_the_poisoning_op(traces, tmp_path):
    trace, transform = str(traces.get("mlp")), poison_transform(tmp_path, OP)
    found = run_cli("bisect", trace, "--transform", transform, "--json")
    assert found.returncode == 0, found.stderr
    op = json.loads(found.stdout)["op"]
    assert (op["index"], op["name"], op["verdict"]) == (INDEX, OP, "error")
    triaged = run_cli("triage", trace, "--transform", transform, "--json")
    assert triaged.returncode == 0, triaged.stderr
    blamed = [(o["index"], o["verdict"]) for group in json.loads(triaged.stdout)["groups"] for o in group["ops"]]
    assert blamed == [(INDEX, "error")], blamed  # not the ops run after it in its worker


def test_sweep_and_mixed_run_take_no_verdict_from_a_poisoned_worker(traces, tmp_path):
    with Session.open(traces.get("mlp"), transform=poison_transform(tmp_path, OP)) as session:
        every = list(range(len(session.ops) - 1))  # (the last op is the output tuple)
        verdicts = session.verdicts.isolated_many(every)
        assert {i for i, v in verdicts.items() if not v.passed} == {INDEX}
        run = session.run_mixed(every + [len(session.ops) - 1])  # `run --offload all`
        failing = sorted(i for i, v in run.verdicts.items() if v.failed)
        unit = [i for i in failing if session.ops[i].layer.startswith("blocks.1")]
        assert INDEX in failing and failing == unit, failing  # the unit that holds the op, nothing run after it
        session.verdicts.clear()
        assert session.isolated(INDEX + 1).passed  # the lane that ran it goes on in a fresh worker
        assert session.isolated(INDEX).status == "error"


def test_a_fault_reported_by_a_later_unit_is_run_again_in_a_fresh_worker(traces, tmp_path):
    """The op poisons its process silently (an asynchronous fault): the next unit of that worker
    fails, so that unit runs again in a fresh worker, which gives its verdict."""
    with Session.open(traces.get("mlp"), transform=poison_transform(tmp_path, OP, silent=1)) as session:
        assert session.isolated(INDEX).passed  # (the process it ran in is poisoned now)
        result = session.lanes.run(session.requests.isolated(INDEX + 1))
        assert result.ok and result.fresh_rerun
        assert session.isolated(INDEX + 2).passed
        assert session.pool.retired == 1


@pytest.mark.parametrize("example", ["mlp"])
def test_no_fault_no_retirement(traces, example):
    with Session.open(traces.get(example)) as session:
        result = session.bisect()
        assert not result.diverged
        assert session.lanes.retired == 0 and session.pool.restarts == 0
