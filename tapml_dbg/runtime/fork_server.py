"""`tapml-dbg serve`: TVM and torch imported once, each `tapml-dbg` command a fork of that process.

A fresh `tapml-dbg` process spends seconds importing TVM and torch before it reads a trace, and
on the GPU host that is most of a search after an edited pass (docs/perf.md). A fork server imports
them once; a command then starts as a fork of it and is otherwise what `python -m tapml_dbg ARGS`
makes: its own process (and process group), with the caller's stdin, stdout and stderr (the very
file descriptors, passed over a Unix socket), working folder, environment, `sys.argv` and
`sys.path`, its standard streams made as the interpreter makes them at start-up, and nothing of
tapml_dbg imported (each command imports tapml-dbg afresh: its `TAPML_*` knobs from its own
environment, an edited tapml-dbg as edited); it leaves as the interpreter leaves, less the teardown
of what it inherited (`leave`). A crash inside TVM takes that command down, not the server. The
server never opens a device and runs no thread (a forked CUDA context is unusable).

Two servers in one process tree, in FOLDER (`<cache>/serve`): the zygote server (TVM with torch
hidden, as a session's zygote imports it) on FOLDER/zygote, and forked from it the command server
(then torch, and what `tapml-dbg` imports) on FOLDER/cli. A command's sessions start their zygotes
through the first (`use_zygote_server`), so their workers skip the TVM import too.

The caller is a client: `tapml-dbg` itself (`run_served`, before it imports anything heavy), or a
small interpreter (`client`, run with `-I -S`: the test suite's commands, tests/fork_cli.py). It
exits as the command did (its code, or the signal that killed it); its Ctrl-C is the command's;
killed, it takes the command down with every process under it. It runs the command the usual way
whenever a fork could differ from a fresh interpreter: an environment that differs from the
server's in what is read when the server's libraries are imported (`IMPORT_TIME_PREFIXES`; with
`--strict-env`, in anything but `RUNTIME_ONLY`), a library installed anew since the server imported
it (the server then stops), or no server. `TAPML_SERVER=0` runs every command the usual way.

Started for the next commands: a command that ran by itself and paid for TVM's or torch's import
starts a server in the background as it leaves (`start_for_next_commands`, unless `TAPML_SERVER` is
0 or 1, or `CI` is set), and a command that finds one starting waits for it. One server per folder:
it holds a POSIX lock on FOLDER/lock from its start (not inherited by what it forks) to its end.

Only the standard library is imported here (clients load this file with `-I -S`); what the servers
import is the entry point's to say (`tapml_dbg.entry.serve_main`).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import time

# what of a command's environment must be the server's: what is read when the server's modules are
# imported (the interpreter's, the loader's, TVM's, torch's, transformers' and its hub's, the math
# libraries' threads); the rest is read when the command runs, from its own environment. The test suite asks for every variable but
# those (`--strict-env`): its commands must be what a fresh interpreter makes.
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "TVM", "TORCH", "PYTORCH", "OMP_", "MKL", "OPENBLAS", "KMP_", "GOMP_",
                        "NUMEXPR", "NUMPY", "VIRTUAL_ENV", "CONDA_PREFIX", "MALLOC_", "GLIBC_",
                        "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "USE_TORCH", "USE_TF", "USE_JAX",
                        "USE_FLAX", "USE_SAFETENSORS")
RUNTIME_ONLY_PREFIXES = ["TAPML_"]  # with --strict-env: what a command reads when it runs (the suite adds PYTEST_)
RUNTIME_ONLY = {"COLUMNS", "LINES", "FORCE_COLOR", "PWD", "OLDPWD", "SHLVL", "_", "PATH", "PYTHONPATH"}
STRICT_ENV = []  # [True] with --strict-env
STDIO = ("stdin", "stdout", "stderr")
ZYGOTE_MODULE = "tapml_dbg.runtime.zygote"
NOT_SERVED = ("serve", "replay")  # the server itself; the REPL reads the terminal (a fork is not its foreground)
INTERRUPT = b"\x03"  # the client's Ctrl-C, sent on to the command
DEFAULT_IDLE_S = 30 * 60.0
# what a command that started a server for the next ones says (on a terminal), in one line
STARTED_LINE = ("tapml-dbg: started a background server (TVM and torch loaded, so the next commands start "
                "faster); it exits after {minutes} idle minutes. Stop it: `tapml-dbg serve --stop`; "
                "never start one: `export TAPML_SERVER=0`")
READY_TIMEOUT_S = 300.0  # the server's TVM and torch imports, on a loaded machine
LOCK_TRIES_S = 2.0  # a server's lock against a client's probe of it (microseconds long)
LOCK_TAKEN_S = 10.0  # a started server's interpreter start, up to its lock, on a loaded machine (~0.1 s idle)
SOCKET_PATH_MAX = 107  # sun_path's bytes on Linux, its NUL aside
READY_FILES = ("cli.ready", "zygote.ready")  # a server's two sockets are listening
PAID_FOR = ("tvm", "torch")  # a command that imported either starts a server for the next ones
REAL_PYTHON = sys.executable


# ------------------------------------------------------------------ where a server is
def server_folder(cache_dir) -> str:
    """The folder of the server of a compile cache (`TAPML_CACHE_DIR`)."""
    return os.path.join(os.fspath(cache_dir), "serve")


def _pid_in(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, "pid")) as file:
            return int(file.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def serving_pid(folder: str) -> int | None:
    """The pid of the server serving from `folder`, None when none does (a stale folder included)."""
    pid = _pid_in(folder)
    if pid is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(os.path.join(folder, "cli"))
        except OSError:
            return None
    return pid


def shim(folder: str, name: str, sock: str, mode: str, script: str, chosen: bool = False) -> str:
    """An executable that runs `client` (a `#!python -IS` script loading this very file); `chosen`: it
    asks its server whatever `TAPML_SERVER` says (a test suite's shims, their server chosen on purpose)."""
    path = os.path.join(folder, "bin", name)
    with open(path, "w") as out:
        out.write(f"#!{REAL_PYTHON} -IS\nimport importlib.util, sys\n"
                  f"spec = importlib.util.spec_from_file_location('tapml_fork_client', {os.path.abspath(__file__)!r})\n"
                  "module = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)\n"
                  f"module.client({os.path.join(folder, sock)!r}, {mode!r}, {script!r}, sys.argv[1:], {chosen!r})\n")
    os.chmod(path, 0o755)
    return path


def write_shims(folder: str, cli_script: str | None = None, chosen: bool = False) -> None:
    """FOLDER/bin/python-zygote (what starts a command's zygotes through the server) and, given the
    real `tapml-dbg` script, FOLDER/bin/tapml-dbg (a `tapml-dbg` on a PATH that runs through it)."""
    os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
    shim(folder, "python-zygote", "zygote", "zygote", "")
    if cli_script:
        shim(folder, "tapml-dbg", "cli", "script", cli_script, chosen)


def starting(folder: str) -> bool:
    """Whether a server holds `folder`'s lock: it serves, or imports TVM and torch to serve."""
    import fcntl

    try:
        fd = os.open(os.path.join(folder, "lock"), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _hold_lock(folder: str) -> bool:
    """Take `folder`'s lock for this process's life (a POSIX lock: what it forks does not hold it)."""
    import fcntl

    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_TRIES_S
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _HELD.append(fd)
            return True
        except OSError:
            if time.monotonic() > deadline:
                os.close(fd)
                return False
            time.sleep(0.02)


_HELD: list[int] = []  # the lock's descriptor, kept open (closing any descriptor of it drops the lock)


def spawn(folder: str, idle_s: float | None, log=None, env: dict | None = None):
    """A server for `folder` started in a session of its own (a terminal's Ctrl-C is not its), in the
    folder (it holds no user's folder); returns its `Popen` at once. `log`: a file for its lines (None:
    this process's stderr); `env`: its environment, what the commands it serves are compared with."""
    import subprocess

    os.makedirs(folder, exist_ok=True)
    write_shims(folder)
    _remove(folder, READY_FILES)  # a killed server's: `start` waits for the new one's
    return subprocess.Popen(server_command(folder, "--idle", str(idle_s or 0)), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True, cwd=folder, env=env)


def start(folder: str, idle_s: float | None, log=None):
    """Start a server serving from `folder` (a `Popen`, once it serves); `log` as for `spawn`."""
    process = spawn(folder, idle_s, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _ready(folder):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise OSError(f"the server did not start (exit {process.poll()})")
        time.sleep(0.05)
    return process


def _ready(folder: str) -> bool:
    return all(os.path.exists(os.path.join(folder, name)) for name in READY_FILES)


def _remove(folder: str, names) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:  # not there
            pass


def start_for_next_commands(argv: list[str], folder: str, env: dict) -> bool:
    """After a command that ran by itself: a server started in the background (logging to
    FOLDER/log, stopping after `DEFAULT_IDLE_S` without a command) when this one paid for TVM's or
    torch's import and none serves or starts, so that the next commands do not; True when started.
    Not under `TAPML_SERVER` 0 or 1, nor where `CI` is set (a build leaves no server behind)."""
    if env.get("TAPML_SERVER") in ("0", "1") or env.get("CI", "").lower() not in ("", "0", "false"):
        return False
    if not argv or argv[0] in NOT_SERVED or not any(name in sys.modules for name in PAID_FOR):
        return False
    if len(os.fsencode(os.path.join(folder, "zygote.ready"))) > SOCKET_PATH_MAX or starting(folder) \
            or serving_pid(folder) is not None:
        return False  # a socket's path too long for Unix: every server would fail to bind it
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "log"), "a") as log:
            server = spawn(folder, DEFAULT_IDLE_S, log, env)
    except OSError:
        return False  # an unwritable cache: the next command runs by itself as this one did
    deadline = time.monotonic() + LOCK_TAKEN_S
    while not starting(folder) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the next command, however soon, finds it starting and waits for it
    return True


def stop(folder: str, wait_s: float = 30.0) -> int | None:
    """Stop the server serving from `folder`, or starting to (commands it runs finish); its pid, None
    when none served."""
    pid = serving_pid(folder)
    if pid is None and starting(folder):
        pid = _pid_in(folder)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + wait_s
    while os.path.exists(os.path.join(folder, "pid")) and starting(folder) and time.monotonic() < deadline:
        time.sleep(0.05)  # it removes its files as it stops (one stopped while importing dies at once)
    return pid


# ------------------------------------------------------------------ the clients
def run_served(argv: list[str], folder: str) -> int | None:
    """`tapml-dbg ARGV` run by the server serving from `folder`: its exit code; None: run it here
    (no server, `TAPML_SERVER=0`, a command it does not serve, or an environment it cannot match)."""
    if os.environ.get("TAPML_SERVER") == "0" or not argv or argv[0] in NOT_SERVED:
        return None
    sock = os.path.join(folder, "cli")
    if not os.path.exists(sock) and not _wait_for_starting(folder):
        return None
    status = ask(sock, _request("module", "", argv, [0, 1, 2]))
    if status is None:
        return None
    _leave_as(status)
    return status.get("returncode", 1)


def _wait_for_starting(folder: str) -> bool:
    """A server starting from `folder` waited for (its imports are what this command would make);
    False when none starts, or it stopped or took `READY_TIMEOUT_S`."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while starting(folder) and time.monotonic() < deadline:
            if _ready(folder):
                return True
            time.sleep(0.05)
    except KeyboardInterrupt:  # Ctrl-C while waiting: the command never started
        sys.exit(130)
    return False


def client(sock_path: str, mode: str, script: str, args: list[str], chosen: bool = False) -> None:
    """Run the command on the server and leave as it did; or exec the real interpreter.

    mode "module": `python -m tapml_dbg ARGS`; "script": the `tapml-dbg` script SCRIPT; "python": `python
    ARGS` (a script file first; anything else, `-c` or `-m`, runs the real interpreter); "zygote": ARGS
    are `-m tapml_dbg.runtime.zygote --fd N`. `TAPML_SERVER=0` runs a command the usual way unless
    the shim was `chosen`; a zygote is always asked for: the session chose the server for its zygotes
    (`use_zygote_server`), and a served command's own `TAPML_SERVER=0` is about its `tapml-dbg`s only."""
    fds = [0, 1, 2]
    if mode == "zygote":
        fds.append(int(args[args.index("--fd") + 1]))
    served = mode == "zygote" or all(not os.isatty(fd) for fd in (0, 1, 2))  # a terminal: the REPL's
    if mode == "python":
        served = served and bool(args) and os.path.isfile(args[0])
    if served and (mode == "zygote" or chosen or os.environ.get("TAPML_SERVER") != "0"):
        status = ask(sock_path, _request(mode, script, args, fds))
        if status is not None:
            _leave_as(status)
            os._exit(status.get("returncode", 1))
    if mode == "module":
        os.execv(sys.executable, [sys.executable, "-m", "tapml_dbg", *args])
    if mode in ("python", "zygote"):
        os.execv(sys.executable, [sys.executable, *args])
    os.execv(script, [script, *args])


def _request(mode: str, script: str, argv: list[str], fds: list[int]) -> dict:
    """What the server needs to make the command's process: this process's folder and environment,
    and its interpreter (another one, another virtual environment's, is not the server's to fork)."""
    return {"mode": mode, "script": script, "argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ), "fds": fds,
            "python": _interpreter()}


def _interpreter() -> str:
    return sys.executable  # a virtual environment's own path (its sys.prefix is the base's under -S)


def _leave_as(status: dict) -> None:
    """A command killed by a signal: this process leaves by the same signal."""
    if status.get("signal"):
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])


def ask(sock_path: str, request: dict) -> dict | None:
    """The command's exit status; None: the server says to run it the usual way (or is not there).
    A Ctrl-C meanwhile is sent on to the command."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(sock_path)
        except OSError:
            return None
        data = json.dumps(request).encode()
        conn.sendmsg([len(data).to_bytes(8, "big"), data],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", request["fds"]))])
        previous = signal.getsignal(signal.SIGINT)
        forwarding = request["mode"] != "zygote" and previous not in (signal.SIG_IGN, None)
        if forwarding:
            signal.signal(signal.SIGINT, lambda *_: _send_quietly(conn, INTERRUPT))
        try:
            answer = _read_all(conn)
        finally:
            if forwarding:
                signal.signal(signal.SIGINT, previous)
    if not answer:  # the command may have run: never run it twice
        sys.stderr.write("tapml-dbg: the server's handler ended without the command's exit status "
                         "(TAPML_SERVER=0 runs commands without it)\n")
        return {"returncode": 1}
    reply = json.loads(answer)
    return None if reply.get("fallback") else reply


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = conn.recv(65536)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# ------------------------------------------------------------------ the server
def compatible(env: dict, server_env: dict, defaults: dict) -> bool:
    """Whether a fork of the server runs a process in `env` as a fresh interpreter would (the process
    defaults are set by every tapml-dbg process before it imports numpy)."""
    if STRICT_ENV:
        prefixes = tuple(RUNTIME_ONLY_PREFIXES)
        compared = lambda name: name not in RUNTIME_ONLY and not name.startswith(prefixes)  # noqa: E731
    else:
        compared = lambda name: name.startswith(IMPORT_TIME_PREFIXES) and name != "PYTHONPATH"  # noqa: E731

    def relevant(environment: dict) -> dict:
        return {k: v for k, v in (defaults | environment).items() if compared(k)}
    return relevant(env) == relevant(server_env)


def serve(folder: str, parent: int | None, idle_s: float | None, defaults: dict, zygote_imports, command_imports) -> None:
    """The zygote server on `folder/zygote` and, forked from it, the command server on `folder/cli`,
    until SIGTERM, the exit of `parent` (when given) or `idle_s` without a command. Returns in the
    server when it stops, and in a command's process (`_COMMAND` then says what `run_command` runs).
    `zygote_imports()` imports what a zygote imports (TVM with torch hidden first), `command_imports()`
    what a command imports; `defaults`: the process defaults every tapml-dbg process sets (set here)."""
    import gc

    os.makedirs(folder, exist_ok=True)
    if not _hold_lock(folder):
        _log(f"tapml-dbg serve: a server serves from {folder} already, or is starting")
        sys.exit(3)
    _remove(folder, READY_FILES)  # a killed server's (a server started without `spawn`: the test suite's)
    with open(os.path.join(folder, "pid.tmp"), "w") as file:
        file.write(str(os.getpid()))
    os.replace(os.path.join(folder, "pid.tmp"), os.path.join(folder, "pid"))
    os.environ.update({k: v for k, v in defaults.items() if k not in os.environ})  # before numpy
    server_env = dict(os.environ)  # what each forked process starts from (`_forget_tapml_dbg`)
    gc.disable()  # the imports make ~740,000 objects for good: each full collection on the way walked them (~1 s)
    zygote_imports()
    import psutil  # noqa: F401
    _forget_tapml_dbg(server_env)  # tapml-dbg's own modules are imported afresh; the libraries under them stay
    gc.freeze()  # what is imported stays: a child's collections do not walk (and copy) it
    server_pid = os.getpid()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))  # the command server first
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is `tapml-dbg serve`'s to pass on
    cli_pid = os.fork()
    if cli_pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        command_imports()
        _forget_tapml_dbg(server_env)
        _INSTALLED.update(_installed_files())
        gc.freeze()
        gc.enable()
        idle = _Idle(idle_s)
        _loop(os.path.join(folder, "cli"), lambda: os.getppid() == server_pid and not idle.over(), server_env,
              defaults, folder, idle)
        return
    gc.enable()
    cli_exit = os.pidfd_open(cli_pid)
    _loop(os.path.join(folder, "zygote"), lambda: (parent is None or os.getppid() == parent) and not stopping
          and not _readable(cli_exit), server_env, defaults, folder, None)
    if not _COMMAND:  # the server itself: its command server reaped (its CPU time then counts as ours)
        try:
            os.kill(cli_pid, signal.SIGTERM)
            os.waitpid(cli_pid, 0)
        except (ProcessLookupError, ChildProcessError):  # gone already (and reaped)
            pass
        _reap()
        if parent is not None and os.getppid() != parent:  # its parent is gone without stopping it (killed)
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        _remove(folder, ("cli", "zygote", *READY_FILES, "pid"))


_INSTALLED: dict[str, tuple] = {}  # in the command server: the files its libraries were imported from


def _installed_files() -> dict[str, tuple]:
    """Each imported top-level library's file (tapml-dbg's own aside: each command imports it afresh)
    with what an install that replaced it would change."""
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." in name or not path or name == "tapml_dbg":
            continue
        try:
            info = os.stat(path)
        except OSError:
            continue
        files[path] = (info.st_ino, info.st_mtime_ns, info.st_size)
    return files


def _installed_anew() -> str | None:
    """The first library file that changed on disk since the command server imported it (a `pip
    install` replaced it: a fork would run the old one), None when none did."""
    for path, seen in _INSTALLED.items():
        try:
            info = os.stat(path)
        except OSError:
            return path
        if (info.st_ino, info.st_mtime_ns, info.st_size) != seen:
            return path
    return None


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


class _Idle:
    """How long the command server has had no command (None: it never stops for that)."""

    def __init__(self, limit_s: float | None):
        self.limit_s = limit_s
        self.handlers: set[int] = set()
        self.since = time.monotonic()

    def started(self, pid: int) -> None:
        self.handlers.add(pid)

    def over(self) -> bool:
        for pid in list(self.handlers):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.handlers.discard(pid)
                self.since = time.monotonic()
        return self.limit_s is not None and not self.handlers and time.monotonic() - self.since > self.limit_s


def _forget_tapml_dbg(server_env: dict) -> None:
    for name in [name for name in sys.modules if name == "tapml_dbg" or name.startswith("tapml_dbg.")]:
        del sys.modules[name]  # each process imports tapml-dbg afresh, reading its knobs from its environment
    os.environ.clear()
    os.environ.update(server_env)


def _loop(sock_path: str, serving, server_env: dict, defaults: dict, folder: str, idle: _Idle | None) -> None:
    """Serve while `serving()`; returns when it no longer does, or in a forked command's process
    (`_COMMAND` set)."""
    python_path = [p for p in server_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in python_path]  # sys.path[0] is the server's own folder
    stdio = {name: getattr(sys, name) for name in STDIO}
    if os.path.exists(sock_path):
        os.unlink(sock_path)  # a server that was killed left it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o077)  # only this user may connect: a command runs as the server's user
    try:
        listener.bind(sock_path)
    finally:
        os.umask(old_mask)
    listener.listen(64)
    listener.settimeout(1.0)
    open(sock_path + ".ready", "w").close()
    while serving():
        if idle is None:
            _reap()
        try:
            conn, _ = listener.accept()
        except (TimeoutError, InterruptedError):
            continue
        pid = os.fork()
        if pid == 0:  # the handler: forks the command, reports how it ended
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            listener.close()
            conn.settimeout(None)
            if _handle(conn, server_env, defaults):  # in the command's process
                _become(base_path, stdio, folder)
                return
        if idle is not None:
            idle.started(pid)
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
    request = json.loads(_exactly(conn, int.from_bytes(size_bytes, "big")))
    if len(fds) != len(request["fds"]) or request.get("python") != _interpreter() \
            or not compatible(request["env"], server_env, defaults):
        conn.sendall(json.dumps({"fallback": True}).encode())
        os._exit(0)
    changed = _installed_anew()
    if changed is not None:  # the command runs by itself, and the server stops: the next one starts afresh
        conn.sendall(json.dumps({"fallback": True}).encode())
        _log(f"{time.strftime('%H:%M:%S')} stopping: {changed} was installed anew since this server imported it")
        try:
            os.kill(os.getppid(), signal.SIGTERM)  # the command server: the server stops when it ends
        except OSError:
            pass
        os._exit(0)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _place(fds, request["fds"])
        _COMMAND.update(request)
        return True
    for fd in fds:
        os.close(fd)
    status = _wait(pid, conn, tree=request["mode"] != "zygote")
    conn.sendall(json.dumps(status).encode())
    if request["mode"] != "zygote":
        program = "python" if request["mode"] == "python" else "tapml-dbg"
        _log(f"{time.strftime('%H:%M:%S')} {program} {' '.join(request['argv'])} (pid {pid}, {request['cwd']}): "
             f"exit {status['returncode']} after {time.monotonic() - started:.1f} s")
    os._exit(0)


def _log(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _receive(conn: socket.socket, size: int) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(size, socket.CMSG_LEN(8 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data:
        os._exit(0)  # a probe (`serving_pid`) or a client that left before asking
    return data + _exactly(conn, size - len(data)), list(fds)


def _exactly(conn: socket.socket, size: int) -> bytes:
    """`size` more bytes of the request; the handler leaves when its client left before sending them."""
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    return data


def _place(fds: list[int], targets: list[int]) -> None:
    """The received descriptors at the numbers the client had them at (0, 1, 2 and a zygote's N)."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, targets):
        os.dup2(fd, target)
        os.close(fd)


def _wait(pid: int, conn: socket.socket, tree: bool) -> dict:
    """How the command ended; its client's Ctrl-C sent on to its process group meanwhile, and the
    client gone, the command killed."""
    import select

    exited = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([exited, conn], [], [])
        if exited in ready:
            break
        if conn in ready:
            data = conn.recv(64)
            if not data:  # the client is gone: so goes what it ran
                _kill(pid, tree)
                break
            if INTERRUPT in data and tree:
                try:
                    os.killpg(pid, signal.SIGINT)
                except OSError:
                    pass
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status), "returncode": -os.WTERMSIG(status)}
    return {"returncode": os.waitstatus_to_exitcode(status)}


def _kill(pid: int, tree: bool) -> None:
    """A command with every process under it (what it started must not outlive it); a zygote
    alone, as `Popen.kill` kills it (the workers it forked are the session's to stop)."""
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
    """This process, a fork of the server, made into the command's (then run by `run_command`)."""
    import io
    import tempfile

    request = _COMMAND
    if request["mode"] == "zygote":
        os.setsid()  # Popen(start_new_session=True)
    else:
        os.setpgid(0, 0)  # its own group: the client's Ctrl-C reaches it and the workers it starts
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["mode"] != "zygote":
        os.environ["TAPML_SERVER"] = "0"  # it is served: its `tapml-dbg` does not ask the server again
    tempfile.tempdir = None
    python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    if request["mode"] == "script":
        first = os.path.dirname(request["script"])
    elif request["mode"] == "python":
        first = os.path.dirname(os.path.realpath(request["argv"][0]))  # as the interpreter puts a script's folder
    else:
        first = os.getcwd()
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
    elif request["mode"] == "python":
        sys.argv = list(request["argv"])
    else:  # -m tapml_dbg.runtime.zygote --fd N
        sys.argv = ["-m", *request["argv"][2:]]
    if request["mode"] != "zygote" and os.path.exists(os.path.join(folder, "zygote")):
        use_zygote_server(os.path.join(folder, "bin", "python-zygote"))  # the command's sessions too


_COMMAND: dict = {}  # set in a command's process: what `run_command` runs


def run_command() -> None:
    """Run the command this process was forked for, as its interpreter would have run it, and leave
    as it would have left (`leave`)."""
    import runpy
    import types

    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        if _COMMAND["mode"] == "module":
            runpy._run_module_as_main("tapml_dbg", alter_argv=True)  # what `python -m tapml_dbg` calls
        elif _COMMAND["mode"] == "zygote":
            runpy._run_module_as_main(ZYGOTE_MODULE, alter_argv=True)
        elif _COMMAND["mode"] == "python":
            runpy.run_path(sys.argv[0], run_name="__main__")
        else:
            runpy.run_path(_COMMAND["script"], run_name="__main__")
    except SystemExit as exc:
        leave(_exit_status(exc.code))
    except BaseException as exc:  # what the interpreter prints of an uncaught exception, then exit 1 (or SIGINT)
        exc.__traceback__ = _as_interpreter_shows(exc.__traceback__)  # the traceback printed is the exception's
        sys.excepthook(type(exc), exc, exc.__traceback__)
        leave(1, interrupted=isinstance(exc, KeyboardInterrupt))
    leave(0)


def _as_interpreter_shows(tb):
    """An uncaught exception's traceback from where the interpreter's own run starts: without this
    function's frame, and for a script without runpy's (`python -m` shows runpy's)."""
    tb = tb.tb_next
    while _COMMAND["mode"] != "module" and tb is not None and tb.tb_frame.f_globals.get("__name__") == "runpy":
        tb = tb.tb_next
    return tb


def _exit_status(code) -> int:
    """The interpreter's exit status for `sys.exit(code)`: None is 0, an int itself, anything else is
    printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def leave(status: int, interrupted: bool = False) -> None:
    """Leave as the interpreter leaves, without tearing it down: the process's threads joined, its exit
    handlers run, its HDF5 files and standard streams flushed, then out with `status` (or by SIGINT,
    as an interpreter that ends on Ctrl-C does). How a served command and a `tapml-dbg` process end.

    A fork's teardown writes to every object it inherited from the server (their reference counts)
    and so copies each page of the server's heap: 0.45 s of CPU for an empty script served, 0.12 s
    leaving this way; a fresh process's, TVM's and torch's, took 0.6 s of a warm bisect's 2.9 (2-core
    machine). The workers and zygotes leave without it for the same reason."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()  # what the interpreter waits for first
    atexit._run_exitfuncs()
    h5f = sys.modules.get("h5py.h5f")
    for file_id in h5f.get_obj_ids(types=h5f.OBJ_FILE) if h5f else ():  # what HDF5's own exit handler closes
        try:
            h5f.flush(file_id)
        except Exception:  # noqa: BLE001 - a file open for reading has nothing to flush
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


# ------------------------------------------------------------------ sessions' zygotes from the server
def use_zygote_server(executable) -> None:
    """Start sessions' zygotes with `executable` (a path, or a callable giving one or None). Imported
    here, when called: this module imports the standard library only (a client loads it with -I -S),
    and a served command's own tapml_dbg is imported afresh after the fork (`_forget_tapml_dbg`)."""
    import tapml_dbg.runtime.zygote as zygote

    zygote.start_zygotes_with(executable)


def use_real_zygotes() -> None:
    import tapml_dbg.runtime.zygote as zygote

    zygote.start_zygotes_with(None)


# ------------------------------------------------------------------ `tapml-dbg serve`'s process
SERVER_MAIN = "from tapml_dbg.entry import serve_main; serve_main()"  # the entry point says what it imports


def server_command(folder: str, *flags: str) -> list[str]:
    """The command line of a server serving from `folder` (flags as `main` reads them)."""
    return [REAL_PYTHON, "-c", SERVER_MAIN, folder, *flags]


def main(argv: list[str], defaults: dict, zygote_imports, command_imports) -> None:
    """`FOLDER [--parent PID] [--idle S] [--strict-env 1] [--runtime-only PREFIX]...`: serve from
    FOLDER (`serve`); in a command's process, run the command."""
    folder, parent, idle_s = argv[0], None, None
    for flag, value in zip(argv[1::2], argv[2::2]):
        if flag == "--parent":
            parent = int(value)
        elif flag == "--idle":
            idle_s = float(value) if float(value) > 0 else None
        elif flag == "--runtime-only":
            RUNTIME_ONLY_PREFIXES.append(value)
        elif flag == "--strict-env":
            STRICT_ENV[:] = [True] if value == "1" else []
    serve(folder, parent, idle_s, defaults, zygote_imports, command_imports)
    if _COMMAND:
        run_command()
