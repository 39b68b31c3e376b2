"""The target worker: a child process that compiles and runs units, so TVM crashes stay there.

It reads recorded tensors straight from the trace (read-only) and keeps params on the
device, so the session sends it only names and the few arrays it computed itself.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class WorkerConfig:
    trace_path: str
    target: str
    transform: str | None = None
    cache_dir: str = ""
    rpc: str | None = None  # "host:port"
    tracker: str | None = None  # "host:port"
    rpc_key: str | None = None


@dataclass
class UnitRequest:
    """Run one unit. Inputs are ("input"|"param", name), ("op", name, field) or ("value", array)."""

    unit_json: dict
    inputs: list[tuple]
    outputs: list[str] = field(default_factory=list)
    compile_only: bool = False


def worker_main(conn, config: WorkerConfig, log_path: str | None = None) -> None:
    """Serve requests until told to stop or the pipe closes."""
    if log_path:
        _redirect_native_output(log_path)
    state = _WorkerState(config)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        conn.send(state.handle(message))


def _redirect_native_output(log_path: str) -> None:
    """TVM's C++ warnings go to fd 1/2; keep them in a log the session can quote after a crash."""
    import os
    import sys

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)


class _WorkerState:
    def __init__(self, config: WorkerConfig):
        self.config = config
        self.reader = None
        self.op_index: dict[str, int] = {}
        self.param_cache: dict[str, object] = {}
        self.loaded: dict[str, object] = {}
        self.remote = None
        self.device = None

    def handle(self, request: UnitRequest) -> dict:
        from tapml_dbg.errors import TapmlError

        started = time.perf_counter()
        try:
            from tapml_dbg.runtime.compile_cache import compile_only, compile_unit

            if request.compile_only:
                device_code = compile_only(request.unit_json, self.config.target, self.config.transform)
                return {"status": "ok", "outputs": [], "device_code": device_code,
                        "seconds": time.perf_counter() - started}
            compiled = compile_unit(request.unit_json, self.config.target, self.config.transform,
                                    Path(self.config.cache_dir))
        except TapmlError as exc:
            return {"status": "compile-error", "message": str(exc)}
        except Exception as exc:
            return {"status": "compile-error", "message": _one_line(exc), "detail": traceback.format_exc()}
        if not compiled.device_code:
            return {"status": "compile-error",
                    "message": f"no device code was generated for {self.config.target} (the unit "
                               "compiled to host code only: is a GPU schedule missing?)"}
        compiled_at = time.perf_counter()
        try:
            self._device()
        except TapmlError as exc:
            return {"status": "target-lost", "message": str(exc)}
        try:
            vm = self._load(compiled.path)
            args = [self._argument(ref) for ref in request.inputs]
            if self.remote is not None:  # remote tuples are opaque handles: fetch field by field
                vm.set_input("main", *args)
                vm.invoke_stateful("main")
                result = vm.get_outputs("main")
            else:
                result = vm["main"](*args)
            outputs = [flatten_value(value) for value in result]
        except TapmlError as exc:
            return {"status": "error", "message": str(exc)}
        except Exception as exc:
            if self.remote is not None and (_looks_like_lost_connection(exc) or not self._remote_alive()):
                where = self.config.rpc or self.config.tracker
                self._forget_remote()
                return {"status": "target-lost",
                        "message": f"lost the RPC connection to {where} ({_one_line(exc)}); the next "
                                   "command reconnects once the server is back"}
            return {"status": "error", "message": _one_line(exc), "detail": traceback.format_exc()}
        return {"status": "ok", "outputs": outputs, "cached": compiled.cached,
                "compile_seconds": compiled_at - started, "run_seconds": time.perf_counter() - compiled_at}

    # -- devices -------------------------------------------------------------------------
    def _device(self):
        if self.device is None:
            from tapml_dbg.runtime.target import local_device, target_kind

            kind = target_kind(self.config.target)
            if self.config.rpc or self.config.tracker:
                from tapml_dbg.runtime.remote import connect

                self.remote = connect(self.config.rpc, self.config.tracker, self.config.rpc_key)
                self.device = self.remote.device("cpu" if kind in ("llvm", "c") else kind, 0)
            else:
                self.device = local_device(kind)
        return self.device

    def _remote_alive(self) -> bool:
        try:
            self.remote.get_function("runtime.GetDeviceAttr")  # a round trip
            return True
        except Exception:
            return False

    def _forget_remote(self) -> None:
        self.remote = None
        self.device = None
        self.loaded.clear()
        self.param_cache.clear()

    def _load(self, path: Path):
        import tvm
        from tvm import relax

        key = str(path)
        if key not in self.loaded:
            device = self._device()
            if self.remote is not None:
                self.remote.upload(str(path))
                module = self.remote.load_module(path.name)
            else:
                module = tvm.runtime.load_module(str(path))
            self.loaded[key] = relax.VirtualMachine(module, device)
        return self.loaded[key]

    # -- inputs ---------------------------------------------------------------------------
    def _trace(self):
        if self.reader is None:
            from tapml_dbg.trace import TraceReader

            self.reader = TraceReader(self.config.trace_path)
            self.op_index = {op["name"]: op["index"] for op in self.reader.ops}
        return self.reader

    def _argument(self, ref: tuple):
        import tvm

        kind = ref[0]
        if kind == "param":
            if ref[1] not in self.param_cache:
                self.param_cache[ref[1]] = self._to_device(self._trace().param(ref[1]))
            return self.param_cache[ref[1]]
        if kind == "input":
            return self._to_device(self._trace().input(ref[1]))
        if kind == "op":
            values = self._trace().op_outputs(self.op_index[ref[1]])
            return self._to_device(values[max(ref[2], 0)])
        if kind == "value":
            return self._to_device(ref[1])
        raise ValueError(f"unknown input reference {kind}")

    def _to_device(self, array: np.ndarray):
        import tvm

        return tvm.runtime.tensor(np.require(array, requirements="C"), self._device())


_LOST_CONNECTION_MARKERS = ("RPCCode", "kShutdown", "Socket", "socket", "Connection", "connection", "Broken pipe")


def _looks_like_lost_connection(exc: BaseException) -> bool:
    return any(marker in str(exc) for marker in _LOST_CONNECTION_MARKERS)


def flatten_value(value) -> list[np.ndarray]:
    """A (possibly nested) tuple of TVM tensors as a flat list of numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    flat: list[np.ndarray] = []
    for item in value:
        flat.extend(flatten_value(item))
    return flat


def _one_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else ""
    return f"{type(exc).__name__}: {detail}"[:500]


def _main() -> None:
    """Entry point: `python -m tapml_dbg.runtime.worker --fd N --config JSON --log PATH`."""
    import argparse
    import json
    from multiprocessing.connection import Connection

    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--log")
    args = parser.parse_args()
    worker_main(Connection(args.fd), WorkerConfig(**json.loads(args.config)), args.log)


if __name__ == "__main__":
    _main()
