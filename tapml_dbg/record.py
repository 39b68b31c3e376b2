"""Run the model on the source and stream every op's outputs into a trace.

A torch source runs the decomposed FX graph node by node (the same graph that was imported),
so each op gets the value torch eager computed for its FX node. Helper bindings that have no
FX node of their own (the matmul inside an `addmm`, say) are computed on the host with TVM
llvm from recorded values, and marked so in the trace.
"""

from __future__ import annotations

import datetime
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import ModelError, UsageError
from .frontend.graph import Graph, OpInfo
from .frontend.importer import Provenance, export_program, import_program
from .frontend.model_loader import load_model
from .frontend.serialize import function_to_json

DEFAULT_SEED = 0
HELPER_NOTE = "computed by tvm:llvm from recorded inputs (no FX node of its own)"

Progress = Callable[[int, int], None]


@dataclass
class RecordResult:
    path: Path
    ops: int
    seconds: float
    eager_seconds: float  # the bare eager forward of the same model, same inputs
    helper_ops: int
    file_bytes: int


def record(model_spec: str, out_path: str | Path, *, source: str = "torch", inputs_npz: str | None = None,
           seed: int = DEFAULT_SEED, compression: str | None = None,
           progress: Progress | None = None) -> RecordResult:
    """Record `model_spec` (FILE.py[:FUNC]) into `out_path`."""
    import torch

    if source != "torch" and not source.startswith("tvm:"):
        raise UsageError(f"unknown source {source!r}: use torch or tvm:TARGET (e.g. tvm:llvm)")
    torch.manual_seed(seed)
    np.random.seed(seed)
    module, inputs = load_model(model_spec)
    if inputs_npz:
        inputs = _load_inputs(inputs_npz, inputs)
    started = time.perf_counter()
    with torch.no_grad():
        program = export_program(module, inputs)
    graph, provenance = import_program(program)
    return _record_graph(model_spec, out_path, graph, provenance, program, module, inputs, source,
                         seed, compression, progress, started)


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


def to_numpy(tensor) -> np.ndarray:
    """torch tensor → numpy, bfloat16 kept exactly (as ml_dtypes.bfloat16)."""
    import torch

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _record_graph(model_spec, out_path, graph: Graph, provenance, program, module, inputs, source, seed,
                  compression, progress, started) -> RecordResult:
    import torch
    import tvm

    from .backends.local import LocalRunner
    from .trace import TraceWriter

    input_arrays = {name: to_numpy(t) for (name, _), t in zip(graph.inputs, inputs)}
    param_arrays = _param_arrays(graph, program)
    meta = {
        "model": str(model_spec), "source": source, "seed": seed,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"tvm": tvm.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version(), "tapml_dbg": _own_version()},
        "inputs": [name for name, _ in graph.inputs], "params": [name for name, _ in graph.params],
        "outputs": graph.outputs, "num_ops": len(graph.ops), "import_fixes": graph.import_fixes,
    }
    writer = TraceWriter(out_path, meta=meta, graph_json=_graph_json(graph),
                         tvmscript=graph.mod.script(), ops=[op.to_json() for op in graph.ops],
                         inputs=input_arrays, params=param_arrays, compression=compression)
    runner = LocalRunner(graph.mod["main"], target=source[4:] if source.startswith("tvm:") else "llvm")
    store = _ValueStore(graph, {**{k: [v] for k, v in input_arrays.items()},
                                **{k: [v] for k, v in param_arrays.items()}})
    helpers = 0
    with writer:
        node_values = _torch_node_values(program, inputs) if source == "torch" else None
        pending: dict[str, object] = {}
        last_op_of_node: dict[str, int] = {}
        for op in graph.ops:
            if op.name in provenance:
                last_op_of_node[provenance[op.name].node] = op.index
        for op in graph.ops:
            values, note = None, ""
            prov = provenance.get(op.name)
            if node_values is not None and prov is not None:
                value = _node_value(node_values, pending, prov.node)
                matched = _match_outputs(value, prov, op)
                if matched is not None:
                    values, note = matched
            if values is None:
                values = runner.run_ops([op.name], store.values)[0]
                note = HELPER_NOTE if source == "torch" else f"computed by {source}"
                helpers += source == "torch"
            writer.write_op(op.index, values, note=note)
            store.add(op, values)
            for name in [n for n in pending if last_op_of_node.get(n, -1) <= op.index]:
                del pending[name]
            if progress:
                progress(op.index + 1, len(graph.ops))
        writer.set_meta("record_seconds", time.perf_counter() - started)
        eager, eager_outputs = _time_eager(module, inputs)
        writer.set_meta("eager_output_max_abs_diff", _output_difference(values, eager_outputs))
    path = Path(out_path)
    return RecordResult(path, len(graph.ops), time.perf_counter() - started, eager, helpers,
                        path.stat().st_size)


def _graph_json(graph: Graph) -> str:
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


def _own_version() -> str:
    try:
        from importlib.metadata import version

        return version("tapml-dbg")
    except Exception:
        return "dev"


class _ValueStore:
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


CAST_NOTE_PREFIX = "cast:"  # "cast:float16": torch's value had this dtype; compare at its precision


def _match_outputs(value, prov: Provenance, op: OpInfo) -> tuple[list[np.ndarray], str] | None:
    """The torch value for this op as its flattened outputs (and a note), or None when it does not fit."""
    import torch

    if value is None:
        return None
    for index in prov.index or ():
        if not isinstance(value, (tuple, list)) or index >= len(value):
            return None
        value = value[index]
    flat = [v for v in _flatten_torch(value)]
    if not op.outputs:
        return None
    if not op.is_tuple and len(flat) > 1:
        flat = [t for t in flat if tuple(t.shape) == op.outputs[0].shape][:1]
    if len(flat) != len(op.outputs):
        return None
    arrays, note = [], ""
    for tensor, spec in zip(flat, op.outputs):
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != spec.shape:
            return None
        array = to_numpy(tensor)
        if str(array.dtype) != spec.dtype and not (spec.dtype == "bool" and array.dtype == np.bool_):
            note = f"{CAST_NOTE_PREFIX}{array.dtype}"
            try:
                array = array.astype(_numpy_dtype(spec.dtype))
            except TypeError:
                return None
        arrays.append(array)
    return arrays, note


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


def _time_eager(module, inputs, repeats: int = 3):
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
