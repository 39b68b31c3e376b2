"""Compile every op for a target without running it: code generation as a verdict per op."""

from __future__ import annotations

from typing import Callable

from tapml_dbg.engine.propagation import TargetChains
from tapml_dbg.engine.results import CompileReport


def _noop(*_args, **_kwargs) -> None:
    return None


def compile_all(chains: TargetChains, target: str, progress: Callable[..., None] = _noop) -> CompileReport:
    """Each op is its own unit (`chains`: the ops, their requests, the runtime, the host-only ops kept),
    so every lane compiles side by side; failures become rows."""
    ops, host_only, lanes = chains.ops, chains.kept.host_only_ops, chains.lanes
    report = CompileReport(target, len(ops))
    done = 0
    with lanes.dispatch() as work:
        for op in ops:
            if op.index not in host_only:  # TVM cannot import it: nothing to compile
                work.submit(op.index, op, chains.requests.compile_only(op.index))
        for op, result in work:
            result = lanes.counted(result)
            progress(done, len(ops) - len(host_only), op.name)
            done += 1
            if not result.ok:
                report.failures.append({"index": op.index, "name": op.name, "op": op.op, "layer": op.layer,
                                        "verdict": result.status, "message": result.message})
    report.failures.sort(key=lambda row: row["index"])
    return report
