"""Start real TVM RPC servers and trackers on loopback for tests, and stop them with their sessions.

Each is started with TVM's own class (`tvm.rpc.Server`, `tvm.rpc.tracker.Tracker`: what `python -m
tvm.exec.rpc_server|rpc_tracker` run), which serves from one `tvm.exec.popen_worker` process importing
TVM, not from a launcher importing TVM as well (~3.5 s of CPU a start). `stop` terminates that worker
and the session processes it forked, and so a live connection (tests/conftest.py checks that no
popen_worker is left).
"""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_to(path: str):
    """A server's start-up hook: its log (one `connected from` line a session) to `path`."""
    def log() -> None:
        import logging

        logging.getLogger("RPCServer").handlers[:] = [logging.FileHandler(path)]
    return log


class Server:
    """A TVM RPC server bound to 127.0.0.1, registered with `tracker` ("HOST:PORT") under `key` when given;
    with `log_path`, its log tells how many sessions it served. `start` again serves on the same port."""

    def __init__(self, port: int | None = None, tracker: str | None = None, key: str = "cpu", log_path=None):
        self.port = port or free_port()
        self.tracker = tracker
        self.key = key
        self.log_path = log_path
        self._server = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from tvm import rpc

        options = {}
        if self.tracker:
            host, port = self.tracker.rsplit(":", 1)
            options.update(tracker_addr=(host, int(port)), key=self.key)
        if self.log_path:
            options["server_init_callback"] = _log_to(str(self.log_path))
        self._server = rpc.Server("127.0.0.1", port=self.port, port_end=self.port + 1, silent=not self.log_path,
                                  **options)

    def sessions(self) -> int:
        return self.log_path.read_text(errors="replace").count("connected from") if self.log_path.exists() else 0

    def stop(self) -> None:
        if self._server is not None:
            self._server.terminate()  # the session processes first, then the server
            self._server = None


class Tracker:
    def __init__(self):
        from tvm.rpc.tracker import Tracker as TvmTracker

        port = free_port()
        self._tracker = TvmTracker("127.0.0.1", port=port, port_end=port + 1, silent=True)
        self.port = self._tracker.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def free(self, key: str) -> int:
        """How many servers under `key` the tracker has free."""
        from tvm import rpc

        return rpc.connect_tracker("127.0.0.1", self.port).summary().get("queue_info", {}).get(key, {}).get("free", 0)

    def wait_for_servers(self, key: str, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.free(key) >= count:
                    return
            except Exception:  # not ready yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the tracker never saw {count} free '{key}' servers")

    def stop(self) -> None:
        self._tracker.terminate()
