"""A report's propagated chain is made on the side worker while the lanes run its isolated verdicts
(engine/propagation.py `series_beside`, runtime/scheduler.py `BesideSeries`): the same points as
one after the other, a bounded part of its values waiting, and nothing left running when the
report stops midway."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import fault_transform
from tapml_dbg.engine.report import error_points
from tapml_dbg.engine.session import Session
from tapml_dbg.runtime.background import Stream
from tapml_dbg.runtime.lanes import Lanes


def _summary(points) -> list:
    return [(p.index, p.isolated and (p.isolated.status, p.isolated.worst, p.isolated.wrong),
             p.propagated and (p.propagated.status, p.propagated.worst, p.propagated.wrong)) for p in points]


def test_a_reports_chain_made_beside_gives_the_points_made_one_after_the_other(traces, tmp_path, monkeypatch):
    transform = fault_transform(tmp_path, "scale", "gelu_1", scale=1.5)
    beside_runs = []
    run_beside = Lanes.run_beside

    def counted_beside(self, request, timeout_s=None):
        beside_runs.append(threading.current_thread().name)
        return run_beside(self, request, timeout_s)

    monkeypatch.setattr(Lanes, "run_beside", counted_beside)
    with Session.open(traces.get("mlp"), transform=transform) as session:
        if not session.lanes.has_side:
            pytest.skip("one core: no side worker")
        beside = error_points(session)
        assert beside_runs and set(beside_runs) == {"tapml-series"}
    monkeypatch.setenv("TAPML_SIDE_LANE", "0")
    with Session.open(traces.get("mlp"), transform=transform) as session:
        serial = error_points(session)
    assert len(beside_runs) == 1  # the second session made its chain itself
    assert _summary(beside) == _summary(serial)
    failed = [p for p in beside if p.isolated is not None and p.isolated.failed]
    assert [p.name for p in failed] == ["gelu_1"]
    assert beside[failed[0].index + 1].propagated.failed  # the error flows on along the chain


def test_a_report_stopped_midway_leaves_no_chain_running(traces, tmp_path, monkeypatch):
    run_beside = Lanes.run_beside

    def slow_beside(self, request, timeout_s=None):
        time.sleep(0.5)
        return run_beside(self, request, timeout_s)

    with Session.open(traces.get("mlp")) as session:
        if not session.lanes.has_side:
            pytest.skip("one core: no side worker")

        def interrupted(*_args, **_kwargs):
            time.sleep(0.1)  # the chain is under way
            raise KeyboardInterrupt

        monkeypatch.setattr(Lanes, "run_beside", slow_beside)
        monkeypatch.setattr(session.verdicts, "isolated_many", interrupted)
        with pytest.raises(KeyboardInterrupt):
            error_points(session)
        assert not [t for t in threading.enumerate() if t.name == "tapml-series"]
        monkeypatch.undo()
        assert all(p.propagated is not None and p.propagated.passed for p in error_points(session) if p.propagated)


def test_a_stream_hands_its_items_over_in_order_and_waits_while_too_many_are_waiting():
    made = []

    def produce():
        for i in range(10):
            made.append(i)
            yield i

    stream = Stream(produce, "test-stream", budget=3, weight=lambda _item: 1)
    deadline = time.monotonic() + 5
    while len(made) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(made) == 4  # three waiting, the fourth made and held back until one is taken
    assert list(stream) == list(range(10))
    stream.join()


def test_a_streams_error_comes_after_the_items_made_before_it_and_cancel_stops_it():
    def failing():
        yield 1
        raise ValueError("broken")

    stream = Stream(failing, "test-stream", budget=10, weight=lambda _item: 1)
    taken = []
    with pytest.raises(ValueError, match="broken"):
        for item in stream:
            taken.append(item)
    assert taken == [1]

    def endless():
        i = 0
        while True:
            i += 1
            yield i

    stream = Stream(endless, "test-stream", budget=2, weight=lambda _item: 1)
    stream.cancel()
    stream.join()
    assert stream.done and len(list(stream)) <= 2
