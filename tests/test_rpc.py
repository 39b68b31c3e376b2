"""Remote targets over real TVM RPC servers on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from conftest import fault_transform, run_cli
from rpc_helpers import free_port
from tapml_dbg.errors import TargetError
from tapml_dbg.engine.session import Session


class LocalServer:
    """A real TVM RPC server on 127.0.0.1, started with TVM's own `tvm.rpc.Server` (the class
    `python -m tvm.exec.rpc_server` runs): one popen_worker process importing TVM, not a launcher
    importing TVM as well (~3.5 s of CPU a start). Stopping it kills its session processes too, and
    so the live connection; `start` again serves on the same port."""

    def __init__(self):
        self.port = free_port()
        self._server = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from tvm import rpc

        self._server = rpc.Server("127.0.0.1", port=self.port, port_end=self.port + 1, silent=True)

    def stop(self) -> None:
        if self._server is not None:
            self._server.terminate()  # the session processes first, then the server
            self._server = None


@pytest.fixture(scope="module")
def server():
    """One server for the module: a test that stops it starts it again (same port) before it ends."""
    server = LocalServer()
    yield server
    server.stop()


def test_bisect_over_rpc_gives_the_local_answer(traces, tmp_path, server):
    transform = fault_transform(tmp_path, "scale", "gelu_1")
    path = str(traces.get("mlp"))
    local = run_cli("bisect", path, "--transform", transform, "--json")
    remote = run_cli("bisect", path, "--transform", transform, "--json", "--rpc", server.address)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    local_op, remote_op = json.loads(local.stdout)["op"], json.loads(remote.stdout)["op"]
    assert remote_op["name"] == local_op["name"] == "gelu_1"
    assert remote_op["metrics"]["max_abs_err"] == pytest.approx(local_op["metrics"]["max_abs_err"])


def test_killed_server_gives_a_clear_error_and_the_session_reconnects(traces, server):
    with Session.open(traces.get("mlp"), rpc=server.address) as session:
        assert session.isolated(1).passed
        server.stop()
        try:
            with pytest.raises(TargetError, match="RPC"):
                session.isolated(2)
            with pytest.raises(TargetError):
                session.isolated(3)  # still down: still a clear error, no verdict blamed on the op
        finally:
            server.start()  # restarted on its port
        assert session.isolated(4).passed  # back: the session goes on


def test_unreachable_server_is_a_one_line_error(traces):
    result = run_cli("bisect", str(traces.get("mlp")), "--rpc", f"127.0.0.1:{free_port()}")  # nothing listens there
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "error:" in result.stderr
