"""Session side of the target worker: send a unit, wait with a time limit, survive its death.

A segfault in codegen or an out-of-bounds kernel kills only the worker; the request comes
back as a `crash` (or `timeout`) result and the next request starts a fresh worker.

A worker leaves nothing behind, however it ends (a crash, a timeout, Ctrl-C in the session):
it runs in a process group of its own, so killing it kills the compiler and linker it may be
running (TVM's `export_library` runs g++), and a terminal's Ctrl-C reaches only the session,
which decides; its temporary files (TVM's build folders) live in a folder of its own, removed
with it, and a library it was writing into the compile cache when killed is removed too.

A worker's memory stays bounded over a long session: TVM keeps some memory for every distinct
unit it compiles (about 0.3 MiB per small unit on llvm, more for long ranges), so a worker that
has grown `WORKER_GROWTH_MIB` past what it held after its first unit is replaced by a fresh one
between two units (`recycled` counts them; a fresh worker is a fork of the session's zygote, or a
TVM import without one).

A fault can poison a worker's context (a CUDA fault is sticky: every later call in that process
fails), so no verdict is taken from a poisoned process. A result that can have poisoned its
worker (`messages.poisons_worker`: a crash, a timeout, a device runtime error such as "CUDA
Runtime Error: misaligned address") retires the worker and is marked `poisoned`; and when its fault
may have been inherited, the request runs again in a fresh worker, whose result is the one
returned (`fresh_rerun`): when the worker had run device units before the request, or when the
failing unit came after others of the same request (a chain runs again with a device sync after
each unit, so that an asynchronous fault is reported by the unit that made it; a batch of
independent units runs again from the failing unit, which so runs first in a fresh process).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

from tapml_dbg import settings
from tapml_dbg.runtime import zygote
from tapml_dbg.runtime.compile_cache import shared_units
from tapml_dbg.runtime.messages import (AnyResult, BatchRequest, BatchResult, ChainRequest, Request, UnitRequest,
                                       UnitStatus, WorkerConfig, WorkerReply, ended, poisons_worker)

REPLY_POLL_S = 0.2  # how often a waiting request checks that its worker is still alive
REAP_TIMEOUT_S = 5.0  # how long a stopped worker gets to exit before it is killed
LOG_LINE_CHARS = 200  # a quoted worker log line is cut to this
LOG_TAIL_LINES = 3  # log lines quoted after a crash
WORKER_TMP_PREFIX = "tapml-worker-tmp-"  # the worker's TMPDIR, removed when the worker ends
WORKER_GROWTH_MIB = settings.value(settings.WORKER_GROWTH_MIB)  # RSS past the first unit's before a fresh worker
MIB = 2**20


class TargetExecutor:
    """Owns one worker process for one (trace, target, transform, remote) configuration."""

    def __init__(self, config: WorkerConfig, zygotes: zygote.ZygoteSlot | None = None):
        """`zygotes`: where workers are forked from (the session's); None: a fresh interpreter each."""
        self.config = config
        self.zygotes = zygotes
        self.timeout_s = config.spec.timeout_s
        self._process = None
        self._conn = None
        self._scratch: str | None = None  # the running worker's TMPDIR
        self._baseline_rss: int | None = None  # the running worker's RSS after its first unit
        self._last_rss: int | None = None  # what the running worker said it held, with its last reply
        self._answered = False  # the running worker has replied: it was forked and runs
        self._stop_asked = False  # the running worker was told to exit
        self._device_requests = 0  # requests the running worker ran on the device (not compile-only)
        self.interrupted = False  # killed on purpose (Ctrl-C, a search stopped): its crash is not re-run
        self.growth_limit = int(WORKER_GROWTH_MIB * MIB)
        self.restarts = 0  # workers that died (crash, timeout, Ctrl-C) and were started again
        self.recycled = 0  # workers replaced because they had grown past `growth_limit`
        self.retired = 0  # workers ended because a result could have poisoned them (sticky faults)
        handle, self.log_path = tempfile.mkstemp(prefix="tapml-worker-", suffix=".log")
        os.close(handle)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The worker's last native log lines: what TVM said just before a crash."""
        try:
            text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [line.strip() for line in text if ("Check failed" in line or "Error" in line)
                  and not line.strip().startswith("File ")]
        return " | ".join(line[:LOG_LINE_CHARS] for line in useful[-lines:])

    def start(self) -> None:
        """Start the worker process now (it loads TVM on its own), not at the first request."""
        self._ensure_started()

    def run(self, request: Request, timeout_s: float | None = None) -> AnyResult:
        """Run one request; never raises for failures inside TVM. A result that can have poisoned
        its worker retires it, and is run again in a fresh worker when its fault may be inherited
        (the module's docstring)."""
        result, used = self._run_once(request, timeout_s)
        while poisons_worker(result.status, result.message):
            result = replace(result, poisoned=True)
            self.retire()
            again = self._again(request, result, used)
            if again is None:
                return result
            request, earlier = again
            spent = result.seconds
            rerun, used = self._run_once(request, timeout_s)
            result = rerun.after(earlier) if earlier is not None else rerun
            result = replace(result, fresh_rerun=True, seconds=result.seconds + spent)
        return result

    def retire(self) -> None:
        """End a worker whose context a fault may have poisoned (one that died already is gone)."""
        self.stop(kill=True)
        self.retired += 1

    def _again(self, request: Request, result: AnyResult, used: int) -> tuple[Request, BatchResult | None] | None:
        """What to run in a fresh worker after a poisoning result, and the part of that result that
        stands (a batch's units before the failing one); None: the result is trustworthy as it is
        (the failing unit was the first its process ran on the device, or nothing ran there)."""
        if self.interrupted or not _on_device(request):
            return None
        if isinstance(request, (ChainRequest, BatchRequest)):
            position = request.names.index(result.failed_op) if result.failed_op in request.names else 0
            if isinstance(request, BatchRequest) and position > 0:  # from the failing unit on, first in a fresh process
                found = [name for name in result.suspects if name in request.names[:position]]
                rest = replace(request, units=request.units[position:], names=request.names[position:],
                               suspects=max(1, request.suspects - len(found)))
                return rest, result
            if isinstance(request, ChainRequest) and position > 0 and not request.sync_each:
                return replace(request, sync_each=True), None
        return (request, None) if used else None

    def _run_once(self, request: Request, timeout_s: float | None) -> tuple[AnyResult, int]:
        """One request on the worker, and how many device requests that worker had run before it."""
        started = time.perf_counter()
        self._ensure_started()
        used = self._device_requests
        limit = timeout_s if timeout_s is not None else self.timeout_s
        try:
            self._conn.send(shared_units(request, self.config.spec.transform))  # each distinct unit pickled once
        except (BrokenPipeError, OSError):
            self._reap()
            return ended(request, UnitStatus.CRASH, "the target worker died before the request was sent"), used
        try:
            result = self._wait(request, limit, started)
        except KeyboardInterrupt:
            self.stop(kill=True)  # its late reply must not answer the next request
            raise
        if self._process is not None and _on_device(request):
            self._device_requests += 1
        self._recycle_if_grown()
        return result, used

    def _recycle_if_grown(self) -> None:
        """Stop a worker that holds `growth_limit` more than after its first unit; the next unit starts one.
        (Its RSS comes with its reply: asking the system from here cost the session a /proc read
        per unit, from every lane's thread.)"""
        rss = self._last_rss
        if self._process is None or rss is None:
            return
        if self._baseline_rss is None:
            self._baseline_rss = rss
        elif rss - self._baseline_rss > self.growth_limit:
            self.stop()
            self.recycled += 1

    def _wait(self, request: Request, limit: float, started: float) -> AnyResult:
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop(kill=True)
                return ended(request, UnitStatus.TIMEOUT, f"no answer within {limit:.0f} s (a hanging compile or kernel; "
                             "raise the limit with --timeout S)", time.perf_counter() - started)
            try:
                ready = self._conn.poll(min(remaining, REPLY_POLL_S))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    reply: WorkerReply = self._conn.recv()
                    self._answered, self._last_rss = True, reply.rss
                    break
                except (EOFError, OSError):
                    pass
            if not self._process.is_alive():
                code = self._process.exitcode
                self._reap()
                tail = self.log_tail()
                message = _describe_exit(code) + (f"; last log: {tail}" if tail else "")
                return ended(request, UnitStatus.CRASH, message, time.perf_counter() - started)
        return replace(reply.result, seconds=time.perf_counter() - started)

    def _ensure_started(self) -> None:
        """A running worker: forked from the zygote where there is one (its pid asked for only when
        a request is about to go: the zygote may still be importing TVM), else a fresh interpreter.
        A worker that has replied and whose end of the pipe has not closed runs: no need to ask
        the system (which cost a few /proc reads per unit, in the session, from every lane)."""
        if self._process is not None and self._answered and not self._pipe_closed():
            return
        if self._process is not None and self._process.is_alive():
            if self._forked_but_lost():
                self._reap()
                self._start_worker(forked=False)
            return
        if self._process is not None:
            self._reap()
            self.restarts += 1
        self._start_worker(forked=True)

    def _start_worker(self, forked: bool) -> None:
        parent, child = socket.socketpair()
        argv = ["--config", self.config.to_json(), "--log", self.log_path]
        self._scratch = tempfile.mkdtemp(prefix=WORKER_TMP_PREFIX)
        env = settings.child_environment(TMPDIR=self._scratch)
        origin = self.zygotes.get() if forked and self.zygotes is not None else None
        try:
            handle = origin.spawn(child.fileno(), argv, env) if origin is not None else None
        except zygote.ZygoteError:
            handle = None
        if handle is None:
            handle = subprocess.Popen([sys.executable, "-m", "tapml_dbg.runtime.worker", "--fd", str(child.fileno()),
                                       *argv], pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env,
                                      start_new_session=True)
        self._process = _Process(handle, self.config.cache_dir)
        child.close()
        self._conn = Connection(parent.detach())

    def _pipe_closed(self) -> bool:
        """Whether the worker's end of the pipe is gone (it exited): an idle worker sends nothing,
        so anything readable between requests is the end of file."""
        try:
            return self._conn.poll(0)
        except (EOFError, OSError):
            return True

    def _forked_but_lost(self) -> bool:
        """A worker the zygote was asked for but never forked (it died importing TVM): not the op's crash."""
        handle = self._process.popen
        if not isinstance(handle, zygote.ForkedWorker):
            return False
        try:
            handle.pid
            return False
        except zygote.ZygoteError:
            return True

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.join(timeout=REAP_TIMEOUT_S)
            self._process.clean_up()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._process = None
        self._conn = None
        self._scratch = None
        self._baseline_rss = None
        self._last_rss = None
        self._answered = False
        self._stop_asked = False
        self._device_requests = 0

    def ask_to_stop(self) -> None:
        """Tell the worker to exit, without waiting: a session closing many workers asks them all
        first, so they exit side by side (each takes a few tenths of a second), then `stop`s each."""
        if self._process is None or self._stop_asked:
            return
        self._stop_asked = True
        try:
            self._conn.send(None)
        except OSError:
            pass

    def interrupt(self) -> None:
        """Kill the worker from a thread other than the one running its requests, which reaps it
        (two threads reaping one worker would close its pipe twice)."""
        self.interrupted = True
        process = self._process
        if process is not None:
            process.kill()

    def stop(self, kill: bool = False) -> None:
        if self._process is None:
            return
        if kill:
            self._process.kill()
        else:
            self.ask_to_stop()
            self._process.join(timeout=REAP_TIMEOUT_S)
            if self._process.is_alive():
                self._process.kill()
        self._reap()

    def close(self, kill: bool = False) -> None:
        """Stop the worker (`stop`) and remove its log."""
        self.stop(kill)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


class _Process:
    """The few multiprocessing.Process methods we use, over a Popen (no re-import of __main__).

    The worker leads a process group of its own (`start_new_session`): `kill` and `clean_up` end
    the whole group, the compiler and linker the worker may have started included.
    """

    def __init__(self, popen, cache_dir: str = ""):  # a Popen, or a zygote's ForkedWorker
        self.popen = popen
        self.cache_dir = cache_dir

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        self._kill_group()
        if self.popen.poll() is None:
            self.popen.kill()
        try:
            self.popen.wait(REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass

    def clean_up(self) -> None:
        """After the worker exited: end what it left running, drop the library it was writing."""
        self._kill_group()
        pid = self._pid()
        if self.cache_dir and pid is not None:  # compile_cache writes `KEY.tmpPID.so`, then renames it into place
            for partial in Path(self.cache_dir).glob(f"*.tmp{pid}.*"):
                partial.unlink(missing_ok=True)

    def _kill_group(self) -> None:
        pid = self._pid()
        try:
            if pid is not None:
                os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone: nothing of the worker's is running

    def _pid(self) -> int | None:
        try:
            return self.popen.pid
        except zygote.ZygoteError:  # the zygote died before it forked the worker: nothing runs
            return None


def _on_device(request: Request) -> bool:
    """Whether a request runs units on the device (a compile lane's and `compile`'s do not)."""
    return isinstance(request, (UnitRequest, ChainRequest, BatchRequest))


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the target worker was killed by {name} (a crash inside TVM)"
    return f"the target worker exited with status {code} (a crash inside TVM)"
