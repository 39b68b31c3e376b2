"""A long scripted REPL session: does it hold flat memory and open files, and leave nothing behind?

    python benchmarks/long_session.py --minutes 30 [--trace T.h5 | --model FILE.py:FUNC] [--json OUT]

Records a GPT-2-class trace unless `--trace` is given (default model: `build_gpt2_12_layers`
below, GPT-2's 12 layers and 717 ops at a narrow width, so a loop is seconds on a laptop; pass
`--model examples/gpt2_124m.py` for the real size), opens a replay session on llvm in this process
and runs, in a loop until the time is up, what a user does: step, compare, print, show, offload,
boundary, tol, bisect, dump, reset (`loop_commands`). It prints the RSS and open file descriptors
of the session process and of its worker processes when the session opens, after the first loop
(every unit compiled once) and at the end, then quits and lists the processes the session left
behind (workers, compilers, TVM popen workers: every process started under this run's mark),
which must be none. Then the same for a `tapml-dbg replay` interrupted by Ctrl-C (SIGINT) in
the middle of a bisection.

tests/test_long_session.py runs the same loop for a few seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MARK_ENV = "TAPML_LONG_SESSION_MARK"  # every process a session starts inherits it
DEFAULT_MINUTES = 30.0
FULL_BISECT_EVERY = 5  # loops; the others bisect without the isolated sweep
LEFTOVER_GRACE_S = 10.0  # a worker of a session that just closed may take a moment to exit
INTERRUPT_AFTER_S = 2.0  # how long the Ctrl-C'd replay has been bisecting when interrupted
EXIT_AFTER_INTERRUPT_S = 60.0  # how long it may take to exit after Ctrl-C
MIB = 2**20
EXIT_INTERRUPTED = 130  # what `tapml-dbg replay -c` exits with after Ctrl-C


def build_gpt2_12_layers():
    """GPT-2's structure (12 layers, 717 ops) at width 128: a GPT-2-class trace that loops quickly."""
    sys.path.insert(0, str(EXAMPLES))
    from tiny_gpt2 import build

    return build(seq=32, n_layer=12, n_embd=128, n_head=4, vocab_size=2000, n_positions=64)


DEFAULT_MODEL = f"{Path(__file__).resolve()}:build_gpt2_12_layers"


# ---- what the session does ---------------------------------------------------------------------

def loop_commands(loop: int, ops: int, dump_dir: Path) -> list[str]:
    """One round of a user's session; ops and ranges move with `loop`, over a bounded set of units."""
    k = (7 * loop) % max(1, ops - 8)
    last = ops - 1
    bisect = "bisect" if loop % FULL_BISECT_EVERY == FULL_BISECT_EVERY - 1 else "bisect --no-sweep"
    return [
        "reset",
        "step 4",
        "compare",
        f"print {k + 2}",
        f"show {k + 3}",
        f"offload remove {k}:{k + 4}",
        "step 2",
        f"offload add {k}:{k + 4}",
        f"boundary {min(last, k + 16)}",
        "tol fixed",  # a dtype's rtol/atol count under the fixed rule only (the noise-floor rule refuses them)
        "tol float32 1e-4 1e-6",
        f"tol op {k + 1} 1e-3",
        "where",
        "tol reset",
        bisect,
        f"dump {k + 1} {dump_dir / f'op{k + 1}'}",
        "reset",
    ]


# ---- what the processes hold -------------------------------------------------------------------

@dataclass
class Usage:
    """RSS (MiB) and open file descriptors of the session process and of its workers."""

    seconds: float
    session_rss_mib: float
    session_fds: int
    workers: int
    workers_rss_mib: float
    workers_fds: int


def usage(started: float, process: psutil.Process | None = None) -> Usage:
    process = process or psutil.Process()
    workers = []
    for child in process.children(recursive=True):
        try:
            workers.append((child.memory_info().rss, child.num_fds()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return Usage(round(time.perf_counter() - started, 1), round(process.memory_info().rss / MIB, 1),
                 process.num_fds(), len(workers), round(sum(r for r, _ in workers) / MIB, 1),
                 sum(f for _, f in workers))


def marked_processes(mark: str, exclude: int | None = None) -> list[str]:
    """`pid command` of every live process that carries `mark` in MARK_ENV (other than `exclude`)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.pid != exclude and process.environ().get(MARK_ENV) == mark:
                found.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def left_behind(mark: str, exclude: int | None = None, grace_s: float = LEFTOVER_GRACE_S) -> list[str]:
    """The marked processes still alive `grace_s` after the session ended (none, when it is clean)."""
    deadline = time.monotonic() + grace_s
    left = marked_processes(mark, exclude)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked_processes(mark, exclude)
    return left


# ---- the in-process session --------------------------------------------------------------------

@dataclass
class SessionReport:
    trace: str
    ops: int
    loops: int = 0
    commands: int = 0
    failed: list[str] = field(default_factory=list)  # the first failing commands, with their error
    opened: Usage | None = None
    warm: Usage | None = None  # after the first loop
    end: Usage | None = None
    peak_session_rss_mib: float = 0.0
    worker_restarts: int = 0  # workers that died and were started again (a crash, a timeout)
    workers_recycled: int = 0  # workers replaced for their memory (executor.WORKER_GROWTH_MIB)
    left_after_quit: list[str] = field(default_factory=list)


class _LastLines(io.TextIOBase):
    """A console stream that keeps only its last lines (the session's output must not grow RSS)."""

    def __init__(self, keep: int = 20):
        self.lines: list[str] = []
        self.keep = keep

    def write(self, text: str) -> int:
        self.lines = (self.lines + text.splitlines())[-self.keep:]
        return len(text)


def run_session(trace: str, *, minutes: float | None = None, loops: int | None = None,
                cache_dir: str | None = None, on_loop=None) -> SessionReport:
    """Loop `loop_commands` over `trace` until `minutes` or `loops` are done, then `quit`."""
    from tapml_dbg.engine.session import Session
    from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR
    from tapml_dbg.ui.console import make_console
    from tapml_dbg.ui.repl.app import Repl

    mark = uuid.uuid4().hex
    previous = os.environ.get(MARK_ENV)
    os.environ[MARK_ENV] = mark  # the workers inherit it: what carries it after quit was left behind
    started = time.perf_counter()
    deadline = started + minutes * 60 if minutes is not None else None
    dump_root = Path(tempfile.mkdtemp(prefix="tapml-long-session-"))
    out, err = _LastLines(), _LastLines()
    try:
        with Session.open(trace, cache_dir=cache_dir or DEFAULT_CACHE_DIR) as session:
            report = SessionReport(trace=str(trace), ops=len(session.ops))
            repl = Repl(session, make_console(out), make_console(err), show_progress=False)
            report.opened = usage(started)
            while (loops is None or report.loops < loops) and (deadline is None or time.perf_counter() < deadline):
                for line in loop_commands(report.loops, len(session.ops), dump_root):
                    outcome = repl.execute(line)
                    report.commands += 1
                    if not outcome.ok and len(report.failed) < 10:
                        report.failed.append(f"{line}: {' | '.join(err.lines[-2:])}")
                for child in dump_root.iterdir():  # the repros: written and read, not kept
                    shutil.rmtree(child, ignore_errors=True)
                report.loops += 1
                now = usage(started)
                report.peak_session_rss_mib = max(report.peak_session_rss_mib, now.session_rss_mib)
                if report.loops == 1:
                    report.warm = now
                if on_loop:
                    on_loop(report, now)
            report.end = usage(started)
            report.worker_restarts = session.pool.restarts
            report.workers_recycled = session.pool.recycled
            assert repl.execute("quit").quit
        report.left_after_quit = left_behind(mark, exclude=os.getpid())
    finally:
        shutil.rmtree(dump_root, ignore_errors=True)
        if previous is None:
            os.environ.pop(MARK_ENV, None)
        else:
            os.environ[MARK_ENV] = previous
    return report


# ---- Ctrl-C in a replay ------------------------------------------------------------------------

def sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A process started with `&` by a
    script ignores SIGINT, its children inherit that, and Python then installs no handler: the
    Ctrl-C under test would be ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class InterruptReport:
    exit_code: int | None
    cancelled_printed: bool
    processes_before: list[str]
    left_after_exit: list[str]
    stuck_in: str = ""  # the replay's Python stacks when it did not exit after Ctrl-C (faulthandler)


def interrupt_replay(trace: str, command: str = "bisect; step 10000", after_s: float = INTERRUPT_AFTER_S,
                     cache_dir: str | None = None, wait_for: str = "tapml_dbg.runtime.worker") -> InterruptReport:
    """SIGINT a `tapml-dbg replay TRACE -c COMMAND` once its worker runs (plus `after_s`); what is left."""
    mark = uuid.uuid4().hex
    env = dict(os.environ, **{MARK_ENV: mark}, PYTHONFAULTHANDLER="1")  # SIGABRT prints its stacks
    if cache_dir:
        env["TAPML_CACHE_DIR"] = cache_dir
    replay = subprocess.Popen([sys.executable, "-m", "tapml_dbg", "replay", str(trace), "-c", command],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=sigint_default)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and replay.poll() is None:
        if any(wait_for in line for line in marked_processes(mark)):
            break
        time.sleep(0.05)
    time.sleep(after_s)
    before = marked_processes(mark)
    replay.send_signal(signal.SIGINT)
    stuck = ""
    try:
        stdout, _stderr = replay.communicate(timeout=EXIT_AFTER_INTERRUPT_S)
    except subprocess.TimeoutExpired:
        replay.send_signal(signal.SIGABRT)
        try:
            stdout, stderr = replay.communicate(timeout=EXIT_AFTER_INTERRUPT_S)
        except subprocess.TimeoutExpired:
            replay.kill()
            stdout, stderr = replay.communicate()
        stuck = stderr[-4000:]
    return InterruptReport(replay.returncode, "cancelled" in stdout, before, left_behind(mark), stuck)


# ---- the command line --------------------------------------------------------------------------

def _record(model: str, folder: Path) -> str:
    from tapml_dbg.record.recorder import record

    path = folder / "long_session.h5"
    result = record(model, path)
    print(f"recorded {model}: {result.ops} ops, {result.file_bytes / MIB:.0f} MiB in {result.seconds:.1f} s")
    return str(path)


def _line(label: str, u: Usage | None) -> str:
    if u is None:
        return f"{label:>8}: -"
    return (f"{label:>8}: t={u.seconds:7.1f} s  session RSS {u.session_rss_mib:7.1f} MiB, {u.session_fds:3d} fds  "
            f"| {u.workers} worker(s) RSS {u.workers_rss_mib:7.1f} MiB, {u.workers_fds:3d} fds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES)
    parser.add_argument("--trace", help="an existing trace (default: record --model first)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="FILE.py:FUNC to record when no --trace")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tapml-long-") as folder:
        trace = args.trace or _record(args.model, Path(folder))
        print(f"session over {trace} for {args.minutes:g} min (pid {os.getpid()})", flush=True)

        def progress(report: SessionReport, now: Usage) -> None:
            if report.loops == 1 or report.loops % 10 == 0:
                print(_line(f"loop {report.loops}", now), flush=True)

        report = run_session(trace, minutes=args.minutes, on_loop=progress)
        print(f"{report.loops} loops, {report.commands} commands over {report.ops} ops; "
              f"{len(report.failed)} failed; {report.worker_restarts} worker restart(s), "
              f"{report.workers_recycled} recycled for memory")
        for failure in report.failed:
            print(f"  failed: {failure}")
        for label, u in (("opened", report.opened), ("warm", report.warm), ("end", report.end)):
            print(_line(label, u))
        print(f"    peak: session RSS {report.peak_session_rss_mib:.1f} MiB")
        print(f"processes left after quit: {len(report.left_after_quit)}")
        for line in report.left_after_quit:
            print(f"  {line}")
        interrupted = interrupt_replay(trace)
        print(f"Ctrl-C during a command: exit {interrupted.exit_code}, cancelled printed: "
              f"{interrupted.cancelled_printed}; processes left after exit: {len(interrupted.left_after_exit)}")
        for line in interrupted.left_after_exit:
            print(f"  {line}")
        if interrupted.stuck_in:
            print(f"  it did not exit; its stacks:\n{interrupted.stuck_in}")
        if args.json:
            Path(args.json).write_text(json.dumps({"session": asdict(report), "interrupt": asdict(interrupted)},
                                                  indent=2))
    clean = not report.left_after_quit and not interrupted.left_after_exit and interrupted.exit_code == EXIT_INTERRUPTED
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
