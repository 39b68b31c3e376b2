"""The suite's `tapml-dbg` processes and session zygotes, forked from processes that imported TVM once.

Each `tapml-dbg` process the suite starts (conftest's `run_cli`, the traces it records, the commands
of the docs' transcripts) imports numpy, h5py, TVM and torch, and each session (the suite's own, and
every command's) starts its worker zygote, a fresh interpreter importing TVM: a second or more of
CPU each, hundreds of times a run, on two cores. A fork server per test process imports them once:

- a `tapml-dbg` command runs in a process forked from the server's CLI process (TVM, then torch,
  imported as `tapml-dbg` imports them) that is otherwise what `python -m tapml_dbg ARGS` (or the
  `tapml-dbg` script) makes: its own process, with the caller's stdin, stdout and stderr (the very
  file descriptors, passed over a Unix socket), working folder, environment, `sys.argv` and
  `sys.path`, its standard streams made as the interpreter makes them at start-up, and nothing of
  tapml_dbg imported (every `TAPML_*` knob read at import is read from the command's environment);
- a session's zygote (`python -m tapml_dbg.runtime.zygote --fd N`, tapml_dbg/runtime/zygote.py) runs
  the same way, forked from the server's first process (TVM imported with torch hidden, as the zygote
  imports it), in a session of its own, with the socket it serves at the same descriptor N; the
  zygote module's `sys.executable` is a small client that asks for it (`use_zygote_server`).

The caller of either is a small client interpreter (`-I -S`: milliseconds) standing in for the real
one: it exits as the command did (its code, or the signal that killed it); killed (a timeout), it
takes the command down with it (a CLI command with every process under it). It runs the real
interpreter instead (exec) whenever a fork could differ: an environment that differs from the
server's in anything but what is read when a command runs (`RUNTIME_ONLY`: `TAPML_*`, the
terminal's size, the shell's own variables...: TVM and torch read others when imported), a terminal
on a standard stream, or no server. `TAPML_TEST_FORK=0` turns both off for a run.

Only the standard library is imported at the top: the clients run this file with `-I -S`.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import threading

OFF = "TAPML_TEST_FORK"  # 0: every command and zygote is a fresh interpreter
RUNTIME_ONLY_PREFIXES = ("TAPML_", "PYTEST_")
RUNTIME_ONLY = {"COLUMNS", "LINES", "FORCE_COLOR", "PWD", "OLDPWD", "SHLVL", "_", "PATH", "PYTHONPATH"}
STDIO = ("stdin", "stdout", "stderr")
ZYGOTE_MODULE = "tapml_dbg.runtime.zygote"
REAL_PYTHON = sys.executable


# ------------------------------------------------------------------ the clients (in place of an interpreter)
def client(sock_path: str, mode: str, script: str, args: list[str]) -> None:
    """Run the command on the server and leave as it did; or exec the real interpreter.

    mode "module": `python -m tapml_dbg ARGS`; "script": the `tapml-dbg` script SCRIPT; "zygote": ARGS
    are `-m tapml_dbg.runtime.zygote --fd N`."""
    fds = [0, 1, 2]
    if mode == "zygote":
        fds.append(int(args[args.index("--fd") + 1]))
    if all(not os.isatty(fd) for fd in (0, 1, 2)) and os.environ.get(OFF) != "0":
        status = _ask(sock_path, {"mode": mode, "script": script, "argv": args, "cwd": os.getcwd(),
                                  "env": dict(os.environ), "fds": fds}, fds)
        if status is not None:
            if status.get("signal"):
                signal.signal(status["signal"], signal.SIG_DFL)
                os.kill(os.getpid(), status["signal"])
            os._exit(status.get("returncode", 1))
    if mode == "module":
        os.execv(sys.executable, [sys.executable, "-m", "tapml_dbg", *args])
    if mode == "zygote":
        os.execv(sys.executable, [sys.executable, *args])
    os.execv(script, [script, *args])


def _ask(sock_path: str, request: dict, fds: list[int]) -> dict | None:
    """The command's exit status; None: the server says to run it the usual way (or is not there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(sock_path)
        except OSError:
            return None
        data = json.dumps(request).encode()
        conn.sendmsg([len(data).to_bytes(8, "big"), data],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
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
def compatible(env: dict, server_env: dict, defaults: dict) -> bool:
    """Whether a fork of the server runs a process in `env` as a fresh interpreter would (the process
    defaults are set by every tapml-dbg process before it imports numpy)."""
    def relevant(environment: dict) -> dict:
        return {k: v for k, v in (defaults | environment).items()
                if k not in RUNTIME_ONLY and not k.startswith(RUNTIME_ONLY_PREFIXES)}
    return relevant(env) == relevant(server_env)


def serve(folder: str, parent: int) -> None:
    """The zygote server (TVM with torch hidden, as a zygote imports it) on `folder/zygote`, and
    forked from it, the CLI server (then torch, and what `tapml-dbg` imports) on `folder/cli`."""
    import gc

    server_env = dict(os.environ)
    from tapml_dbg import settings
    from tapml_dbg.runtime.tvm_import import import_tvm_without_torch

    defaults = dict(settings.PROCESS_DEFAULTS)
    settings.apply_process_defaults()  # before numpy: OPENBLAS_NUM_THREADS
    import_tvm_without_torch()
    import psutil  # noqa: F401
    _forget_tapml_dbg(server_env)
    gc.freeze()  # what is imported stays: a child's collections do not walk (and copy) it
    server_pid = os.getpid()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))  # `Server.stop`: the CLI server first
    cli_pid = os.fork()
    if cli_pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        import h5py  # noqa: F401
        import ml_dtypes  # noqa: F401
        import prompt_toolkit  # noqa: F401
        import rich  # noqa: F401
        import torch  # noqa: F401

        _forget_tapml_dbg(server_env)
        gc.freeze()
        _loop(os.path.join(folder, "cli"), lambda: os.getppid() == server_pid, server_env, defaults, folder)
        return
    _loop(os.path.join(folder, "zygote"), lambda: os.getppid() == parent and not stopping, server_env, defaults,
          folder)
    if not _COMMAND:  # the server itself: its CLI server reaped (its CPU time then counts as this run's)
        try:
            os.kill(cli_pid, signal.SIGTERM)
            os.waitpid(cli_pid, 0)
        except (ProcessLookupError, ChildProcessError):  # gone already (and reaped)
            pass
        _reap()
        if os.getppid() != parent:  # the test process is gone without stopping it (killed): no folder left
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


def _forget_tapml_dbg(server_env: dict) -> None:
    for name in [name for name in sys.modules if name == "tapml_dbg" or name.startswith("tapml_dbg.")]:
        del sys.modules[name]  # each process imports tapml-dbg afresh, reading its knobs from its environment
    os.environ.clear()
    os.environ.update(server_env)


def _loop(sock_path: str, serving, server_env: dict, defaults: dict, folder: str) -> None:
    """Serve while `serving()`; returns when it no longer does, or in a forked command's process
    (`_COMMAND` set)."""
    python_path = [p for p in server_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in python_path]  # sys.path[0] is this file's folder
    stdio = {name: getattr(sys, name) for name in STDIO}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    listener.settimeout(1.0)
    open(sock_path + ".ready", "w").close()
    while serving():
        _reap()
        try:
            conn, _ = listener.accept()
        except (TimeoutError, InterruptedError):
            continue
        if os.fork() == 0:  # the handler: forks the command, reports how it ended
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            listener.close()
            conn.settimeout(None)
            if _handle(conn, server_env, defaults):  # in the command's process
                _become(base_path, stdio, folder)
                return
        conn.close()
    listener.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _handle(conn: socket.socket, server_env: dict, defaults: dict) -> bool:
    """In the handler: True in the command's process (forked from it), which then becomes the command."""
    size_bytes, fds = _receive(conn, 8)
    size = int.from_bytes(size_bytes, "big")
    data = b""
    while len(data) < size:
        data += conn.recv(size - len(data))
    request = json.loads(data)
    if len(fds) != len(request["fds"]) or not compatible(request["env"], server_env, defaults):
        conn.sendall(json.dumps({"fallback": True}).encode())
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _place(fds, request["fds"])
        _COMMAND.update(request)
        return True
    for fd in fds:
        os.close(fd)
    conn.sendall(_wait(pid, conn, tree=request["mode"] != "zygote"))
    os._exit(0)


def _receive(conn: socket.socket, size: int) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(size, socket.CMSG_LEN(8 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    while len(data) < size:
        data += conn.recv(size - len(data))
    return data, list(fds)


def _place(fds: list[int], targets: list[int]) -> None:
    """The received descriptors at the numbers the client had them at (0, 1, 2 and a zygote's N)."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target)
        os.close(fd)


def _wait(pid: int, conn: socket.socket, tree: bool) -> bytes:
    import select

    exited = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([exited, conn], [], [])
        if exited in ready:
            break
        if conn in ready and not conn.recv(1):  # the client is gone: so goes what it ran
            _kill(pid, tree)
            break
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return json.dumps({"signal": os.WTERMSIG(status), "returncode": -os.WTERMSIG(status)}).encode()
    return json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode()


def _kill(pid: int, tree: bool) -> None:
    """A CLI command with every process under it (what the suite started must not outlive it); a
    zygote alone, as `Popen.kill` kills it (the workers it forked are the session's to stop)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = (root.children(recursive=True) if tree else []) + [root]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _become(base_path: list[str], stdio: dict, folder: str) -> None:
    """This process, a fork of the server, made into the command's (then run by `main`)."""
    import io
    import tempfile

    request = _COMMAND
    if request["mode"] == "zygote":
        os.setsid()  # Popen(start_new_session=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None
    python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.path.dirname(request["script"]) if request["mode"] == "script" else os.getcwd()
    sys.path[:] = [first, *python_path, *base_path]
    for fd, name in enumerate(STDIO):  # as the interpreter makes them at start-up, on these descriptors
        old = stdio[name]
        buffering = 0 if isinstance(old.buffer, io.FileIO) else -1  # -u, PYTHONUNBUFFERED
        stream = io.TextIOWrapper(io.open(fd, "wb" if fd else "rb", buffering, closefd=False), encoding=old.encoding,
                                  errors=old.errors, newline="\n", line_buffering=old.line_buffering,
                                  write_through=old.write_through)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if request["mode"] == "script":
        sys.argv = [request["script"], *request["argv"]]
    elif request["mode"] == "module":
        sys.argv = ["-m", *request["argv"]]
    else:  # -m tapml_dbg.runtime.zygote --fd N
        sys.argv = ["-m", *request["argv"][2:]]
    if request["mode"] != "zygote" and os.path.exists(os.path.join(folder, "zygote")):
        use_zygote_server(os.path.join(folder, "bin", "python-zygote"))  # the command's sessions too


_COMMAND: dict = {}  # set in a command's process: what `main` runs


# ------------------------------------------------------------------ sessions' zygotes from the server
class _SysForTheZygoteModule:
    """`sys` as tapml_dbg.runtime.zygote sees it: `sys.executable` the zygote client (when the server
    runs), everything else the interpreter's."""

    def __init__(self, executable):
        self._executable = executable

    def __getattr__(self, name):
        if name == "executable":
            return self._executable() or REAL_PYTHON
        return getattr(sys, name)


def use_zygote_server(executable) -> None:
    """Start sessions' zygotes with `executable` (a path, or a callable giving one or None)."""
    import importlib

    module = importlib.import_module(ZYGOTE_MODULE)
    module.sys = _SysForTheZygoteModule(executable if callable(executable) else lambda: executable)


def use_real_zygotes() -> None:
    module = sys.modules.get(ZYGOTE_MODULE)
    if module is not None:
        module.sys = sys


# ------------------------------------------------------------------ this test process's server
class Server:
    """This test process's fork server: started on first use, stopped with the session."""

    def __init__(self):
        self.process = None
        self.folder = None
        self.failed = False
        self.environment: dict | None = None  # the server's (default: this process's when it starts)
        self._lock = threading.Lock()

    def _serving(self) -> bool:
        if os.environ.get(OFF) == "0":
            return False
        with self._lock:  # tests call run_cli from threads too
            if self.process is None and not self.failed:
                self._start()
        return not self.failed

    def _start(self) -> None:
        import subprocess
        import tempfile
        import time

        self.folder = tempfile.mkdtemp(prefix="tapml-fork-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short: a socket path
        bin_dir = os.path.join(self.folder, "bin")
        os.mkdir(bin_dir)
        script = os.path.join(os.path.dirname(REAL_PYTHON), "tapml-dbg")
        for name, sock, mode, real in (("tapml-dbg", "cli", "script", script), ("python-zygote", "zygote", "zygote", "")):
            path = os.path.join(bin_dir, name)
            with open(path, "w") as out:
                out.write(f"#!{REAL_PYTHON} -IS\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                          f"import fork_cli\nfork_cli.client({os.path.join(self.folder, sock)!r}, {mode!r}, {real!r}, "
                          "sys.argv[1:])\n")
            os.chmod(path, 0o755)
        env = dict(os.environ if self.environment is None else self.environment)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # settings.PROCESS_DEFAULTS: what a forked worker's /proc shows
        with open(os.path.join(self.folder, "log"), "w") as log:
            self.process = subprocess.Popen([REAL_PYTHON, os.path.abspath(__file__), "serve", self.folder, str(os.getpid())],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        deadline = time.monotonic() + 300
        while not all(os.path.exists(os.path.join(self.folder, f"{sock}.ready")) for sock in ("cli", "zygote")):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.failed = True
                return
            time.sleep(0.05)

    def command(self, *args: str) -> list[str]:
        """What runs `python -m tapml_dbg ARGS` (through the server when it serves)."""
        if not self._serving():
            return [REAL_PYTHON, "-m", "tapml_dbg", *args]
        return [REAL_PYTHON, "-IS", os.path.abspath(__file__), os.path.join(self.folder, "cli"), "module", "", *args]

    def shims(self) -> str | None:
        """A folder holding a `tapml-dbg` that runs through the server (None: no server), for a PATH."""
        return os.path.join(self.folder, "bin") if self._serving() else None

    def zygote_executable(self) -> str | None:
        """What starts a session's zygote through the server (None: no server)."""
        return os.path.join(self.folder, "bin", "python-zygote") if self._serving() else None

    def stop(self) -> None:
        import shutil

        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.process, self.folder = None, None


SERVER = Server()


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
        elif _COMMAND["mode"] == "zygote":
            runpy._run_module_as_main(ZYGOTE_MODULE, alter_argv=True)
        else:
            runpy.run_path(_COMMAND["script"], run_name="__main__")
    else:
        client(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])


if __name__ == "__main__":
    main()
