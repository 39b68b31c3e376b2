"""Read-ahead: a chain's worker reads the values it will need while it waits for a build, and only then."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np

from tapml_dbg.trace.read_ahead import ReadAhead

SETTLE_S = 0.3  # long enough for the helper to read a few small arrays
CHAIN_OPS = 10


def _reads(count: int, size: int = 8, log: list | None = None, failing: set = frozenset()):
    def read(i):
        if log is not None:
            log.append((i, threading.current_thread().name))
        if i in failing:
            raise OSError("damaged")
        return np.full(size, i, dtype=np.uint8)
    return [(i, (lambda i=i: read(i))) for i in range(count)]


def test_values_are_read_only_while_the_worker_waits_and_handed_over_once():
    log: list = []
    ahead = ReadAhead(lambda: _reads(5, log=log), max_bytes=1 << 20)
    time.sleep(SETTLE_S)
    assert log == [], "nothing is read before the worker waits"
    with ahead.meanwhile():
        time.sleep(SETTLE_S)
    assert [i for i, _ in log] == [0, 1, 2, 3, 4] and {name for _, name in log} == {"tapml-read-ahead"}
    assert ahead.read_ahead == 5
    assert int(ahead.take(3)[0]) == 3
    assert ahead.take(3) is None, "a value is handed over once: the worker keeps it from there"
    ahead.close()
    assert ahead.take(0) is None, "closed: what was read is let go"


def test_the_values_read_ahead_stay_under_the_budget_and_taking_them_makes_room():
    ahead = ReadAhead(lambda: _reads(6, size=100), max_bytes=250)
    with ahead.meanwhile():
        time.sleep(SETTLE_S)
        assert ahead.read_ahead == 3, "it stops once the values not taken reach the budget"
        ahead.take(0), ahead.take(1)
        time.sleep(SETTLE_S)
        assert ahead.read_ahead == 5
    ahead.close()


def test_a_value_asked_for_first_is_not_read_ahead_and_a_failed_read_is_left_to_the_worker():
    log: list = []
    ahead = ReadAhead(lambda: _reads(4, log=log, failing={2}), max_bytes=1 << 20)
    assert ahead.take(1) is None  # the worker reads it itself
    with ahead.meanwhile():
        time.sleep(SETTLE_S)
    assert [i for i, _ in log] == [0, 2, 3], "op 1 was not read again"
    assert ahead.take(2) is None, "the read that failed is the worker's to repeat (and to report)"
    assert int(ahead.take(3)[0]) == 3
    ahead.close()


def test_a_chain_reads_ahead_while_it_builds_and_computes_what_it_computes_without(traces, tmp_path):
    """A chain over a cold cache builds its units itself: its worker reads the recorded values it
    screens against during those builds. Again from the filled cache there is no build to wait
    for, so nothing is read ahead, and the chain computes the same values."""
    from tapml_dbg.engine.session import Session
    from tapml_dbg.judge.verdict import PROPAGATED
    from tapml_dbg.runtime.messages import ChainScreen, TargetSpec, UnitStatus, WorkerConfig
    from tapml_dbg.runtime.worker import _WorkerState

    trace = traces.get("mlp")
    with Session.open(trace) as session:
        indices = [op.index for op in session.ops if op.outputs][:CHAIN_OPS]
        request = replace(session.requests.chain(indices, keep=[]),
                          screen=ChainScreen(session.verdicts.screen_rule(PROPAGATED), suspects=len(indices)))
    config = WorkerConfig(str(trace), TargetSpec(target="llvm"), str(tmp_path / "cache"))

    cold, warm = _WorkerState(config).handle(request), _WorkerState(config).handle(request)
    assert cold.status == warm.status == UnitStatus.OK, (cold.message, warm.message)
    assert cold.read_ahead >= len(indices) // 2, "most recorded values were read during the builds"
    assert warm.read_ahead == 0
    assert cold.suspects == warm.suspects and len(cold.outputs) == len(warm.outputs)
    for a, b in zip(cold.outputs, warm.outputs):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
