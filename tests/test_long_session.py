"""A scripted REPL session holds its open files and leaves no process or temporary file behind:
after `quit`, and after Ctrl-C in the middle of a command. benchmarks/long_session.py runs the
same loop for 30 minutes and reports the figures.

What counts as left behind: any live process started under the run's mark (an environment
variable every process a session starts inherits): target workers, the compiler and linker a
worker runs, TVM popen workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import load_benchmark

SHORT_LOOPS = 2  # the warm-up loop, then one that must end holding the same open files
EXIT_INTERRUPTED = 130
SUBSTITUTIONS = 300


long_session = load_benchmark("long_session", "tapml_long_session")


@pytest.fixture(scope="module")
def trace(traces) -> str:
    """examples/mlp.py's shared recording: what these tests look at (files, processes, folders) does
    not depend on the model's size, and its 26 ops still span every command of a loop."""
    return str(traces.get("mlp"))


def test_a_scripted_session_holds_its_files_and_leaves_nothing_after_quit(trace):
    seen = []
    report = long_session.run_session(trace, loops=SHORT_LOOPS, on_loop=lambda _r, usage: seen.append(usage))
    assert report.commands == SHORT_LOOPS * len(long_session.loop_commands(0, report.ops, Path(".")))
    assert not report.failed, report.failed
    assert report.worker_restarts == 0
    assert len({(u.session_fds, u.workers, u.workers_fds) for u in seen[1:]}) == 1, seen
    assert report.left_after_quit == []


def test_quit_from_the_command_line_leaves_nothing(trace, tmp_path):
    mark = uuid.uuid4().hex
    commands = f"step 2; dump 2 {tmp_path / 'dump'}; quit"
    env = dict(os.environ, **{long_session.MARK_ENV: mark}, TMPDIR=str(_empty(tmp_path / "tmp")))
    result = subprocess.run([sys.executable, "-m", "tapml_dbg", "replay", trace, "-c", commands], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert long_session.left_behind(mark) == []
    assert list((tmp_path / "tmp").iterdir()) == []  # the worker's log and build folders went with it


def test_ctrl_c_while_a_worker_compiles_leaves_nothing(trace, tmp_path):
    """Failed before: the worker, killed in the middle of TVM's export_library, left its build
    folder (and the library it was linking into the compile cache) behind, and could leave its
    g++/ld running."""
    mark = uuid.uuid4().hex
    scratch, cache = _empty(tmp_path / "tmp"), _empty(tmp_path / "cache")  # an empty cache: it compiles
    env = dict(os.environ, **{long_session.MARK_ENV: mark}, TMPDIR=str(scratch), TAPML_CACHE_DIR=str(cache))
    replay = subprocess.Popen([sys.executable, "-m", "tapml_dbg", "replay", trace, "-c", "step 20"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=long_session.sigint_default)
    try:
        assert _wait_for(lambda: _build_folders(scratch), replay), "the worker never started a build"
        replay.send_signal(signal.SIGINT)
        stdout, stderr = replay.communicate(timeout=120)
    finally:
        if replay.poll() is None:
            replay.kill()
    assert replay.returncode == EXIT_INTERRUPTED, stdout[-2000:] + stderr[-2000:]
    assert "cancelled" in stdout
    assert long_session.left_behind(mark) == []
    assert list(scratch.iterdir()) == []
    assert [p.name for p in cache.iterdir() if ".tmp" in p.name] == []


def test_a_worker_that_grew_is_replaced_between_units(trace):
    """TVM keeps memory for every distinct unit it compiles: past a limit the worker is replaced,
    and the session goes on with the same verdicts."""
    from tapml_dbg.engine.session import Session
    from tapml_dbg.engine.stops import Debugger

    mark = uuid.uuid4().hex
    os.environ[long_session.MARK_ENV] = mark
    try:
        with Session.open(trace) as session:
            debugger = Debugger(session)
            results = debugger.step(1).steps
            session.pool.lanes[0].growth_limit = -1  # replace the worker after its next unit
            results += debugger.step(2).steps
            assert session.pool.recycled >= 1 and session.pool.restarts == 0
            assert all(r.isolated.passed and r.propagated.passed for r in results), results
    finally:
        os.environ.pop(long_session.MARK_ENV, None)
    assert long_session.left_behind(mark, exclude=os.getpid()) == []


def test_building_units_keeps_no_memory():
    """Failed before: `model.units.substitute` made a TVM mutator class per call, which TVM keeps
    (~7 KiB each); a session substitutes for every op of every batch it builds, so its memory grew
    by some 25 MiB per 25 loops of the long session."""
    import gc
    import tracemalloc

    from tvm import relax

    from tapml_dbg.model.units import substitute

    x, y = (relax.Var(name, relax.TensorType((2,), "float32")) for name in "xy")
    expr = relax.op.add(x, x)
    substitute(expr, {x: y})
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(SUBSTITUTIONS):
            assert substitute(expr, {x: y}).args[0].same_as(y)
        gc.collect()
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < SUBSTITUTIONS * 64, f"{grown / SUBSTITUTIONS:.0f} bytes kept per substitution"


def test_ctrl_c_while_building_a_unit_is_a_keyboard_interrupt():
    """Failed before: a SIGINT that arrived while TVM called back into `substitute`'s mutator came
    back as `RuntimeError('')`, so the REPL said "internal error" and `replay -c` went on with the
    next command (seen once in the long session: a `step 10000` still running a minute after Ctrl-C)."""
    from tvm import relax

    from tapml_dbg.model.units import substitute

    class InterruptedOnRead(dict):
        def get(self, key, default=None):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, inside TVM's callback
            return super().get(key, default)

    x, y = (relax.Var(name, relax.TensorType((2,), "float32")) for name in "xy")
    with pytest.raises(KeyboardInterrupt):
        substitute(relax.op.add(x, x), InterruptedOnRead({x: y}))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _empty(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder


def _build_folders(scratch: Path) -> list[Path]:
    """TVM's build folders (tmpXXXX, with the object files being linked) under any worker's TMPDIR."""
    return [p for p in scratch.rglob("*.o")]


def _wait_for(condition, process: subprocess.Popen, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if condition():
            return True
        time.sleep(0.02)
    return False
