"""A session's workers are forked from its zygote, one TVM import for all of them
(runtime/zygote.py): they give the verdicts a fresh interpreter's worker gives, each in a process
group of its own, and a zygote that is gone or out of date never costs a verdict."""

from __future__ import annotations

import os
import time

import psutil

import pytest

from tapml_dbg.engine.stops import Debugger
from tapml_dbg.engine.session import Session

pytestmark = pytest.mark.real_zygote  # the zygote as a session starts it, not tests/fork_cli.py's


def _worker(session) -> psutil.Process:
    return psutil.Process(session.pool.lanes[0]._process.popen.pid)


def _summary(results) -> list:
    return [(r.index, r.isolated.status, r.isolated.worst, r.propagated.status, r.propagated.worst) for r in results]


def test_workers_are_forked_from_the_sessions_zygote_and_judge_as_fresh_ones(traces, monkeypatch):
    """A session's life (a zygote's start is a TVM import: one session for most of it):
    - its workers are children of its zygote, each in a process group of its own, and give the
      verdicts a fresh interpreter's worker gives;
    - a worker killed between two units is replaced and costs no verdict: an idle worker is trusted
      to run while its pipe stays open (no /proc reads per unit); one killed between units closes
      it, and the next unit runs on a fresh worker, not as a crash;
    - an environment changed since the zygote started gets a new zygote, with that environment;
    - the zygote goes with the session;
    - a zygote that dies before it forks (still importing TVM) leaves a fresh worker in its place
      (a child of the session's process, as with TAPML_ZYGOTE=0: tests/test_settings.py), which
      costs no verdict and gives the forked workers' verdicts."""
    trace = traces.get("mlp")
    with Session.open(trace) as session:
        debugger = Debugger(session)
        forked = debugger.step(4).steps
        worker, zygote = _worker(session), session.lanes.zygotes.get()
        assert worker.ppid() == zygote._popen.pid
        assert os.getpgid(worker.pid) == worker.pid  # its own group: a kill takes the compiler it runs too
        first_zygote = zygote._popen.pid

        worker.kill()  # the zygote's child: a zombie until the zygote reaps it
        deadline = time.monotonic() + 5
        while worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        results = debugger.step(2).steps
        assert all(r.isolated.passed and r.propagated.passed for r in results), results
        assert _worker(session).pid != worker.pid
        assert session.pool.restarts == 1  # the dead worker was noticed before the unit was sent

        monkeypatch.setenv("TAPML_TEST_ZYGOTE_ENV", "changed")
        session.pool.lanes[0].stop()  # the next unit starts a worker: from a zygote with this environment
        debugger.step(1)
        second = session.lanes.zygotes.get()
        assert second._popen.pid != first_zygote
        assert psutil.Process(second._popen.pid).environ().get("TAPML_TEST_ZYGOTE_ENV") == "changed"
        assert _worker(session).ppid() == second._popen.pid
        zygote_pid = second._popen.pid
    assert not psutil.pid_exists(zygote_pid) or psutil.Process(zygote_pid).status() == psutil.STATUS_ZOMBIE

    with Session.open(trace) as session:  # a zygote that dies before it forks: a fresh worker in its place
        debugger = Debugger(session)
        slot = session.lanes.zygotes
        started = slot.get

        def dying():
            zygote = started()
            zygote._popen.kill()  # still importing TVM: it never answers the spawn
            zygote._popen.wait()
            return zygote

        monkeypatch.setattr(slot, "get", dying)
        fresh = debugger.step(4).steps
        assert _worker(session).ppid() == os.getpid()  # a fresh interpreter, as with TAPML_ZYGOTE=0
        assert session.pool.restarts == 0  # not a crash of the op's
    assert _summary(forked) == _summary(fresh)
    assert all(r.isolated.passed and r.propagated.passed for r in forked)


def test_two_threads_asking_a_forked_workers_pid_at_once_both_get_it():
    """The zygote answers a spawn with the worker's pid once. A search's thread stopping a worker
    while the worker's own thread stops it too both ask for it: the second must not wait for a
    reply that was read already (on the real socket: a hang until its 60 s timeout)."""
    import threading

    from tapml_dbg.runtime.zygote import ForkedWorker

    class OneReply:
        def __init__(self):
            self.replies = {7: os.getpid()}

        def pid(self, ask):
            time.sleep(0.2)  # the reply on its way
            return self.replies.pop(ask)  # read once

    worker = ForkedWorker(OneReply(), 7)
    pids = []
    threads = [threading.Thread(target=lambda: pids.append(worker.pid)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pids == [os.getpid()] * 2
