"""Compile every op for a target without running it: code generation as a verdict per op."""

from __future__ import annotations

from typing import Callable

from tapml_dbg.engine.results import CompileReport


def _noop(*_args, **_kwargs) -> None:
    return None


def compile_all(session, progress: Callable[..., None] = _noop) -> CompileReport:
    """Each op is its own unit, so every lane compiles side by side; failures become rows."""
    report = CompileReport(session.target, len(session.ops))
    done = 0
    with session.lanes.dispatch() as work:
        for op in session.ops:
            if op.index not in session.host_only_ops:  # TVM cannot import it: nothing to compile
                work.submit(op.index, op, session.requests.compile_only(op.index))
        for op, result in work:
            result = session.lanes.counted(result)
            progress(done, len(session.ops) - len(session.host_only_ops), op.name)
            done += 1
            if not result.ok:
                report.failures.append({"index": op.index, "name": op.name, "op": op.op, "layer": op.layer,
                                        "verdict": result.status, "message": result.message})
    report.failures.sort(key=lambda row: row["index"])
    return report
