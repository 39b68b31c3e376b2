"""Session side of the target worker: send a unit, wait with a time limit, survive its death.

A segfault in codegen or an out-of-bounds kernel kills only the worker; the request comes
back as a `crash` (or `timeout`) result and the next request starts a fresh worker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from tapml_dbg.runtime.messages import UnitRequest, UnitResult, UnitStatus, WorkerConfig

REPLY_POLL_S = 0.2  # how often a waiting request checks that its worker is still alive
REAP_TIMEOUT_S = 5.0  # how long a stopped worker gets to exit before it is killed
LOG_LINE_CHARS = 200  # a quoted worker log line is cut to this
LOG_TAIL_LINES = 3  # log lines quoted after a crash


class TargetExecutor:
    """Owns one worker process for one (trace, target, transform, remote) configuration."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.timeout_s = config.spec.timeout_s
        self._process = None
        self._conn = None
        self.restarts = 0
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

    def run(self, request: UnitRequest, timeout_s: float | None = None) -> UnitResult:
        """Run one request; never raises for failures inside TVM."""
        started = time.perf_counter()
        self._ensure_started()
        limit = timeout_s if timeout_s is not None else self.timeout_s
        try:
            self._conn.send(request)
        except (BrokenPipeError, OSError):
            self._reap()
            return UnitResult(UnitStatus.CRASH, message="the target worker died before the request was sent")
        try:
            return self._wait(limit, started)
        except KeyboardInterrupt:
            self.stop(kill=True)  # its late reply must not answer the next request
            raise

    def _wait(self, limit: float, started: float) -> UnitResult:
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop(kill=True)
                return UnitResult(UnitStatus.TIMEOUT, message=f"no answer within {limit:.0f} s (a hanging compile or kernel; "
                                  "raise the limit with --timeout S)",
                                  seconds=time.perf_counter() - started)
            try:
                ready = self._conn.poll(min(remaining, REPLY_POLL_S))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    reply = self._conn.recv()
                    break
                except (EOFError, OSError):
                    pass
            if not self._process.is_alive():
                code = self._process.exitcode
                self._reap()
                tail = self.log_tail()
                message = _describe_exit(code) + (f"; last log: {tail}" if tail else "")
                return UnitResult(UnitStatus.CRASH, message=message, seconds=time.perf_counter() - started)
        return UnitResult(
            status=UnitStatus(reply["status"]), outputs=reply.get("outputs", []), message=reply.get("message", ""),
            cached=reply.get("cached", False), seconds=time.perf_counter() - started)

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        if self._process is not None:
            self._reap()
            self.restarts += 1
        parent, child = socket.socketpair()
        command = [sys.executable, "-m", "tapml_dbg.runtime.worker", "--fd", str(child.fileno()),
                   "--config", self.config.to_json(), "--log", self.log_path]
        self._process = _Process(subprocess.Popen(command, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL))
        child.close()
        self._conn = Connection(parent.detach())

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.join(timeout=REAP_TIMEOUT_S)
        self._process = None
        self._conn = None

    def stop(self, kill: bool = False) -> None:
        if self._process is None:
            return
        if kill:
            self._process.kill()
        else:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._process.join(timeout=REAP_TIMEOUT_S)
            if self._process.is_alive():
                self._process.kill()
        self._reap()

    def close(self) -> None:
        self.stop()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


class _Process:
    """The few multiprocessing.Process methods we use, over a Popen (no re-import of __main__)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

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
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def _describe_exit(code: int | None) -> str:
    import signal

    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the target worker was killed by {name} (a crash inside TVM)"
    return f"the target worker exited with status {code} (a crash inside TVM)"
