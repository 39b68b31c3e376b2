"""Record a TVM-native model (`build_tvm()`, frontend/native.py) on a trusted TVM target.

Each binding of the entry function is an op; its value is computed on the source target by its
one-op unit fed the values recorded before it (the same units every replay builds, so a replay on
the source target reproduces the trace bit for bit). The trace is the same streaming, checksummed,
crash-safe file as a PyTorch recording, without a source graph: `meta.source` is `tvm:TARGET` and
`meta.native` says which function of which module it was. After the ops, the whole module is
built and run once on the same target: `eager_output_max_abs_diff` says how far the op-by-op
recording is from the module's own run (0.0 where the two agree to the bit).
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tapml_dbg.errors import ModelError, TargetError
from tapml_dbg.frontend.native import NativeModel, load_native, native_spec
from tapml_dbg.portable import flatten
from tapml_dbg.portable.runner import device_kind, parse_target
from tapml_dbg.record.recorder import (WRITE_IN_BACKGROUND, Progress, RecordResult, TraceSink, ValueStore,
                                       graph_json_of, own_version)
from tapml_dbg.runtime.in_process import LocalRunner
from tapml_dbg.trace import TraceWriter
from tapml_dbg.trace.capture import parse_size, plan_capture

META_NATIVE = "native"  # meta key: {"entry": the module's own name of the entry function, "file": the model file}


@dataclass
class NativeRecordResult(RecordResult):
    """A TVM-native recording: which entry function, and how far the module's own whole run on the source
    target is from the op-by-op values (None: it could not run)."""

    entry: str = ""
    source: str = ""
    whole_difference: float | None = None


def record_native(model_spec: str, out_path: str | Path, target: str, *, entry: str | None = None,
                  seed: int = 0, compression: str | None = None, progress: Progress | None = None,
                  window: str | None = None, max_bytes: int | str | None = None) -> RecordResult:
    """Record `model_spec`'s `build_tvm()` module on `target`, every binding of its entry function an op."""
    started = time.perf_counter()
    np.random.seed(seed)
    spec = native_spec(model_spec)
    model = load_native(spec, entry)
    return record_model(model, spec, out_path, target, lambda: _whole_run(model.graph, model, target),
                        started=started, seed=seed, compression=compression, progress=progress, window=window,
                        max_bytes=max_bytes)


def record_model(model: NativeModel, spec: str, out_path: str | Path, target: str, whole_run, *, started: float,
                 seed: int = 0, compression: str | None = None, progress: Progress | None = None,
                 window: str | None = None, max_bytes: int | str | None = None, meta: dict | None = None,
                 result_fields: dict | None = None) -> RecordResult:
    """Record a loaded native model op by op on `target`; `whole_run()` -> (seconds, outputs or None) is
    the module's own run the op-by-op values are checked against; `meta` is added to the trace's."""
    graph = model.graph
    ops_json = [op.to_json() for op in graph.ops]
    plan = plan_capture(ops_json, window, parse_size(max_bytes))
    header = dict(meta={**_meta(spec, model, target, seed, plan), **(meta or {})}, graph_json=graph_json_of(graph),
                  tvmscript=_script(graph.mod), ops=ops_json, inputs=model.inputs, params=model.params,
                  compression=compression, capture=plan is not None, source_graph=None)
    run_started = time.perf_counter()
    runner = LocalRunner(graph.mod["main"], target=target)
    store = ValueStore(graph, {name: [value] for name, value in {**model.inputs, **model.params}.items()})
    stored = set(plan.stored) if plan is not None else None
    sink = TraceSink(lambda: TraceWriter(out_path, **header), background=WRITE_IN_BACKGROUND)
    note = f"computed by tvm:{target}"
    try:
        values: list[np.ndarray] = []
        for op in graph.ops:
            values = _op_values(runner, op, store.values, target)
            sink.put(op.index, values, note, stored is None or op.index in stored)
            store.add(op, values)
            if progress:
                progress(op.index + 1, len(graph.ops))
        writer = sink.finish()
    except BaseException:
        sink.abort()
        raise
    phases = {"import": run_started - started, "run": time.perf_counter() - run_started}
    whole_seconds, difference = _finish(writer, whole_run, values, phases, time.perf_counter() - started)
    path = Path(out_path)
    return NativeRecordResult(path, len(graph.ops), time.perf_counter() - started, whole_seconds, 0,
                              path.stat().st_size, prepare_seconds=phases["import"], run_seconds=phases["run"],
                              stored_ops=len(stored) if stored is not None else len(graph.ops),
                              capture=plan.to_meta() if plan is not None else None, phases=phases,
                              entry=model.entry, source=f"tvm:{target}", whole_difference=difference,
                              **(result_fields or {}))


def _op_values(runner: LocalRunner, op, values: dict, target: str) -> list[np.ndarray]:
    try:
        return runner.run_ops([op.name], values)[0]
    except Exception as exc:  # noqa: BLE001 - TVM's own errors: the op cannot be recorded on this target
        text = str(exc).strip().splitlines()
        raise TargetError(f"op #{op.index} {op.name} ({op.op}) does not run on the source target {target}: "
                          f"{type(exc).__name__}: {text[-1][:300] if text else ''} (record on a target that runs "
                          "it, e.g. --source tvm:llvm)") from exc


def _meta(spec: str, model, target: str, seed: int, plan) -> dict:
    import tvm

    graph = model.graph
    meta = {
        "model": spec, "source": f"tvm:{target}", "seed": seed,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"tvm": tvm.__version__, "numpy": np.__version__, "python": platform.python_version(),
                     "tapml_dbg": own_version()},
        "inputs": [name for name, _ in graph.inputs], "params": [name for name, _ in graph.params],
        "outputs": graph.outputs, "num_ops": len(graph.ops), "import_fixes": [],
        META_NATIVE: {"entry": model.entry, "file": os.fspath(spec.rpartition(":")[0] or spec)},
    }
    if plan is not None:
        meta["capture"] = plan.to_meta()
    return meta


def _script(mod) -> str:
    """TVMScript for display (the graph itself is stored as data); "" where TVM cannot print it."""
    try:
        return mod.script()
    except Exception:  # noqa: BLE001 - display only
        return ""


def _finish(writer, whole_run, last_values, phases: dict, seconds: float):
    """The whole module's own run (`whole_run()`), timed and compared with the op-by-op values; the trace
    marked complete. Returns the whole run's seconds (0.0 where it could not run) and that difference."""
    try:
        whole, outputs = whole_run()
        difference = None
        if outputs is not None:
            diffs = [float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
                     for a, b in zip(last_values, outputs) if a.shape == b.shape]
            difference = max(diffs) if diffs else None
        writer.set_meta("record_seconds", seconds)
        writer.set_meta("record_phases", phases)
        writer.set_meta("helpers", {"host": 0, "tvm": 0})
        writer.set_meta("eager_seconds", whole)
        writer.set_meta("eager_output_max_abs_diff", difference)
    except BaseException:
        writer.close(complete=False)
        raise
    writer.close(complete=True)
    return whole, difference


def _whole_run(graph, model, target: str) -> tuple[float, list[np.ndarray] | None]:
    """The module built whole by TVM and run once (after a warm-up call); (0.0, None) where it fails:
    the op-by-op recording stands on its own."""
    import tvm
    from tvm import relax

    try:
        parsed = parse_target(target)
        executable = tvm.compile(graph.mod, parsed)
        device = tvm.device(device_kind(parsed))
        vm = relax.VirtualMachine(executable, device)
        args = [tvm.runtime.tensor(a, device) for a in [*model.inputs.values(), *model.params.values()]]
        vm["main"](*args)
        started = time.perf_counter()
        result = vm["main"](*args)
        device.sync()
        return time.perf_counter() - started, flatten(result)
    except Exception as exc:  # noqa: BLE001 - a check beside the recording, never its failure
        if isinstance(exc, ModelError):
            raise
        return 0.0, None
