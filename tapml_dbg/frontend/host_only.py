"""Ops TVM cannot import, imported as host-only placeholders (model/host_only.py; docs/host-only-ops.md).

An FX node that TVM's `from_exported_program` cannot import used to stop the recording: its op has
no converter (`aten.histc` and transformers' `grouped_mm_fallback` custom op in mixture-of-experts
layers, `aten.amax`), or its converter raises on it (TVM 0.27 imports an int64 floor division by a
Python int with an int32 constant and refuses it). When the host can re-execute the node (an op of
the source runner's allowlist, `trace/source_graph.py`) and its value is tensors, it is imported as
one opaque binding of its tensor inputs and torch's output types instead: the recorder stores the
node's torch value for it, and every replay keeps it on the source. A node the host cannot run
either still stops the recording, in one line that says so.

A converter that raises is found by importing: the node is made a placeholder and the program
imported again (at most `MAX_FAILED_CONVERTERS` times; each node once).
"""

from __future__ import annotations

from tapml_dbg.errors import ModelError
from tapml_dbg.model.host_only import HostOnlyOp, host_only_names, no_converter_reason, placeholder
from tapml_dbg.trace import source_graph as SG
from tapml_dbg.trace.schema import HOST_ONLY_REASON_MAX_CHARS

MAX_FAILED_CONVERTERS = 64  # nodes whose converter raises, made host-only one import each, before giving up


def missing_converters(importer, program) -> list[object]:
    """The FX nodes of `program` whose op has no converter in `importer`, in graph order."""
    return [node for node in program.graph.nodes
            if node.op == "call_function" and node.target.__name__ not in importer.convert_map]


def add_placeholders(importer, program, reasons: dict[str, str], tvm_version: str) -> None:
    """Make `importer` import as placeholders every node without a converter and every node named in
    `reasons` (FX node name -> why TVM cannot import it, one line; the missing ones are added to it).

    Raises ModelError naming the ops that neither TVM nor the host can run."""
    nodes = missing_converters(importer, program)
    unrunnable = sorted({str(node.target) for node in nodes if not host_runnable(node)})
    if unrunnable:
        raise ModelError(f"TVM 0.27 cannot import aten op(s) {', '.join(unrunnable)} (no Relax converter, and the "
                         "host cannot re-execute it in a replay: not an allowlisted op with tensor outputs); "
                         "rewrite that part of the model or add a converter")
    for node in nodes:
        reasons.setdefault(node.name, no_converter_reason(str(node.target), tvm_version))
    emit = _placeholder_converter(importer)
    for node in nodes:
        importer.convert_map[node.target.__name__] = emit
    importer.convert_map = {key: _or_placeholder(convert, emit, reasons)
                            for key, convert in importer.convert_map.items()}


def note_failed_converter(failure, reasons: dict[str, str], tvm_version: str) -> bool:
    """After an import that failed (`importer.ImportFailure`): make its node host-only when the host
    can run it (True: import again), else False (the failure stands)."""
    node = failure.node
    if node is None or node.name in reasons or len(reasons) >= MAX_FAILED_CONVERTERS or not host_runnable(node):
        return False
    major_minor = ".".join(str(tvm_version).split(".")[:2])
    first_sentence = failure.reason.split(". ")[0]  # TVM's messages go on with the Relax they refused
    text = " ".join(f"TVM {major_minor}'s converter for {node.target} fails: {first_sentence}".split())
    reasons[node.name] = text[:HOST_ONLY_REASON_MAX_CHARS]
    return True


def host_runnable(node) -> bool:
    """Whether the source runner can re-execute `node` (an allowlisted op whose value is tensors)."""
    target = str(node.target)
    parts = target.split(".")
    allowed = target in SG.ALLOWED_CUSTOM_OPS or (len(parts) == 3 and parts[0] == "aten"
                                                 and parts[1] in SG.ALLOWED_ATEN_OPS)
    return allowed and _output_types(node) is not None


def _or_placeholder(convert, emit, reasons: dict[str, str]):
    def converter(node, *rest):
        return emit(node) if node.name in reasons else convert(node, *rest)
    return converter


def _placeholder_converter(importer):
    def convert(node, *_rest):
        from tvm import relax

        args = [importer.env[arg] for arg in node.all_input_nodes]
        if not all(isinstance(getattr(arg, "ty", None), relax.TensorType) for arg in args):
            raise ModelError(f"{node.target} (FX node {node.name}) reads a value that is not a tensor; "
                             "the host-only placeholder takes tensors only")
        return importer.block_builder.emit(placeholder(args, _output_types(node)))
    return convert


def _output_types(node) -> list | None:
    """torch's output types of `node` as Relax tensor types (None: a value that is not static tensors)."""
    import torch
    from tvm import relax

    val = node.meta.get("val")
    values = list(val) if isinstance(val, (tuple, list)) else [val]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return None
    try:
        return [relax.TensorType([int(d) for d in v.shape], str(v.dtype).replace("torch.", "")) for v in values]
    except (TypeError, ValueError):  # a symbolic size
        return None


def host_only_ops(graph, reasons: dict[str, str]) -> list[HostOnlyOp]:
    """The graph's host-only ops as findings, in order (`reasons`: FX node name -> why)."""
    names = set(host_only_names(graph.mod["main"]))
    return [HostOnlyOp(op.index, op.name, op.op, reasons.get(op.fx_node, "TVM cannot import it"))
            for op in graph.ops if op.name in names]
