"""The suite's `tapml-dbg` processes and session zygotes, forked from processes that imported TVM once.

Each `tapml-dbg` process the suite starts (conftest's `run_cli`, the traces it records, the commands
of the docs' transcripts) imports numpy, h5py, TVM and torch, and each session (the suite's own, and
every command's) starts its worker zygote, a fresh interpreter importing TVM: a second or more of
CPU each, hundreds of times a run, on two cores. A fork server per test process imports them once:
`tapml-dbg serve`'s (tapml_dbg/runtime/fork_server.py), with its environment rule strict (a command
whose environment differs from the server's in anything but `TAPML_*`, `PYTEST_*` and the shell's
own variables runs as a fresh interpreter), its clients small interpreters (`-I -S`: milliseconds)
standing in for the real one. A command with a terminal on a standard stream runs the real
interpreter too. `TAPML_TEST_FORK=0` turns the server off for a run.
"""

from __future__ import annotations

import os
import sys
import threading

from tapml_dbg import settings
from tapml_dbg.runtime import fork_server

OFF = "TAPML_TEST_FORK"  # 0: every command and zygote is a fresh interpreter
REAL_PYTHON = sys.executable


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
        # chosen: served despite conftest's TAPML_SERVER=0
        fork_server.write_shims(self.folder, os.path.join(os.path.dirname(REAL_PYTHON), "tapml-dbg"), chosen=True)
        fork_server.shim(self.folder, "python-module", "cli", "module", "", chosen=True)
        fork_server.shim(self.folder, "python", "cli", "python", "", chosen=True)  # the docs' `python SCRIPT`
        env = dict(os.environ if self.environment is None else self.environment)
        settings.apply_process_defaults(env)  # what a forked worker's /proc shows
        with open(os.path.join(self.folder, "log"), "w") as log:
            self.process = subprocess.Popen(
                fork_server.server_command(self.folder, "--parent", str(os.getpid()), "--strict-env", "1",
                                           "--runtime-only", "PYTEST_"),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        deadline = time.monotonic() + fork_server.READY_TIMEOUT_S
        while not all(os.path.exists(os.path.join(self.folder, f"{sock}.ready")) for sock in ("cli", "zygote")):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.failed = True
                return
            time.sleep(0.05)

    def command(self, *args: str) -> list[str]:
        """What runs `python -m tapml_dbg ARGS` (through the server when it serves)."""
        if not self._serving():
            return [REAL_PYTHON, "-m", "tapml_dbg", *args]
        return [REAL_PYTHON, "-IS", os.path.join(self.folder, "bin", "python-module"), *args]

    def shims(self) -> str | None:
        """A folder holding a `tapml-dbg` and a `python` (for `python SCRIPT ARGS`) that run through the
        server (None: no server), for a PATH."""
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
use_zygote_server = fork_server.use_zygote_server
use_real_zygotes = fork_server.use_real_zygotes
