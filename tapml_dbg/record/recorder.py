"""Run the model on the source and stream every op's outputs into a trace.

A torch source runs the decomposed FX graph node by node (the same graph that was imported),
so each op gets the value torch eager computed for its FX node. Helper bindings that have no
FX node of their own (the matmul inside an `addmm`, say) are computed from recorded values on
the host (see `host_ops`: numpy for moves and correctly rounded elementwise ops, torch for
matmuls), else by TVM llvm; the trace notes which.

Speed and memory (docs/perf.md): values are freed after their last consumer; stats and HDF5
writes run on a background thread fed through a byte-bounded queue, so they overlap the model
run without holding more than `WRITE_QUEUE_BYTES` of values in flight.

A capture budget (`window`, `max_bytes`; see `trace.capture`) keeps every op's stats but the
tensors of a window of ops only (plus the values the window reads from outside it).
"""

from __future__ import annotations

import collections
import datetime
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tapml_dbg import settings
from tapml_dbg.errors import ModelError, UsageError
from tapml_dbg.model.graph import Graph, OpInfo
from tapml_dbg.frontend.causal_lm import as_recorded, causal_lm_of
from tapml_dbg.frontend.generation import as_generation, generation_of, op_steps
from tapml_dbg.frontend.importer import Provenance, export_program, import_program
from tapml_dbg.frontend.model_loader import check_model_file, load_model
from tapml_dbg.frontend.source_graph import source_graph_json, type_changes
from tapml_dbg.frontend.stock_import import compare_stock_import
from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.record.heap import use_mmap_for_large_blocks
from tapml_dbg.record.host_ops import HostOps
from tapml_dbg.record.tensors import to_numpy
from tapml_dbg.record.weight_refs import referenced
from tapml_dbg.runtime.in_process import LocalRunner
from tapml_dbg.host.source_runner import source_outputs
from tapml_dbg.trace import TraceWriter
from tapml_dbg.trace.capture import parse_size, plan_capture
from tapml_dbg.trace.schema import (HELPER_NOTE, HOST_NOTE, META_CAUSAL_LM, META_GENERATION, META_HOST_ONLY,
                                   META_STOCK_IMPORT, TYPE_NOTE_PREFIX, tvm_source_target)

DEFAULT_SEED = 0
WRITE_QUEUE_BYTES = 128 * 2**20  # values handed to the writer thread but not yet written
WRITE_IN_BACKGROUND = settings.value(settings.WRITE_THREAD)  # "0": stats and writes inline
EAGER_REPEATS = 3  # best-of-N warm eager forwards timed after recording, for the ratio
EAGER_RATIO_MIN_SECONDS = 0.01  # an eager forward shorter than this gets no overhead ratio: below ~10 ms
# the timing is dispatch and timer noise: the ratio of a tiny model changed tenfold between runs (docs/perf.md)

Progress = Callable[[int, int], None]


@dataclass
class RecordResult:
    path: Path
    ops: int
    seconds: float  # prepare + run: what the recorder itself took (record_seconds in the trace)
    eager_seconds: float  # the bare eager forward of the same model, same inputs (warm, best of N)
    helper_ops: int  # bindings with no FX node of their own (computed on the host or by tvm:llvm)
    file_bytes: int
    prepare_seconds: float = 0.0  # torch.export + decomposition + TVM import + graph serialization
    run_seconds: float = 0.0  # every op run, its stats and writes, until the trace is closed
    host_helpers: int = 0  # helpers computed on the host (numpy / torch), not by TVM
    tvm_helpers: int = 0  # helpers tvm:llvm computed (verifications included)
    stored_ops: int = 0  # ops whose tensors are in the trace (all of them without a budget)
    capture: dict | None = None  # the capture budget (trace meta "capture"), None for a full trace
    phases: dict = field(default_factory=dict)  # seconds per phase, as in the trace's meta
    causal_lm: str | None = None  # "causal LM: Qwen2ForCausalLM, logits of 8 positions, ...": how it was driven
    generation: str | None = None  # "generation: ..., a prefill of 8 positions + 16 decode steps ...": --generate
    host_only: list[dict] = field(default_factory=list)  # ops TVM cannot import, run on the host: {"index", "name", "op", "reason"}

    @property
    def overhead_ratio(self) -> float | None:
        """The recording's run time over the bare eager forward's; None when the forward is too short
        (under EAGER_RATIO_MIN_SECONDS) for the ratio to mean anything."""
        if not self.eager_seconds or self.eager_seconds < EAGER_RATIO_MIN_SECONDS:
            return None
        return (self.run_seconds or self.seconds) / self.eager_seconds


def record(model_spec: str, out_path: str | Path, *, source: str = "torch", inputs_npz: str | None = None,
           seed: int = DEFAULT_SEED, compression: str | None = None,
           progress: Progress | None = None, window: str | None = None,
           max_bytes: int | str | None = None, generate: int | None = None) -> RecordResult:
    """Record `model_spec` (FILE.py[:FUNC]) into `out_path`.

    `window` (`A:B`, an op, or a layer) and/or `max_bytes` (bytes of op tensors) set a capture
    budget: every op's stats are stored, tensors only for the window (see `trace.capture`).
    `generate` (N decode steps) records a causal LM's greedy generation, prefill + N steps with a KV
    cache, as one graph (frontend/generation.py); each op then has its step.
    The source, the output path and the model file are checked before torch is imported (seconds),
    so that a typo fails at once.
    """
    if source != "torch" and not source.startswith("tvm:"):
        raise UsageError(f"unknown source {source!r}: use torch or tvm:TARGET (e.g. tvm:llvm)")
    trace_path = Path(out_path)  # a bad output path fails now, not after the export
    if trace_path.is_dir():
        raise UsageError(f"{trace_path} is a folder: give -o a trace file, e.g. {trace_path / 'trace.h5'}")
    if not trace_path.parent.is_dir() or not os.access(trace_path.parent, os.W_OK):
        raise UsageError(f"cannot write {trace_path}: the folder {trace_path.parent} does not exist or is not "
                         "writable (create it first)")
    max_bytes = parse_size(max_bytes)
    check_model_file(model_spec)
    import torch

    use_mmap_for_large_blocks()  # else freed activations fragment the heap and RSS grows per op
    torch.manual_seed(seed)
    np.random.seed(seed)
    module, inputs = load_model(model_spec)
    if inputs_npz:
        inputs = _load_inputs(inputs_npz, inputs)
    if generate:  # prefill + N greedy decode steps with a KV cache, teacher-forced by the source's tokens
        module, inputs, _ = as_generation(module, inputs, generate)
    else:
        module, inputs = as_recorded(module, inputs)  # an unwrapped causal LM: (ids, mask) -> logits, as generate() runs it
    started = time.perf_counter()
    with torch.no_grad():
        program = export_program(module, inputs)
    exported = time.perf_counter()
    graph, provenance = import_program(program)
    if generation_of(module) is not None:
        for op, step in zip(graph.ops, op_steps(program, graph.ops)):
            op.step = step
    graph.stock = compare_stock_import(program, graph)  # what TVM's stock importer does differently
    phases = {"export": exported - started, "import": time.perf_counter() - exported}
    ops_json = [op.to_json() for op in graph.ops]  # the op table (not dataclasses.asdict: slow; docs/perf.md)
    plan = plan_capture(ops_json, window, max_bytes)
    return _record_graph(model_spec, out_path, graph, provenance, program, module, inputs, source,
                         seed, compression, progress, started, plan, phases, ops_json)


def _load_inputs(npz_path: str, examples: tuple) -> tuple:
    import torch

    try:
        with np.load(npz_path, allow_pickle=False) as data:
            arrays = [data[key] for key in data.files]
    except Exception as exc:
        raise UsageError(f"cannot read inputs from {npz_path}: {exc} (give an .npz of arrays)") from exc
    if len(arrays) != len(examples):
        raise UsageError(f"{npz_path} holds {len(arrays)} arrays but the model takes {len(examples)} inputs")
    result = []
    for array, example in zip(arrays, examples):
        tensor = torch.from_numpy(np.require(array, requirements="C"))
        if tensor.dtype != example.dtype:
            tensor = tensor.to(example.dtype)
        result.append(tensor)
    return tuple(result)


def _record_graph(model_spec, out_path, graph: Graph, provenance, program, module, inputs, source, seed,
                  compression, progress, started, plan, phases, ops_json) -> RecordResult:
    phases = dict(phases)
    serialize_started = time.perf_counter()
    input_arrays = {name: to_numpy(t) for (name, _), t in zip(graph.inputs, inputs)}
    param_arrays = _param_arrays(graph, program)
    meta, causal_lm, generation = _trace_meta(model_spec, graph, module, source, seed, plan, phases)
    header = dict(meta=meta, **referenced(module, program, param_arrays),  # checkpoint tensors: references (v1.4)
                  graph_json=graph_json_of(graph), tvmscript=graph.mod.script(),
                  ops=ops_json, inputs=input_arrays, compression=compression, capture=plan is not None,
                  source_graph=source_graph_json(program, graph, provenance) if source == "torch" else None)
    run_started = time.perf_counter()
    phases["serialize"] = run_started - serialize_started
    runner = LocalRunner(graph.mod["main"], target=tvm_source_target(source) or "llvm")
    store = ValueStore(graph, {**{k: [v] for k, v in input_arrays.items()},
                                **{k: [v] for k, v in param_arrays.items()}})
    host = HostOps(graph.mod["main"], lambda op: runner.run_ops([op.name], store.values)[0])
    stored = set(plan.stored) if plan is not None else None
    sink = TraceSink(lambda: TraceWriter(out_path, **header), background=WRITE_IN_BACKGROUND)
    try:
        values, helpers, host_helpers = _record_ops(graph, provenance, program, inputs, source, runner, store, host,
                                                    sink, stored, progress)
        writer = sink.finish()
    except BaseException:
        sink.abort()
        raise
    record_seconds, eager = _finish_trace(writer, module, inputs, values, started, run_started, phases,
                                          helpers, host_helpers)
    path = Path(out_path)
    prepare = phases.get("export", 0.0) + phases.get("import", 0.0) + phases["serialize"]
    return RecordResult(path, len(graph.ops), record_seconds, eager, helpers, path.stat().st_size,
                        prepare_seconds=prepare, run_seconds=phases["run"], host_helpers=host_helpers,
                        tvm_helpers=helpers - host_helpers,
                        stored_ops=len(stored) if stored is not None else len(graph.ops),
                        capture=plan.to_meta() if plan is not None else None, phases=phases,
                        causal_lm=causal_lm.text if causal_lm is not None else None,
                        generation=generation.text if generation is not None else None,
                        host_only=[entry.to_json() for entry in graph.host_only])


def _trace_meta(model_spec, graph: Graph, module, source, seed, plan, phases: dict):
    """The trace's `meta` attribute, with the causal LM and the generation it describes (None each
    when the model is neither); the stock importer's seconds are added to `phases`."""
    import torch
    import tvm

    meta = {
        "model": str(model_spec), "source": source, "seed": seed,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"tvm": tvm.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version(), "tapml_dbg": own_version()},
        "inputs": [name for name, _ in graph.inputs], "params": [name for name, _ in graph.params],
        "outputs": graph.outputs, "num_ops": len(graph.ops), "import_fixes": graph.import_fixes,
    }
    if graph.stock is not None:  # what TVM's stock importer does differently (frontend/stock_import.py)
        meta[META_STOCK_IMPORT] = graph.stock.to_meta()
        phases["stock_import"] = graph.stock.seconds  # part of "import"
    if graph.host_only:  # ops TVM cannot import: run on the host in every replay (frontend/host_only.py)
        meta[META_HOST_ONLY] = [entry.to_json() for entry in graph.host_only]
    if plan is not None:
        meta["capture"] = plan.to_meta()
    causal_lm = causal_lm_of(module)  # None unless an unwrapped causal LM was driven as generate() runs it
    if causal_lm is not None:
        meta[META_CAUSAL_LM] = causal_lm.to_meta()
    generation = generation_of(module)
    if generation is not None:
        meta[META_GENERATION] = generation.to_meta()
    return meta, causal_lm, generation


def _record_ops(graph: Graph, provenance, program, inputs, source, runner, store, host, sink, stored, progress):
    """Every op's source value, in order, into `sink`: the torch node's own value where the op has one,
    else a helper computed on the host or by `runner`. Returns the last op's values and the helper counts."""
    helpers = host_helpers = 0
    values: list[np.ndarray] = []
    node_values = _torch_node_values(program, inputs) if source == "torch" else None
    pending: dict[str, object] = {}
    last_op_of_node: dict[str, int] = {}
    for op in graph.ops:
        if op.name in provenance:
            last_op_of_node[provenance[op.name].node] = op.index
    for op in graph.ops:
        values, note, declared = None, "", None
        prov = provenance.get(op.name)
        if node_values is not None and prov is not None:
            value = _node_value(node_values, pending, prov.node)
            matched = _match_outputs(value, prov, op)
            if matched is not None:
                values, note, declared = matched
                if declared is None:  # a shape the import changed: what the import computes feeds helpers
                    declared = runner.run_ops([op.name], store.values)[0]
        if values is None and source == "torch":
            values, on_host = host.compute(op, store.values)
            note = HOST_NOTE if on_host else HELPER_NOTE
            helpers += 1
            host_helpers += on_host
        elif values is None:
            values = runner.run_ops([op.name], store.values)[0]
            note = f"computed by {source}"
        sink.put(op.index, values, note, stored is None or op.index in stored)  # the source's own value
        store.add(op, declared if declared is not None else values)
        for name in [n for n in pending if last_op_of_node.get(n, -1) <= op.index]:
            del pending[name]
        if progress:
            progress(op.index + 1, len(graph.ops))
    pending.clear()
    return values, helpers, host_helpers


def _finish_trace(writer, module, inputs, last_values, started, run_started, phases: dict, helpers, host_helpers):
    """Write the run's figures (and the eager forward's, timed now) and mark the trace complete; a failure
    here leaves it incomplete. Returns the recording's seconds and the eager forward's."""
    try:
        finished = time.perf_counter()
        phases["run"] = finished - run_started
        record_seconds = finished - started
        writer.set_meta("record_seconds", record_seconds)
        writer.set_meta("record_phases", phases)
        writer.set_meta("helpers", {"host": host_helpers, "tvm": helpers - host_helpers})
        eager, eager_outputs = _time_eager(module, inputs)
        writer.set_meta("eager_seconds", eager)
        writer.set_meta("eager_output_max_abs_diff", _output_difference(last_values, eager_outputs))
    except BaseException:
        writer.close(complete=False)
        raise
    writer.close(complete=True)
    return record_seconds, eager


class TraceSink:
    """Creates the trace writer and writes ops on a background thread, in submission order.

    Stats and HDF5 writes (numpy and HDF5 release the GIL for the heavy parts) then overlap the
    model run. Memory stays bounded: `put` waits while more than `WRITE_QUEUE_BYTES` of values
    are queued. An error on the thread is raised by the next `put` or by `finish`.
    """

    def __init__(self, make_writer, background: bool = True, limit_bytes: int = WRITE_QUEUE_BYTES):
        self.limit = limit_bytes
        self.writer = None
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._queued_bytes = 0
        self._error: BaseException | None = None
        self._closing = False
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._loop, args=(make_writer,), daemon=True,
                                            name="tapml-trace-writer")
            self._thread.start()
        else:
            self.writer = make_writer()

    def put(self, index: int, values: list[np.ndarray], note: str, store: bool) -> None:
        if self._thread is None:
            self._write((index, values, note, store, 0))
            return
        nbytes = sum(int(getattr(v, "nbytes", 0)) for v in values)
        with self._cond:
            while self._queued_bytes and self._queued_bytes + nbytes > self.limit and self._error is None:
                self._cond.wait()
            self._raise_error()
            self._queue.append((index, values, note, store, nbytes))
            self._queued_bytes += nbytes
            self._cond.notify_all()

    def _write(self, item) -> None:
        index, values, note, store, _ = item
        if store:
            self.writer.write_op(index, values, note=note)
        else:
            self.writer.write_op_stats(index, values, note=note)

    def _loop(self, make_writer) -> None:
        try:
            self.writer = make_writer()
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        self._cond.wait()
                    if not self._queue:
                        return
                    item = self._queue[0]
                self._write(item)
                with self._cond:
                    if self._queue and self._queue[0] is item:  # abort() may have emptied it
                        self._queue.popleft()
                        self._queued_bytes -= item[4]
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the recording thread
            with self._cond:
                self._error = exc
                self._queue.clear()
                self._cond.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def finish(self):
        """Wait until everything queued is written; the writer (still open) or the thread's error."""
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join()
            self._raise_error()
        return self.writer

    def abort(self) -> None:
        """Stop after the op being written; close the trace as incomplete."""
        if self._thread is not None:
            with self._cond:
                self._queue.clear()
                self._queued_bytes = 0
                self._closing = True
                self._cond.notify_all()
            self._thread.join()
        if self.writer is not None:
            self.writer.close(complete=False)


def graph_json_of(graph: Graph) -> str:
    import json

    return json.dumps(function_to_json(graph.mod["main"]))


def _param_arrays(graph: Graph, program) -> dict[str, np.ndarray]:
    state = dict(program.state_dict)
    state.update(getattr(program, "constants", {}) or {})
    by_placeholder = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs
                      if getattr(spec, "target", None)}
    arrays = {}
    for name, _ in graph.params:
        target = by_placeholder.get(name)
        if target not in state:
            raise ModelError(f"parameter {name} has no value in the exported program")
        arrays[name] = to_numpy(state[target])
    return arrays


def own_version() -> str:
    try:
        from importlib.metadata import version

        return version("tapml-dbg")
    except Exception:
        return "dev"


class ValueStore:
    """Recorded values still needed by a later op; freed after their last consumer."""

    def __init__(self, graph: Graph, initial: dict[str, list[np.ndarray]]):
        self.values = dict(initial)
        self.remaining: dict[str, int] = {}
        for op in graph.ops:
            for name in op.inputs:
                self.remaining[name] = self.remaining.get(name, 0) + 1
        self._consumers = {op.name: op.inputs for op in graph.ops}
        self.persistent = set(initial)

    def add(self, op: OpInfo, values: list[np.ndarray]) -> None:
        if self.remaining.get(op.name):
            self.values[op.name] = values
        for name in op.inputs:
            self.remaining[name] -= 1
            if self.remaining[name] == 0 and name not in self.persistent:
                self.values.pop(name, None)


def _torch_node_values(program, inputs):
    """Generator over (node name, value) running the decomposed FX graph one node at a time."""
    import torch
    from torch.fx.node import map_arg

    graph_module = program.graph_module
    signature = program.graph_signature
    state = dict(program.state_dict)
    state.update(getattr(program, "constants", {}) or {})
    user_inputs = iter(inputs)
    placeholder_values = {}
    for spec in signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            placeholder_values[spec.arg.name] = next(user_inputs)
        else:
            placeholder_values[spec.arg.name] = state[spec.target]
    nodes = list(graph_module.graph.nodes)
    last_use: dict[str, int] = {}
    for position, node in enumerate(nodes):
        for used in node.all_input_nodes:
            last_use[used.name] = position
    env: dict[str, object] = {}
    with torch.no_grad():
        for position, node in enumerate(nodes):
            if node.op == "placeholder":
                env[node.name] = placeholder_values[node.name]
            elif node.op == "get_attr":
                env[node.name] = getattr(graph_module, node.target)
            elif node.op == "call_function":
                args = map_arg(node.args, lambda n: env[n.name])
                kwargs = map_arg(node.kwargs, lambda n: env[n.name])
                env[node.name] = node.target(*args, **kwargs)
            else:
                continue
            yield node.name, env[node.name]
            for used in node.all_input_nodes:
                if last_use.get(used.name) == position:
                    env.pop(used.name, None)


def _node_value(node_values, pending: dict, node_name: str):
    """Advance the FX run until `node_name` has run; keep values of nodes not yet consumed."""
    while node_name not in pending:
        try:
            name, value = next(node_values)
        except StopIteration:
            return None
        pending[name] = value
    return pending[node_name]




def _match_outputs(value, prov: Provenance, op: OpInfo):
    """The torch value for this op as its flattened outputs, a note, and the values helpers are fed.

    The trace keeps the source's own value even when the import declares another dtype or shape
    (a type change: the engine reports it and casts at replay time, see engine/requests.py). Later
    helper bindings, computed here from recorded values, are fed the declared type: the values
    returned third (the same list when nothing changed; None when a shape cannot be cast).
    Returns None when the value does not line up with the op at all.
    """
    tensors = source_outputs(value, prov, op)
    if tensors is None:
        return None
    arrays = [to_numpy(t) for t in tensors]
    changes = type_changes(tensors, op)
    if not changes:
        return arrays, "", arrays
    note = "; ".join(f"{TYPE_NOTE_PREFIX} output {k} is {source.dtype} {tuple(source.shape)}, the import "
                     f"declares {spec.dtype} {tuple(spec.shape)}" for k, spec, source in changes)
    declared = list(arrays)
    for k, spec, _source in changes:
        cast = _declared(arrays[k], spec)
        if cast is None:
            return arrays, note, None
        declared[k] = cast
    return arrays, note, declared


def _declared(array: np.ndarray, spec) -> np.ndarray | None:
    """`array` in the declared dtype and shape (None when its element count differs)."""
    if int(np.prod(spec.shape, dtype=np.int64)) != array.size:
        return None
    with np.errstate(all="ignore"):
        return np.asarray(array).astype(_numpy_dtype(spec.dtype)).reshape(spec.shape)


def _flatten_torch(value):
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flatten_torch(item)
    elif value is not None:
        yield value


def _numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _time_eager(module, inputs, repeats: int = EAGER_REPEATS):
    """Best-of-N wall time of the bare eager forward (for the overhead ratio), and its outputs."""
    import torch

    best, outputs = float("inf"), None
    with torch.no_grad():
        for _ in range(repeats):
            started = time.perf_counter()
            outputs = module(*inputs)
            best = min(best, time.perf_counter() - started)
    return best, [to_numpy(t) for t in _flatten_torch(outputs) if isinstance(t, torch.Tensor)]


def _output_difference(recorded: list[np.ndarray], eager_outputs: list[np.ndarray]) -> float | None:
    """How far the recorded outputs are from the model's own eager forward (0.0: bit-exact).

    A fused kernel (e.g. sdpa) that torch.export decomposes can differ in the last bits; the
    trace then says so instead of hiding it.
    """
    diffs = [float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
             for a, b in zip(recorded or [], eager_outputs) if a.shape == b.shape]
    return max(diffs) if diffs else None
