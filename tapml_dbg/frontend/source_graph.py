"""The decomposed FX graph as data: what the trace stores so the source can be re-executed.

`source_graph_json(program, graph, provenance)` writes, for every FX node, its target by name
(`aten.view.default`, `operator.getitem`), its args and kwargs (references to nodes, inputs and
params as tagged objects; numbers, bools, None, strings and lists as themselves; dtypes, memory
formats, layouts and devices by name) and the dtype and shape torch gives its value (`val`,
from the export's own meta). It also maps every op of the op table to the FX value it holds and
lists the op outputs whose imported type differs from the source's (`type_changes`). The format
and its reader (which validates everything and runs nothing) are in `trace/source_graph.py`.

`host.source_runner.source_outputs` is THE rule that lines an FX value up with an op's
outputs: the recorder uses it on real tensors, `source_graph_json` on the export's meta values,
so a type change listed in the trace is exactly a value the recorder stored with its source type,
and an op listed as holding a node's value is exactly one the recorder stored torch's value for.
"""

from __future__ import annotations

import json
import math

from tapml_dbg.frontend.importer import Provenance
from tapml_dbg.model.graph import Graph, OpInfo, TensorSpec
from tapml_dbg.host.source_runner import source_outputs
from tapml_dbg.host.torch_values import to_numpy
from tapml_dbg.trace import source_graph as SG


def source_graph_json(program, graph: Graph, provenance: dict[str, Provenance]) -> str:
    """The source graph of a decomposed ExportedProgram imported as `graph`, as JSON text."""
    trace_inputs = {name for name, _ in graph.inputs}
    trace_params = {name for name, _ in graph.params}
    placeholders = []
    kinds: dict[str, str] = {}
    metas = {node.name: node.meta.get("val") for node in program.graph_module.graph.nodes if node.op == "placeholder"}
    state = dict(program.state_dict)
    state.update(getattr(program, "constants", {}) or {})
    embedded = 0
    for spec in program.graph_signature.input_specs:
        name = spec.arg.name
        kind = SG.INPUT if name in trace_inputs else SG.PARAM if name in trace_params else SG.ABSENT
        entry = {"name": name, "kind": kind, "trace_name": name, "val": _val(metas.get(name))}
        value = state.get(getattr(spec, "target", None)) if kind == SG.ABSENT else None
        if value is not None and embedded + _nbytes(value) <= SG.MAX_CONSTANT_BYTES:
            # a buffer the import folded into the IR (batch-norm running stats): kept here, as data
            entry.update(kind=SG.CONSTANT, value=SG.encode_constant(to_numpy(value)))
            embedded += _nbytes(value)
            kind = SG.CONSTANT
        kinds[name] = kind
        placeholders.append(entry)
    nodes, outputs, meta = [], [], {}
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder":
            meta[node.name] = node.meta.get("val")
            continue
        if node.op == "output":
            outputs = _encode(list(node.args[0]) if isinstance(node.args[0], (tuple, list)) else [node.args[0]],
                              kinds)
            continue
        entry = {"name": node.name, "val": _val(node.meta.get("val"))}
        meta[node.name] = node.meta.get("val")
        target = _target_name(node)
        if node.op != "call_function" or target is None:
            entry.update(target=None, opaque=f"{node.op} {node.target}"[:SG.MAX_NAME_CHARS], args=[], kwargs={})
        else:
            entry.update(target=target, args=_encode(list(node.args), kinds),
                         kwargs={key: _encode(value, kinds) for key, value in node.kwargs.items()})
        nodes.append(entry)
    ops, changes = {}, []
    for op in graph.ops:
        prov = provenance.get(op.name)
        tensors = source_outputs(meta.get(prov.node), prov, op) if prov is not None else None
        if tensors is None:
            continue  # a helper binding: the recorder computes it, no node holds its value
        ops[op.name] = {"node": prov.node, "index": list(prov.index) if prov.index is not None else None}
        for k, declared, source in type_changes(tensors, op):
            changes.append({"op": op.name, "output": k, "declared": declared.to_json(), "source": source.to_json()})
    return json.dumps({"format": SG.FORMAT, "version": SG.VERSION, "placeholders": placeholders, "nodes": nodes,
                       "outputs": outputs, "ops": ops, "type_changes": changes}, allow_nan=False)


def type_changes(tensors: list | None, op: OpInfo) -> list[tuple[int, TensorSpec, TensorSpec]]:
    """(output, declared spec, source spec) of every output whose dtype or shape the import changed."""
    if tensors is None:
        return []
    changes = []
    for k, (tensor, declared) in enumerate(zip(tensors, op.outputs)):
        source = TensorSpec(tuple(int(d) for d in tensor.shape), dtype_text(tensor.dtype))
        if source != declared:
            changes.append((k, declared, source))
    return changes


def dtype_text(dtype) -> str:
    """A torch dtype in TVM spelling: torch.float32 -> "float32"."""
    return str(dtype).replace("torch.", "")


def _target_name(node) -> str | None:
    """`aten.view.default` / `operator.getitem` / an allowlisted custom op for targets the reader allows,
    else None (opaque)."""
    import operator

    import torch

    target = node.target
    if target is operator.getitem:
        return SG.GETITEM
    if isinstance(target, torch._ops.OpOverload):
        name = str(target)  # "aten.view.default"
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "aten" and parts[1] in SG.ALLOWED_ATEN_OPS or name in SG.ALLOWED_CUSTOM_OPS:
            return name
    return None


def _encode(value, kinds: dict[str, str]):
    """One FX argument as data (see trace/source_graph.py for the tags)."""
    import torch
    from torch.fx import Node

    if isinstance(value, Node):
        kind = kinds.get(value.name) if value.op == "placeholder" else None
        if kind in (SG.INPUT, SG.PARAM, SG.CONSTANT):
            return {kind: value.name}
        if value.op == "placeholder":
            return {"opaque": f"placeholder {value.name} (not in the trace)"}
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, list):
        return [_encode(item, kinds) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, kinds) for item in value]}
    if isinstance(value, torch.dtype):
        name = dtype_text(value)
        return {"dtype": name} if name in SG.DTYPES else {"opaque": f"dtype {name}"}
    if isinstance(value, torch.memory_format):
        name = str(value).replace("torch.", "")
        return {"memory_format": name} if name in SG.MEMORY_FORMATS else {"opaque": f"memory format {name}"}
    if isinstance(value, torch.layout):
        name = str(value).replace("torch.", "")
        return {"layout": name} if name in SG.LAYOUTS else {"opaque": f"layout {name}"}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    return {"opaque": type(value).__name__}


def _val(value):
    """The export's meta value of a node as specs: {"dtype", "shape"}, a list for tuples, None otherwise."""
    import torch

    if isinstance(value, torch.Tensor):
        try:
            shape = [int(d) for d in value.shape]
        except (TypeError, ValueError, RuntimeError):  # a symbolic dimension (a data-dependent one raises RuntimeError)
            return None
        name = dtype_text(value.dtype)
        meta = {"dtype": name if name in SG.DTYPES else "opaque", "shape": shape}
        try:
            meta["stride"] = [int(d) for d in value.stride()]  # the layout eager kernels give it
        except (TypeError, ValueError, RuntimeError):
            pass
        return meta
    if isinstance(value, (tuple, list)):
        return [_val(item) for item in value]
    return None


def _nbytes(value) -> int:
    import torch

    return int(value.numel() * value.element_size()) if isinstance(value, torch.Tensor) else SG.MAX_CONSTANT_BYTES + 1
