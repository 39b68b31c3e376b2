"""Connect to a TVM RPC server or tracker, with one-line errors on failure."""

from __future__ import annotations

from tapml_dbg.errors import TargetError


def split_host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = (text or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TargetError(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


def connect(rpc: str | None, tracker: str | None, key: str | None, timeout_s: float = 30.0):
    """A remote session on a server (`--rpc`) or one leased from a tracker (`--tracker --key`)."""
    from tvm import rpc as tvm_rpc

    try:
        if rpc:
            host, port = split_host_port(rpc, "--rpc")
            return tvm_rpc.connect(host, port, session_timeout=0)
        host, port = split_host_port(tracker, "--tracker")
        if not key:
            raise TargetError("--tracker needs --key KEY (the device key the servers registered)")
        client = tvm_rpc.connect_tracker(host, port)
        return client.request(key, priority=1, session_timeout=0)
    except TargetError:
        raise
    except Exception as exc:
        where = rpc or tracker
        raise TargetError(f"cannot reach the RPC endpoint {where}: {str(exc).strip().splitlines()[-1][:200]} "
                          "(is `python -m tvm.exec.rpc_server` running there?)") from exc
