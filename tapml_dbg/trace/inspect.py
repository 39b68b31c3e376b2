"""Summaries of a trace without loading its tensors (what `info` shows)."""

from __future__ import annotations

from tapml_dbg.model.select import OpTable
from tapml_dbg.trace.capture import op_bytes
from tapml_dbg.trace.reader import TraceReader


def trace_info(path: str) -> dict:
    """Model, source, versions, op/layer counts, sizes, completeness, and the op table."""
    with TraceReader(path) as reader:
        meta = reader.meta
        ops = reader.ops
        finished = set(reader.finished_ops())
        stats_only = set(reader.stats_only_ops())
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
            "num_inputs": len(reader.input_names),
            "num_params": len(reader.param_names),
            "file_bytes": reader.file_size,
            "activation_bytes": activation_bytes,
            "record_seconds": meta.get("record_seconds"),
            "eager_output_max_abs_diff": meta.get("eager_output_max_abs_diff"),
            "import_fixes": meta.get("import_fixes", []),
            "capture": reader.capture,  # None: every op's tensors are stored
            "stats_only_ops": len(stats_only),
            "ops": [{"index": op["index"], "name": op["name"], "op": op["op"], "layer": op.get("layer", ""),
                     "relax_op": op.get("relax_op", ""), "recorded": op["index"] in finished,
                     "stats": op["index"] in finished or op["index"] in stats_only,
                     "outputs": op.get("outputs", [])} for op in ops],
        }
