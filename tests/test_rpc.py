"""Remote targets over real TVM RPC servers on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from conftest import fault_transform, run_cli
from rpc_helpers import Server, free_port
from tapml_dbg.errors import TargetError
from tapml_dbg.engine.session import Session


@pytest.fixture(scope="module")
def server():
    """One server for the module (tests/rpc_helpers.py): a test that stops it starts it again (same port)
    before it ends."""
    server = Server()
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
