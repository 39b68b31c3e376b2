"""Start real TVM RPC servers and trackers on loopback for tests (and stop them, children included).

`python -m tvm.exec.rpc_server` and `python -m tvm.exec.rpc_tracker` each run the real server in
a child `tvm.exec.popen_worker` (TVM's PopenWorker): killing only the parent leaves that child
running, adopted by init, ~390 MB each. So each starts in its own process group and `stop`
kills the whole group; `stop_process_group` does the same for any such process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class Server:
    """`python -m tvm.exec.rpc_server` bound to 127.0.0.1 only; with `log_path`, its log tells how
    many sessions it served."""

    def __init__(self, port: int | None = None, tracker: str | None = None, key: str = "cpu", log_path=None):
        self.port = port or free_port()
        self.log_path = log_path
        command = [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(self.port),
                   "--port-end", str(self.port + 1)]
        if tracker:
            command += ["--tracker", tracker, "--key", key]
        # its own process group: the server forks one child per session, and "the server dies"
        # must take the children (and so the live connection) with it
        log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT if log_path else log,
                                            start_new_session=True)
        finally:
            if log_path:
                log.close()
        if not tracker:
            wait_for_port(self.port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def sessions(self) -> int:
        return self.log_path.read_text(errors="replace").count("connected from")

    def stop(self) -> None:
        stop_process_group(self.process)


def stop_process_group(process: subprocess.Popen) -> None:
    """Kill a process started with `start_new_session=True` and everything in its group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


class Tracker:
    def __init__(self):
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                         "--port", str(self.port), "--port-end", str(self.port + 1)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)  # its popen_worker child goes with it
        wait_for_port(self.port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_for_servers(self, key: str, count: int, timeout: float = 60.0) -> None:
        from tvm import rpc

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                summary = rpc.connect_tracker("127.0.0.1", self.port).summary()
                free = summary.get("queue_info", {}).get(key, {}).get("free", 0)
                if free >= count:
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the tracker never saw {count} free '{key}' servers")

    def stop(self) -> None:
        stop_process_group(self.process)
