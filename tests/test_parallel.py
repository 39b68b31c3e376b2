"""Parallel probes: a pool of target workers, one per device lane (local, or one per tracker server).

The answers must be the sequential ones; a crash in one lane is that unit's verdict only.
Real TVM RPC servers and a tracker on 127.0.0.1 (`Farm`).
"""

from __future__ import annotations

import json
import random

import pytest

from conftest import fault_transform, run_cli
from rpc_helpers import Server, Tracker, free_port
from tapml_dbg.runtime.pool import plan_lanes
from tapml_dbg.engine.search import SearchTrace, first_failing, first_failing_speculative
from tapml_dbg.errors import UsageError
from tapml_dbg.engine.session import Session

KEY = "cpu"


class Farm:
    """A real TVM tracker and two servers under KEY on 127.0.0.1 (tests/rpc_helpers.py), each server's log
    telling how many sessions it served."""

    def __init__(self, folder):
        self.tracker = Tracker()
        self.address = self.tracker.address
        self.servers = []
        try:
            self.servers += [Server(tracker=self.address, key=KEY, log_path=folder / f"server{n}.log")
                             for n in range(2)]
        except BaseException:
            self.stop()
            raise

    def sessions(self) -> list[int]:
        """How many sessions each server has served."""
        return [server.sessions() for server in self.servers]

    def free(self) -> int:
        return self.tracker.free(KEY)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.tracker.stop()


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """A tracker with two servers under one key."""
    farm = Farm(tmp_path_factory.mktemp("farm"))
    try:
        farm.tracker.wait_for_servers(KEY, 2)
        yield farm
    finally:
        farm.stop()


def _statuses(verdicts) -> dict[int, str]:
    return {index: verdict.status for index, verdict in verdicts.items()}


# ------------------------------------------------------------------------ pure logic
def test_speculative_search_makes_first_failings_path_for_any_predicate():
    rng = random.Random(0)
    for _ in range(400):
        lo = rng.randint(0, 3)
        hi = lo + rng.randint(-1, 40)
        if rng.random() < 0.5:
            start = rng.randint(lo, hi + 1)
            values = {k: k >= start for k in range(lo, hi + 1)}  # a persistent fault
        else:
            values = {k: rng.random() < 0.5 for k in range(lo, hi + 1)}  # washes out and comes back
        plain = SearchTrace()
        expected = first_failing(lo, hi, values.__getitem__, plain)
        for width in (1, 2, 3, 4):
            rounds = []
            fast = SearchTrace()

            def many(ks, width=width, rounds=rounds):
                assert 0 < len(ks) <= width and len(set(ks)) == len(ks)
                rounds.append(ks)
                return [values[k] for k in ks]

            assert first_failing_speculative(lo, hi, many, width, fast) == expected
            assert fast.probes == plain.probes
            assert len(rounds) <= max(len(plain.probes), 1)


def test_lane_plan():
    assert plan_lanes(None, None, None, None).lanes == 1
    assert plan_lanes(2, None, None, None).lanes == 2  # local: compile-bound work gains too
    single = plan_lanes(3, "127.0.0.1:9090", None, None)
    assert single.lanes == 1 and "one session at a time" in single.note
    unreachable = plan_lanes(None, None, f"127.0.0.1:{free_port()}", KEY)
    assert unreachable.lanes == 1  # the worker reports the unreachable tracker, as before
    with pytest.raises(UsageError):
        plan_lanes(0, None, None, None)


# ------------------------------------------------------------------------ over a tracker
def test_parallel_bisect_over_a_tracker_gives_the_sequential_answer_on_both_servers(traces, farm, tmp_path):
    path = traces.get("mlp")
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    with Session.open(path, transform=transform, cache_dir=tmp_path / "cache") as session:
        assert session.pool.size == 1  # local default
        sequential = session.bisect()
    before = farm.sessions()
    with Session.open(path, tracker=farm.address, key=KEY, transform=transform,
                      cache_dir=tmp_path / "cache") as session:
        assert session.pool.size == 2  # one lane per free server
        parallel = session.bisect()  # probes two prefixes a round, sweeps ops 0..12 one unit each over both lanes
        assert all(count > 0 for count in session.pool.units), session.pool.units  # both lanes worked
        assert farm.free() == 0  # each lane holds a lease on its own server
    assert all(after > start for after, start in zip(farm.sessions(), before))
    assert (parallel.culprit.index, parallel.culprit.name, parallel.culprit.verdict) == \
        (sequential.culprit.index, sequential.culprit.name, sequential.culprit.verdict) == (13, "gelu_1", "isolated")
    assert parallel.culprit.metrics.max_abs_err == pytest.approx(sequential.culprit.metrics.max_abs_err)
    assert parallel.search == sequential.search  # the same decision path, probed two at a time
    assert [(row.index, row.isolated.status) for row in parallel.neighbourhood] == \
        [(row.index, row.isolated.status) for row in sequential.neighbourhood]


def test_carve_over_a_tracker_checks_every_op_there(traces, farm, tmp_path):
    out = tmp_path / "suite"
    result = run_cli("carve", str(traces.get("mlp")), "-o", str(out), "--tracker", farm.address, "--key", KEY,
                     "--transform", fault_transform(tmp_path, "scale", "gelu_1"))
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["checked_on"] == f"llvm via tracker {farm.address} key {KEY}"
    checked = {entry["name"]: entry["target_verdict"]["status"] for entry in meta["ops"]}
    assert len(checked) == len(meta["ops"]) > 20
    assert {name for name, status in checked.items() if status != "pass"} == {"gelu_1"}
    assert "`gelu_1`" in (out / "README.md").read_text()


# ------------------------------------------------------------------------ crashes
def test_a_crash_in_one_lane_is_that_ops_verdict_only(traces, tmp_path):
    transform = fault_transform(tmp_path, "out_of_bounds", "gelu_1")  # the kernel segfaults when run
    with Session.open(traces.get("mlp"), transform=transform, parallel=2, cache_dir=tmp_path / "cache") as session:
        ops = range(8, 20)  # one unit per op over two lanes; gelu_1's (op 13) crashes its lane's worker
        verdicts = session.verdicts.isolated_many(ops)
        assert _statuses(verdicts) == {i: "crash" if i == 13 else "pass" for i in ops}
        assert "SIGSEGV" in verdicts[13].message
        assert all(count > 0 for count in session.pool.units)
        session.verdicts.clear()  # the pool goes on: a crashed lane starts a fresh worker
        assert session.isolated(13).status == "crash" and session.isolated(12).passed


def test_cli_bisect_over_a_tracker_names_the_planted_op(traces, farm, tmp_path):
    """`bisect --tracker --key` from the command line, on the farm's two servers (this was a test in
    tests/test_rpc.py that started its own tracker and servers)."""
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    result = run_cli("bisect", str(traces.get("mlp")), "--tracker", farm.address, "--key", KEY,
                     "--transform", transform, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["op"]["name"] == "gelu_1"
