"""One process that imports TVM once and forks the target workers from it.

A worker started with a fresh interpreter pays a TVM import (docs/perf.md: a second of CPU); a session that
bisects starts two to seventeen of them at once (run lanes, the chain's side worker, one compile
lane per core), and on two cores their imports compete with the session's own start-up. The
zygote imports what a worker imports, once, and forks each worker on request: a worker starts in
milliseconds and is otherwise what `python -m tapml_dbg.runtime.worker` makes (its own process and
process group, its own TMPDIR, its log, the same modules imported, the session's environment and
folder), so a crash inside TVM still takes only that worker down.

The zygote never opens a device (a forked CUDA context is unusable) and runs no thread of its own.
Each session has its own (`ZygoteSlot`), closed with its workers, and started again with the
environment of the moment when that changed (TVM reads some variables at import). Set
`TAPML_ZYGOTE=0` to start each worker with a fresh interpreter instead, which is also what
happens when the zygote cannot start (or, as on macOS, has no SOCK_SEQPACKET sockets).

Protocol: JSON messages over a SOCK_SEQPACKET socket pair (one message per packet), the worker's
end of its socket pair passed along with a spawn request (SCM_RIGHTS). The zygote reaps its
children and answers for their exit status, as `Popen.poll` would.
"""

from __future__ import annotations

from tapml_dbg.runtime.tvm_import import import_tvm_without_torch

if __name__ == "__main__":  # the zygote: TVM without torch first, as a worker does
    import_tvm_without_torch()

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable

import psutil

from tapml_dbg import settings
from tapml_dbg.runtime import worker

START_TIMEOUT_S = 60.0  # the zygote's TVM import, on a loaded machine
PACKET_BYTES = 1 << 20  # a spawn request carries the worker's config and what differs in its environment
SEND_BUFFER_BYTES = 1 << 20
EXIT_POLL_S = 0.005  # how often `wait` asks whether a worker has exited
KEPT_EXITS = 4096  # exit statuses of reaped workers the zygote remembers
CLOSE_WAIT_S = 0.5  # a closed zygote exits at once once it serves; one still importing is killed


_started_with: Callable[[], str | None] | None = None  # `start_zygotes_with`'s choice (None: this interpreter)


def start_zygotes_with(executable: str | Callable[[], str | None] | None) -> None:
    """Start this process's zygotes with `executable` (a path, or a callable giving one or None when
    asked): a fork server's shim, which forks the zygote from a process that imported TVM already
    (runtime/fork_server.py's `use_zygote_server`); None: this interpreter."""
    global _started_with
    _started_with = executable if executable is None or callable(executable) else (lambda: executable)


def zygote_python() -> str:
    """What starts a zygote now (`start_zygotes_with`), this interpreter unless chosen."""
    chosen = _started_with() if _started_with is not None else None
    return chosen or sys.executable


class ZygoteError(RuntimeError):
    """The zygote is gone or did not start: start the worker the usual way."""


class Zygote:
    """The session side: start the zygote, ask it to fork a worker, ask whether one has exited.

    Nothing here waits for the zygote's own TVM import: a spawn request is queued on the socket
    and the worker's pid read when first wanted, so a session opening starts its workers and goes
    on with its own start-up, as with fresh interpreters."""

    def __init__(self):
        self.env = dict(os.environ)
        self._send_lock = threading.Lock()  # the session's threads share the zygote
        self._reply_lock = threading.Lock()
        self._replies: dict[int, dict] = {}
        self._next_id = 1
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [zygote_python(), "-m", "tapml_dbg.runtime.zygote", "--fd", str(child.fileno())]
        self._popen = subprocess.Popen(command, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
                                       env=settings.child_environment(self.env), start_new_session=True)
        child.close()
        self._socket = parent
        self._socket.settimeout(START_TIMEOUT_S)
        try:  # a session queues its workers' spawns while the zygote imports: room for all of them
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        except OSError:
            pass

    def alive(self) -> bool:
        return self._popen.poll() is None

    def spawn(self, worker_fd: int, argv: list[str], env: dict[str, str]) -> "ForkedWorker":
        """Fork a worker that serves `worker_fd` as `python -m tapml_dbg.runtime.worker ARGV` would."""
        changed = {name: value for name, value in env.items() if self.env.get(name) != value}  # TMPDIR
        removed = [name for name in self.env if name not in env]
        ask = self._send({"op": "spawn", "argv": argv, "env": changed, "unset": removed, "cwd": os.getcwd()},
                         fds=[worker_fd])
        return ForkedWorker(self, ask)

    def pid(self, ask: int) -> int:
        return int(self._reply(ask)["pid"])

    def exit_status(self, pid: int) -> int | None:
        """A forked worker's return code as `Popen.poll` gives it (None: still running)."""
        code = self._reply(self._send({"op": "status", "pid": pid})).get("code")
        return None if code is None else int(code)

    def _send(self, message: dict, fds: list[int] = ()) -> int:
        with self._send_lock:
            ask, self._next_id = self._next_id, self._next_id + 1
            try:
                socket.send_fds(self._socket, [json.dumps(message | {"id": ask}).encode()], list(fds))
            except OSError as exc:
                raise ZygoteError(f"the worker zygote is gone ({exc})") from None
        return ask

    def _reply(self, ask: int) -> dict:
        with self._reply_lock:
            while ask not in self._replies:
                try:
                    data = self._socket.recv(PACKET_BYTES)
                except OSError as exc:
                    raise ZygoteError(f"the worker zygote is gone ({exc})") from None
                if not data:
                    raise ZygoteError("the worker zygote is gone")
                reply = json.loads(data)
                self._replies[int(reply.get("id", 0))] = reply
            return self._replies.pop(ask)

    def close(self) -> None:
        try:
            self._socket.close()  # the zygote exits at end of file; its workers live on until told
        except OSError:
            pass
        try:  # one still importing TVM notices only after: nothing of it is needed any more
            self._popen.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()


class ForkedWorker:
    """What the executor uses of a `Popen`, for a worker the zygote forked (its child, not ours)."""

    def __init__(self, zygote: Zygote, ask: int):
        self.zygote = zygote
        self._ask = ask
        self._pid: int | None = None
        self._started: float | None = None  # the process's start time: a pid the system reused is not it
        self._pid_lock = threading.Lock()
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        """Asked of the zygote once: its reply is read once, so a second thread asking at the same time
        (a search's thread stopping the worker while the worker's own thread does) would wait for it
        until the socket's timeout."""
        with self._pid_lock:
            if self._pid is None:
                self._pid = self.zygote.pid(self._ask)
                self._started = _start_time(self._pid)
        return self._pid

    def poll(self) -> int | None:
        """None while the worker runs (asked of the system), else its return code, which only the
        zygote that reaped it knows."""
        if self.returncode is None:
            try:
                if _running(self.pid, self._started):
                    return None
                self.returncode = self.zygote.exit_status(self.pid)
            except ZygoteError:  # the zygote died: it cannot say; the process itself can
                self.returncode = None if self._pid is not None and _running(self._pid, self._started) else -9
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(EXIT_POLL_S)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except (ProcessLookupError, PermissionError, ZygoteError):
            pass


def _running(pid: int, started: float | None) -> bool:
    """The process is there, is the one started then, and is not a zombie (one the zygote has not
    reaped yet has exited)."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class ZygoteSlot:
    """A session's zygote, started on first use and again when it died or the environment changed;
    `get` gives None when `TAPML_ZYGOTE=0` or it cannot start (workers then start the usual way).
    Closed with the session's workers: nothing of a session outlives it."""

    def __init__(self):
        self._zygote: Zygote | None = None
        self._lock = threading.Lock()

    def get(self) -> Zygote | None:
        if not settings.value(settings.ZYGOTE):
            return None
        with self._lock:
            if self._zygote is not None and (not self._zygote.alive() or self._zygote.env != dict(os.environ)):
                self._zygote.close()
                self._zygote = None
            if self._zygote is None:
                try:
                    self._zygote = Zygote()
                except OSError:
                    return None
            return self._zygote

    def close(self) -> None:
        with self._lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


# ---------------------------------------------------------------------------------- the zygote
def _serve(sock: socket.socket) -> None:
    exits: dict[int, int] = {}
    children: set[int] = set()
    while True:
        try:
            data, fds, _flags, _address = socket.recv_fds(sock, PACKET_BYTES, 1)
        except OSError:
            return
        if not data:
            return  # the session closed its end
        message = json.loads(data)
        _reap(children, exits)
        if message["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _become_worker(sock, fds[0], message)  # never returns
            for fd in fds:
                os.close(fd)
            children.add(pid)
            reply = {"pid": pid}
        else:
            pid = int(message["pid"])
            reply = {"code": exits.get(pid) if pid not in children else None}
        sock.send(json.dumps(reply | {"id": message["id"]}).encode())


def _reap(children: set[int], exits: dict[int, int]) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            children.discard(pid)
            exits[pid] = os.waitstatus_to_exitcode(status)
    while len(exits) > KEPT_EXITS:
        exits.pop(next(iter(exits)))


def _become_worker(sock: socket.socket, worker_fd: int, message: dict) -> None:
    """In the forked child: the worker's own session, environment and folder, then its loop."""
    code = 1
    try:
        sock.close()
        os.setsid()
        for name in message["unset"]:  # the zygote's environment is the session's, but for these
            os.environ.pop(name, None)
        os.environ.update(message["env"])
        tempfile.tempdir = None  # TMPDIR is the worker's own folder now
        os.chdir(message["cwd"])
        worker.serve(["--fd", str(worker_fd), *message["argv"]])
        code = 0
    except BaseException:  # noqa: BLE001 - the session sees a crashed worker and its log
        traceback.print_exc()
    finally:
        os._exit(code)


def _main() -> None:
    """Entry point: `python -m tapml_dbg.runtime.zygote --fd N` (what a worker imports is imported)."""
    fd = int(sys.argv[sys.argv.index("--fd") + 1])
    sock = socket.socket(fileno=fd)
    _serve(sock)
    os._exit(0)  # the session is gone: no interpreter teardown (TVM's takes tenths of a second)


if __name__ == "__main__":
    _main()
