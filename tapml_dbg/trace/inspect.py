"""Summaries of a trace without loading its tensors (what `info` shows)."""

from __future__ import annotations

from dataclasses import dataclass

from tapml_dbg.model.select import OpTable
from tapml_dbg.trace.capture import op_bytes
from tapml_dbg.trace.reader import TraceReader
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.trace.schema import META_CAUSAL_LM, META_GENERATION, META_HOST_ONLY, META_STOCK_IMPORT
from tapml_dbg.trace.source_graph import parse_source_graph, stock_type_changes


@dataclass(frozen=True)
class TraceInfo:
    """What `tapml-dbg info` answers: `trace_info`'s dict, which `to_json()` is (`info --json`)."""

    info: dict

    def to_json(self) -> dict:
        return self.info


def trace_info(path: str) -> dict:
    """Model, source, versions, op/layer counts, sizes, completeness, and the op table."""
    with TraceReader(path) as reader:
        meta = reader.meta
        ops = reader.outline.ops
        finished = set(reader.recorded.finished_ops())
        stats_only = set(reader.recorded.stats_only_ops())
        layers = OpTable.of(ops).layers()
        activation_bytes = sum(op_bytes(op) for op in ops)
        return {
            "path": str(path),
            "format": f"v{reader.version[0]}.{reader.version[1]}",
            "model": meta.get("model"),
            "source": meta.get("source"),
            "versions": meta.get("versions", {}),
            "created": meta.get("created"),
            "complete": reader.complete,
            "num_ops": len(ops),
            "recorded_ops": len(finished),
            "num_layers": len(layers),
            "num_inputs": len(reader.outline.input_names),
            "num_params": len(reader.outline.param_names),
            "file_bytes": reader.file_size,
            "activation_bytes": activation_bytes,
            "record_seconds": meta.get("record_seconds"),
            "eager_output_max_abs_diff": meta.get("eager_output_max_abs_diff"),
            "import_fixes": meta.get("import_fixes", []),
            "causal_lm": meta.get(META_CAUSAL_LM),  # None: the model ran as build() returned it
            "generation": meta.get(META_GENERATION),  # None: one forward (no --generate)
            "steps": (meta.get(META_GENERATION) or {}).get("steps"),  # the CLI contract's info --json "steps"
            "source_graph": reader.outline.source_graph_json is not None,
            "type_changes": _type_changes(reader),
            "stock_import": _stock_import(reader),
            "host_only": meta.get(META_HOST_ONLY) or [],  # ops TVM cannot import, run on the host in every replay
            "capture": reader.outline.capture,  # None: every op's tensors are stored
            "stats_only_ops": len(stats_only),
            "weights": _weights(reader),  # None: every param is stored in the trace
            "ops": [{"index": op["index"], "name": op["name"], "op": op["op"], "layer": op.get("layer", ""),
                     "relax_op": op.get("relax_op", ""), "recorded": op["index"] in finished,
                     "stats": op["index"] in finished or op["index"] in stats_only,
                     "outputs": op.get("outputs", []), "source_location": op.get("source_location"),
                     "step": op.get("step")}
                    for op in ops],
        }


def _weights(reader: TraceReader) -> dict | None:
    """The params read from checkpoint files (v1.4) and the files a replay needs: each with where it is
    now (`found`, None: missing) and whether it still has its recorded size; None when none is referenced."""
    weights = reader.weights.refs
    if weights is None:
        return None
    return {"params": len(weights.params), "bytes": sum(ref.nbytes for ref in weights.params.values()),
            "files": [{"path": status.path, "bytes": status.bytes, "params": status.params, "found": status.found,
                       "same_size": status.same_size} for status in weights.status()]}


def _type_changes(reader: TraceReader) -> dict | None:
    """How many ops' imports changed the dtype or the shape of what the source computed (a type
    verdict each), and which; None for a trace without a source graph."""
    text = reader.outline.source_graph_json
    if text is None:
        return None
    changes = parse_source_graph(text, str(reader.path)).type_changes
    dtype = {c.op for c in changes if c.declared.dtype != c.source.dtype}
    shape = {c.op for c in changes if c.declared.shape != c.source.shape}
    index = {op["name"]: op["index"] for op in reader.outline.ops}
    ops = sorted({c.op for c in changes}, key=lambda name: index.get(name, -1))
    return {"dtype": len(dtype), "shape": len(shape), "ops": [f"#{index.get(name, '?')} {name}" for name in ops]}


def _stock_import(reader: TraceReader) -> dict | None:
    """What TVM's stock importer does where tapml-dbg's import fixes hide it (meta `stock_import`,
    frontend/stock_import.py): the ops whose stock-declared type is a type verdict, those where it only
    widens a float (fp16 -> fp32: no verdict), and its error when it fails outright; None when the
    comparison was not made (no fix changes any node, or a trace recorded before it existed)."""
    stock = reader.meta.get(META_STOCK_IMPORT)
    text = reader.outline.source_graph_json
    if not stock:
        return None
    index = {op["name"]: op["index"] for op in reader.outline.ops}
    graph_changes = parse_source_graph(text, str(reader.path)).type_changes if text is not None else []
    ops = [OpInfo.from_json(op) for op in reader.outline.ops]
    changes = stock_type_changes(ops, graph_changes, stock.get("fixes") or [])

    def named(found) -> list[str]:
        names = sorted({c.op for c in found}, key=lambda name: index.get(name, -1))
        return [f"#{index.get(name, '?')} {name}" for name in names]

    error_op = stock.get("error_op")
    return {"fixes": stock.get("fixes") or [], "changed": named(c for c in changes if not c.widens),
            "widened": named(c for c in changes if c.widens), "error": stock.get("error"),
            "reason": stock.get("reason"), "error_op": f"#{index[error_op]} {error_op}" if error_op in index else None}
