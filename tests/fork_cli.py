"""`tapml-dbg` runs for the suite, forked from a process that has imported torch and TVM once.

Each `tapml-dbg` process the suite starts (conftest's `run_cli`, the traces it records, the commands
of the docs' transcripts) would import numpy, h5py, TVM and torch again: seconds of CPU each, on two
cores, well over a hundred times a run. A fork server imports those once per test process, and runs
each command in a process forked from it, that is otherwise what `python -m tapml_dbg ARGS` (or the
`tapml-dbg` script) makes:

- its own process, with the caller's stdin, stdout and stderr (the very file descriptors, passed over
  a Unix socket), working folder, environment, `sys.argv` and `sys.path`, and its standard streams
  made as the interpreter makes them at start-up;
- nothing of tapml_dbg imported (every `TAPML_*` knob read at import is read from the command's own
  environment), so only third-party modules are loaded, and those read no `TAPML_*` knob;
- its exit status (or the signal that killed it) is the caller's: the client, a small interpreter
  started with `-I -S` in place of `python -m tapml_dbg`, exits the same way; a client killed (a
  timeout) takes the command and every process under it down.

It falls back to a real `python -m tapml_dbg` (the client execs it) whenever a fork could differ: an
environment that differs from the server's in anything but what is read when a command runs
(`RUNTIME_ONLY`: `TAPML_*`, the terminal's size, the shell's own variables...; TVM and torch read
other variables when imported), a terminal on a standard stream, or no server. `TAPML_TEST_FORK=0`
turns it off for a run.

Only the standard library is imported at the top: the client runs this file with `-I -S`.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import threading

OFF = "TAPML_TEST_FORK"  # 0: every command is a fresh interpreter
RUNTIME_ONLY_PREFIXES = ("TAPML_", "PYTEST_")
RUNTIME_ONLY = {"COLUMNS", "LINES", "FORCE_COLOR", "PWD", "OLDPWD", "SHLVL", "_", "PATH", "PYTHONPATH"}
STDIO = ("stdin", "stdout", "stderr")


# ------------------------------------------------------------------ the client (a `tapml-dbg` in its place)
def client(sock_path: str, mode: str, script: str, args: list[str]) -> None:
    """Run `tapml-dbg ARGS` on the server and leave as the command did; or exec the real one."""
    if all(not os.isatty(fd) for fd in (0, 1, 2)) and os.environ.get(OFF) != "0":
        status = _ask(sock_path, {"mode": mode, "script": script, "argv": args, "cwd": os.getcwd(),
                                  "env": dict(os.environ)})
        if status is not None:
            if status.get("signal"):
                signal.signal(status["signal"], signal.SIG_DFL)
                os.kill(os.getpid(), status["signal"])
            os._exit(status.get("returncode", 1))
    if mode == "module":
        os.execv(sys.executable, [sys.executable, "-m", "tapml_dbg", *args])
    os.execv(script, [script, *args])


def _ask(sock_path: str, request: dict) -> dict | None:
    """The command's exit status; None: the server says to run it the usual way (or is not there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(sock_path)
        except OSError:
            return None
        data = json.dumps(request).encode()
        conn.sendmsg([len(data).to_bytes(8, "big"), data],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        answer = _read_all(conn)
    if not answer:  # the command may have run: never run it twice
        sys.stderr.write("fork_cli: the fork server's handler ended without the command's exit status\n")
        return {"returncode": 1}
    reply = json.loads(answer)
    return None if reply.get("fallback") else reply


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# ------------------------------------------------------------------ the server
def compatible(env: dict, server_env: dict) -> bool:
    """Whether a fork of the server runs a command in `env` as a fresh interpreter would."""
    def relevant(environment: dict) -> dict:
        return {k: v for k, v in environment.items()
                if k not in RUNTIME_ONLY and not k.startswith(RUNTIME_ONLY_PREFIXES)}
    return relevant(env) == relevant(server_env)


def serve(sock_path: str, parent: int) -> None:
    server_env = dict(os.environ)
    # what `tapml-dbg` imports before anything else does, in its order: the process defaults first (numpy
    # reads OPENBLAS_NUM_THREADS), then TVM with torch hidden, then torch (tapml_dbg/runtime/tvm_import.py)
    from tapml_dbg import settings
    from tapml_dbg.runtime.tvm_import import import_tvm_without_torch

    settings.apply_process_defaults()
    import h5py  # noqa: F401
    import ml_dtypes  # noqa: F401
    import numpy  # noqa: F401
    import prompt_toolkit  # noqa: F401
    import psutil  # noqa: F401
    import rich  # noqa: F401

    import_tvm_without_torch()
    import torch  # noqa: F401

    for name in [name for name in sys.modules if name == "tapml_dbg" or name.startswith("tapml_dbg.")]:
        del sys.modules[name]  # each command imports tapml-dbg afresh, reading its knobs from its environment
    os.environ.clear()
    os.environ.update(server_env)

    import gc

    gc.freeze()  # what is imported stays: a command's collections do not walk (and copy) it
    python_path = [p for p in server_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in python_path]  # sys.path[0] is this file's folder
    stdio = {name: getattr(sys, name) for name in STDIO}

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(1.0)
    open(sock_path + ".ready", "w").close()
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:  # the handler: forks the command, reports how it ended
            listener.close()
            conn.settimeout(None)
            _handle(conn, server_env, base_path, stdio)  # returns in the command's process only
            return
        conn.close()
    listener.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _handle(conn: socket.socket, server_env: dict, base_path: list[str], stdio: dict) -> None:
    size_bytes, fds = _receive(conn, 8)
    size = int.from_bytes(size_bytes, "big")
    data = b""
    while len(data) < size:
        data += conn.recv(size - len(data))
    request = json.loads(data)
    if len(fds) != 3 or not compatible(request["env"], server_env):
        conn.sendall(json.dumps({"fallback": True}).encode())
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become(request, fds, base_path, stdio)
        return  # the command runs from the top of this file, as `python -m tapml_dbg` runs it
    for fd in fds:
        os.close(fd)
    conn.sendall(_wait(pid, conn))
    os._exit(0)


def _receive(conn: socket.socket, size: int) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(size, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    while len(data) < size:
        data += conn.recv(size - len(data))
    return data, list(fds)


def _wait(pid: int, conn: socket.socket) -> bytes:
    import select

    exited = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([exited, conn], [], [])
        if exited in ready:
            break
        if conn in ready and not conn.recv(1):  # the client is gone: so goes what it ran
            _kill_tree(pid)
            break
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return json.dumps({"signal": os.WTERMSIG(status), "returncode": -os.WTERMSIG(status)}).encode()
    return json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode()


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
        processes = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _become(request: dict, fds: list[int], base_path: list[str], stdio: dict) -> None:
    """This process, a fork of the server, made into the command's (then run by `main`)."""
    import io
    import tempfile

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.getcwd() if request["mode"] == "module" else os.path.dirname(request["script"])
    sys.path[:] = [first, *python_path, *base_path]
    for fd, name in enumerate(STDIO):  # as the interpreter makes them at start-up, on these descriptors
        old = stdio[name]
        buffering = 0 if isinstance(old.buffer, io.FileIO) else -1  # -u, PYTHONUNBUFFERED
        stream = io.TextIOWrapper(io.open(fd, "wb" if fd else "rb", buffering, closefd=False), encoding=old.encoding,
                                  errors=old.errors, newline="\n", line_buffering=old.line_buffering,
                                  write_through=old.write_through)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.argv = [request["script"] if request["mode"] == "script" else "-m", *request["argv"]]
    _COMMAND.update(request)


class Server:
    """This test process's fork server: started on first use, stopped with the session."""

    def __init__(self):
        self.process = None
        self.folder = None
        self.failed = False
        self.environment: dict | None = None  # the server's (default: this process's when it starts)
        self._lock = threading.Lock()

    @property
    def socket(self) -> str | None:
        """The server's socket once it serves; None: run commands the usual way."""
        if os.environ.get(OFF) == "0":
            return None
        with self._lock:  # tests call run_cli from threads too
            if self.process is None and not self.failed:
                self._start()
        return None if self.failed else os.path.join(self.folder, "socket")

    def _start(self) -> None:
        import subprocess
        import tempfile
        import time

        self.folder = tempfile.mkdtemp(prefix="tapml-fork-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short: a socket path
        sock = os.path.join(self.folder, "socket")
        with open(os.path.join(self.folder, "log"), "w") as log:
            self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", sock, str(os.getpid())],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                            env=self.environment)
        deadline = time.monotonic() + 300
        while not os.path.exists(sock + ".ready"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.failed = True
                return
            time.sleep(0.05)

    def command(self, *args: str) -> list[str]:
        """What runs `python -m tapml_dbg ARGS` (through the server when it serves)."""
        sock = self.socket
        if sock is None:
            return [sys.executable, "-m", "tapml_dbg", *args]
        return [sys.executable, "-IS", os.path.abspath(__file__), sock, "module", "", *args]

    def shims(self) -> str | None:
        """A folder holding a `tapml-dbg` that runs through the server (None: no server), for a PATH."""
        sock = self.socket
        if sock is None:
            return None
        folder = os.path.join(self.folder, "bin")
        if not os.path.isdir(folder):
            os.mkdir(folder)
            script = os.path.join(os.path.dirname(sys.executable), "tapml-dbg")
            shim = os.path.join(folder, "tapml-dbg")
            with open(shim, "w") as out:
                out.write(f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                          f"import fork_cli\nfork_cli.client({sock!r}, 'script', {script!r}, sys.argv[1:])\n")
            os.chmod(shim, 0o755)
        return folder

    def stop(self) -> None:
        import shutil

        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.process, self.folder = None, None


SERVER = Server()
_COMMAND: dict = {}  # set in a command's process: what `main` runs


def main() -> None:
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
        if not _COMMAND:
            return
        import runpy
        import types

        sys.modules["__main__"] = types.ModuleType("__main__")
        if _COMMAND["mode"] == "module":
            runpy._run_module_as_main("tapml_dbg", alter_argv=True)  # what `python -m tapml_dbg` calls
        else:
            runpy.run_path(_COMMAND["script"], run_name="__main__")
    else:
        client(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])


if __name__ == "__main__":
    main()
