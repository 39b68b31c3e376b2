"""`tapml-dbg serve`: commands forked from a process that imported TVM and torch answer as a fresh
process does, see an edited pass, and run by themselves whenever a fork could differ.

These start real `python -m tapml_dbg` processes (not conftest's run_cli, whose commands are the
test suite's own fork server's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import psutil
import pytest

import fork_cli
from conftest import FAULTS, run_cli
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.stops import Debugger
from tapml_dbg.runtime import fork_server

SERVE_START_S = 300  # its TVM and torch imports on a loaded two-core machine


def _env(cache: Path, **extra: str) -> dict:
    """A user's environment: served when a server serves, none started (`TAPML_SERVER=1`) unless `extra` says."""
    env = {k: v for k, v in os.environ.items() if k not in ("TAPML_SERVER", "CI")}
    return env | {"TAPML_CACHE_DIR": str(cache), "TAPML_SERVER": "1"} | extra


def _tapml(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tapml_dbg", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _plant(path: Path, op: str) -> None:
    path.write_text(FAULTS.read_text() + f"\nSETTINGS = {{'op': {op!r}}}\n")


def _served_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line[:2].isdigit() and "tapml-dbg " in line]


@pytest.fixture
def short_folder():
    folder = Path(tempfile.mkdtemp(prefix="tapml-serve-", dir="/tmp" if os.path.isdir("/tmp") else None))  # a socket path
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_served_commands_answer_as_fresh_ones_see_an_edited_pass_and_fall_back(traces, short_folder):
    trace = shutil.copy(traces.get("mlp"), short_folder / "mlp.h5")
    cache, log = short_folder / "cache", short_folder / "serve.log"
    env = _env(cache)
    assert "no server serves" in _tapml(env, "serve", "--stop", cwd=short_folder).stdout
    with open(log, "w") as err:
        server = subprocess.Popen([sys.executable, "-m", "tapml_dbg", "serve", "--idle", "5"], env=env,
                                  cwd=short_folder, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        first = server.stdout.readline()
        assert first.startswith("serving tapml-dbg commands from"), first + log.read_text()
        again = _tapml(env, "serve", cwd=short_folder)
        assert again.returncode == 1 and "serves from" in again.stderr and "already" in again.stderr

        transform = short_folder / "pass.py"
        _plant(transform, "gelu_1")
        done = _tapml(env, "bisect", "mlp.h5", "--transform", f"{transform}:scale", "--json", cwd=short_folder)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["op"]["name"] == "gelu_1"
        assert len(_served_lines(log)) == 1 and "bisect mlp.h5" in _served_lines(log)[0]

        _plant(transform, "gelu")  # the pass edited in place: the fault moved to an earlier op
        done = _tapml(env, "bisect", "mlp.h5", "--transform", f"{transform}:scale", "--json", cwd=short_folder)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["op"]["name"] == "gelu"
        assert len(_served_lines(log)) == 2

        # an error is the command's, as it would be in a process of its own
        done = _tapml(env, "bisect", "missing.h5", cwd=short_folder)
        assert done.returncode == 1 and done.stderr.startswith("error:") and "missing.h5" in done.stderr
        assert len(_served_lines(log)) == 3

        # not served: TAPML_SERVER=0, and a variable read when TVM or numpy is imported that differs
        for other in (_env(cache, TAPML_SERVER="0"), _env(cache, OMP_NUM_THREADS="3")):
            done = _tapml(other, "info", "mlp.h5", "--json", cwd=short_folder)
            assert done.returncode == 0 and json.loads(done.stdout)["ops"][13]["name"] == "gelu_1", done.stderr
        assert len(_served_lines(log)) == 3

        server.send_signal(signal.SIGINT)  # Ctrl-C at the server's terminal
        assert server.wait(timeout=60) == 0
        assert "stopped" in server.stdout.read()
        assert not (cache / "serve" / "cli").exists() and fork_server.serving_pid(str(cache / "serve")) is None
    finally:
        if server.poll() is None:
            server.kill()
            fork_server.stop(str(cache / "serve"))
    done = _tapml(env, "info", "mlp.h5", cwd=short_folder)  # no server: it runs by itself
    assert done.returncode == 0 and len(_served_lines(log)) == 3


def test_a_client_runs_the_command_itself_when_no_server_answers(short_folder):
    folder = short_folder / "serve"
    folder.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(folder / "cli"))  # a killed server's socket: nothing listens
    stale.close()
    assert fork_server.run_served(["info", "t.h5"], str(folder)) is None
    assert fork_server.serving_pid(str(folder)) is None
    assert fork_server.run_served(["replay", "t.h5"], str(folder)) is None  # the REPL is never served


def test_a_fork_serves_an_environment_that_differs_only_in_what_is_read_at_run_time(monkeypatch):
    server = {"PATH": "/bin", "TERM": "xterm", "OPENBLAS_NUM_THREADS": "1", "LD_LIBRARY_PATH": "/a"}
    defaults = {"OPENBLAS_NUM_THREADS": "1"}
    monkeypatch.setattr(fork_server, "STRICT_ENV", [])
    assert fork_server.compatible(server | {"TERM": "dumb", "TAPML_MEMO": "0", "HOME": "/h"}, server, defaults)
    assert fork_server.compatible({k: v for k, v in server.items() if k != "OPENBLAS_NUM_THREADS"}, server, defaults)
    assert not fork_server.compatible(server | {"LD_LIBRARY_PATH": "/b"}, server, defaults)
    assert not fork_server.compatible(server | {"OMP_NUM_THREADS": "4"}, server, defaults)
    assert not fork_server.compatible(server | {"TVM_NUM_THREADS": "4"}, server, defaults)
    monkeypatch.setattr(fork_server, "STRICT_ENV", [True])  # the test suite's: every variable but the shell's
    assert not fork_server.compatible(server | {"TERM": "dumb"}, server, defaults)
    assert fork_server.compatible(server | {"TAPML_MEMO": "0", "COLUMNS": "80"}, server, defaults)


def test_the_suites_commands_and_its_sessions_zygotes_are_forked_from_its_server(traces):
    """conftest sets TAPML_SERVER=0 (a user's server serves none of the suite), yet the suite's own
    server serves its commands (its shims are `chosen`) and its sessions' zygotes: their workers
    descend from the server, not from a zygote that imported TVM again."""
    done = run_cli("info", str(traces.get("mlp")))
    assert done.returncode == 0, done.stderr
    server = fork_cli.SERVER
    assert server.process is not None and not server.failed, "the suite's fork server did not start"
    assert any(" info " in line for line in _served_lines(Path(server.folder) / "log"))
    with Session.open(traces.get("mlp")) as session:
        Debugger(session).step(1)
        worker = psutil.Process(session.pool.lanes[0]._process.popen.pid)
        assert server.process.pid in [parent.pid for parent in worker.parents()]


def test_the_suites_python_runs_a_script_as_a_fresh_interpreter_does_forked_from_its_server(tmp_path):
    """The docs' `python SCRIPT ARGS` (tests/transcripts.py): the same argv, sys.path[0], __main__,
    streams, working folder and exit code as the real interpreter's, from a fork that has torch loaded;
    `python -c` is the real interpreter."""
    script = tmp_path / "sub" / "prints.py"
    script.parent.mkdir()
    script.write_text("import os, sys\nprint(sys.argv, sys.path[0], __name__, os.getcwd(), sys.stdin.read())\n"
                      "print('to stderr', file=sys.stderr)\nprint('torch' in sys.modules)\nsys.exit(3)\n")
    shims = fork_cli.SERVER.shims()
    assert shims is not None, "the suite's fork server did not start"

    def run(python: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, *args], cwd=tmp_path, input="stdin text", capture_output=True, text=True,
                              timeout=120)

    served = run(os.path.join(shims, "python"), "sub/prints.py", "a", "b")
    fresh = run(sys.executable, "sub/prints.py", "a", "b")
    assert (served.returncode, served.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    assert served.stdout.splitlines()[0] == fresh.stdout.splitlines()[0] == \
        f"['sub/prints.py', 'a', 'b'] {script.parent} __main__ {tmp_path} stdin text"
    assert served.stdout.splitlines()[1:] == ["True"] and fresh.stdout.splitlines()[1:] == ["False"]
    assert " python sub/prints.py a b (pid " in (Path(fork_cli.SERVER.folder) / "log").read_text()
    assert run(os.path.join(shims, "python"), "-c", "import sys; print('torch' in sys.modules)").stdout == "False\n"


ENDINGS = {  # how a script ends -> its last lines
    "returns": "",
    "exits 4": "sys.exit(4)",
    "exits with a message": "sys.exit('a message')",
    "raises": "raise ValueError('bad')",
    "leaves a thread running": "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done'))).start()",
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_served_script_leaves_as_the_interpreter_does_without_its_teardown(tmp_path, ending):
    """A served command leaves without the interpreter's teardown (fork_server._leave), yet as a
    fresh interpreter leaves: its status and streams, its threads waited for, its exit handlers run,
    an HDF5 file it left open written out."""
    script = tmp_path / "ends.py"
    script.write_text("import atexit, sys, threading, time\nimport h5py, numpy\n"
                      "atexit.register(lambda: print('exit handler'))\n"
                      "left_open = h5py.File(sys.argv[1], 'w')\nleft_open['x'] = numpy.arange(3)\n"
                      "print('unflushed', end='')\n" + ENDINGS[ending] + "\n")
    shims = fork_cli.SERVER.shims()
    assert shims is not None, "the suite's fork server did not start"
    ended = {}
    for python in (os.path.join(shims, "python"), sys.executable):
        written = tmp_path / f"{len(ended)}.h5"
        done = subprocess.run([python, str(script), str(written)], capture_output=True, text=True, timeout=120)
        with h5py.File(written, "r") as file:
            ended[python] = (done.returncode, done.stdout, done.stderr.replace(str(written), "H5"), list(file["x"][:]))
    served, fresh = ended.values()
    assert served == fresh
    assert served[3] == [0, 1, 2] and "exit handler" in served[1]


@pytest.mark.parametrize("mode, chosen, asks", [("zygote", False, True), ("module", True, True),
                                                ("module", False, False), ("script", False, False)])
def test_under_tapml_server_0_only_zygotes_and_chosen_shims_ask_their_server(monkeypatch, mode, chosen, asks):
    """A served command sets TAPML_SERVER=0 for itself; its sessions' zygotes are still the server's."""
    monkeypatch.setenv("TAPML_SERVER", "0")
    asked = []

    class Left(Exception):
        pass

    def leave(*_args):
        raise Left

    monkeypatch.setattr(fork_server, "ask", lambda _sock, request: asked.append(request["mode"]) or {"returncode": 0})
    monkeypatch.setattr(fork_server.os, "_exit", leave)
    monkeypatch.setattr(fork_server.os, "execv", leave)
    monkeypatch.setattr(fork_server.os, "isatty", lambda _fd: False)
    args = ["-m", fork_server.ZYGOTE_MODULE, "--fd", "7"] if mode == "zygote" else ["info", "t.h5"]
    with pytest.raises(Left):
        fork_server.client("/nowhere/cli", mode, "/bin/tapml-dbg", args, chosen)
    assert asked == ([mode] if asks else [])


def _until(condition, timeout_s: float = SERVE_START_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_command_starts_a_server_for_the_next_which_wait_for_it_and_a_reinstall_stops_it(traces, short_folder):
    """By default (`TAPML_SERVER` unset) a command that ran by itself starts a server as it leaves; the
    next command, started at once, waits for it and is served; a library installed anew since the
    server imported it (here a sitecustomize, which every interpreter imports) stops the server, and
    the command runs by itself."""
    trace = shutil.copy(traces.get("mlp"), short_folder / "mlp.h5")
    cache, site = short_folder / "cache", short_folder / "site"
    folder = str(cache / "serve")
    site.mkdir()
    (site / "sitecustomize.py").write_text("# a library the server imports\n")
    python_path = os.pathsep.join([str(site), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env = _env(cache, PYTHONPATH=python_path)
    del env["TAPML_SERVER"]
    transform = short_folder / "pass.py"
    try:
        assert not _tapml(env | {"TAPML_SERVER": "1"}, "info", "mlp.h5", cwd=short_folder).returncode
        assert not fork_server.starting(folder) and fork_server.serving_pid(folder) is None  # 1: none started
        _plant(transform, "gelu_1")
        done = _tapml(env, "bisect", "mlp.h5", "--transform", f"{transform}:scale", "--json", cwd=short_folder)
        assert done.returncode == 0 and json.loads(done.stdout)["op"]["name"] == "gelu_1", done.stderr
        assert fork_server.starting(folder) or fork_server.serving_pid(folder), "no server started for the next"
        _plant(transform, "gelu")  # at once: the server may still be importing
        done = _tapml(env, "bisect", "mlp.h5", "--transform", f"{transform}:scale", "--json", cwd=short_folder)
        assert done.returncode == 0 and json.loads(done.stdout)["op"]["name"] == "gelu", done.stderr
        log = cache / "serve" / "log"
        assert [line for line in _served_lines(log) if "bisect mlp.h5" in line], log.read_text()
        pid = fork_server.serving_pid(folder)
        assert pid is not None

        (site / "sitecustomize.py").write_text("# the same library, installed anew\n")
        done = _tapml(env, "info", "mlp.h5", "--json", cwd=short_folder)
        assert done.returncode == 0 and json.loads(done.stdout)["ops"][13]["name"] == "gelu_1", done.stderr
        assert len([line for line in _served_lines(log) if " info " in line]) == 0  # it ran by itself
        assert "sitecustomize.py was installed anew" in log.read_text()
        assert _until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 60)
    finally:
        fork_server.stop(folder)
        assert _until(lambda: not fork_server.starting(folder), 60)


def test_a_command_of_another_interpreter_runs_by_itself(monkeypatch):
    """Another interpreter (a virtual environment's) has other libraries: a fork of the server is not it."""
    sent = []

    class Connection:  # a client's socket: the request's size, then the request
        def __init__(self, request: dict):
            body = json.dumps(request).encode()
            self.data = len(body).to_bytes(8, "big") + body

        def recvmsg(self, size, _ancillary):
            return self.recv(size), [], 0, None

        def recv(self, size):
            chunk, self.data = self.data[:size], self.data[size:]
            return chunk

        def sendall(self, data):
            sent.append(json.loads(data))

    class Left(Exception):
        pass

    def leave(_code):
        raise Left

    monkeypatch.setattr(fork_server.os, "_exit", leave)
    monkeypatch.setattr(fork_server.os, "fork", lambda: pytest.fail("forked for another interpreter"))
    request = fork_server._request("module", "", ["info", "t.h5"], [])
    for python in ("/elsewhere/venv/bin/python", None):
        with pytest.raises(Left):
            fork_server._handle(Connection(request | {"python": python}), dict(os.environ), {})
        assert sent.pop() == {"fallback": True}


@pytest.mark.parametrize("env, argv, paid, starts", [
    ({}, ["bisect", "t.h5"], True, True),
    ({"TAPML_SERVER": "auto"}, ["triage", "t.h5"], True, True),
    ({"TAPML_SERVER": "1"}, ["bisect", "t.h5"], True, False),  # use one, start none
    ({"TAPML_SERVER": "0"}, ["bisect", "t.h5"], True, False),
    ({"CI": "true"}, ["bisect", "t.h5"], True, False),  # a build leaves no server behind
    ({"CI": "0"}, ["bisect", "t.h5"], True, True),
    ({}, ["bisect", "t.h5"], False, False),  # it imported neither TVM nor torch: nothing to save
    ({}, ["replay", "t.h5"], True, False),
    ({}, ["serve", "--stop"], True, False),
])
def test_which_commands_start_a_server_for_the_next(monkeypatch, short_folder, env, argv, paid, starts):
    spawned = []

    class Exited:  # a server that left at once: nothing to wait for
        def poll(self) -> int:
            return 0

    monkeypatch.setattr(fork_server, "spawn", lambda folder, idle_s, log, environment: spawned.append(environment)
                        or Exited())
    monkeypatch.setattr(fork_server, "PAID_FOR", ("json",) if paid else ("a_module_nothing_imported",))
    assert fork_server.start_for_next_commands(argv, str(short_folder / "serve"), env) is starts
    assert spawned == ([env] if starts else [])


def test_one_server_holds_a_folders_lock_and_a_second_cannot_take_it(short_folder):
    folder = str(short_folder / "serve")
    os.makedirs(folder)
    hold = (f"import sys, time; sys.path.insert(0, {str(Path(fork_server.__file__).parent)!r}); import fork_server; "
            f"print(fork_server._hold_lock({folder!r}), flush=True); time.sleep(60)")
    assert not fork_server.starting(folder)
    first = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "True"
        assert fork_server.starting(folder)
        assert not fork_server.start_for_next_commands(["bisect", "t.h5"], folder, {})  # one starts already
        second = subprocess.run([sys.executable, "-c", hold.replace("time.sleep(60)", "pass")], capture_output=True,
                                text=True, timeout=60)
        assert second.stdout.strip() == "False", second.stderr
        assert fork_server.starting(folder)  # a probe does not take it away
    finally:
        first.kill()
        first.wait()
    assert not fork_server.starting(folder)  # the lock goes with its process


def test_a_command_that_starts_a_server_says_so_in_one_line_with_how_to_stop_it(monkeypatch, capsys):
    """On a terminal, the command that leaves a server running says it first thing, in one line:
    what runs, for how long, how to stop it and how to never start one."""
    import io

    from tapml_dbg import entry

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stderr = Terminal()
    monkeypatch.setattr(sys, "argv", ["tapml-dbg", "info", "no-such-trace.h5"])  # quick, and exits 1
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(fork_server, "run_served", lambda argv, folder: None)
    monkeypatch.setattr(fork_server, "start_for_next_commands", lambda argv, folder, env: True)
    assert entry.main() == 1
    lines = [line for line in stderr.getvalue().splitlines() if "server" in line]
    assert len(lines) == 1, stderr.getvalue()
    assert lines[0].startswith("tapml-dbg: started a background server")
    assert "30 idle minutes" in lines[0] and "tapml-dbg serve --stop" in lines[0] and "TAPML_SERVER=0" in lines[0]
