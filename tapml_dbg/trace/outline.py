"""What a trace says the model is: the op table, the graph and its texts, the names of its inputs
and params, the capture budget. Read on first use, checked (trace/validate.py), cached."""

from __future__ import annotations

from tapml_dbg.model.serialize import GraphFormatError, check_graph
from tapml_dbg.trace import schema as S
from tapml_dbg.trace import validate as V
from tapml_dbg.trace.trace_file import TraceFile
from tapml_dbg.trace.validate import SchemaError
from tapml_dbg.trace.weights import Weights


class Outline:
    """The trace's structure, without its tensors."""

    def __init__(self, file: TraceFile, weights: Weights):
        self._file = file
        self._weights = weights
        self._ops = None

    @property
    def ops(self) -> list[dict]:
        """The op table, checked (`validate.validate_op_table`; cached, do not mutate)."""
        if self._ops is None:
            file = self._file

            def load():
                ops = V.validate_op_table(V.parse_json(file.text(S.DS_OP_TABLE), V.OP_TABLE_PART))
                V.check_capture_ops(file.meta.get(S.META_CAPTURE), len(ops))
                return ops
            self._ops = file.guard(V.OP_TABLE_PART, load)
        return self._ops

    @property
    def capture(self) -> dict | None:
        """The capture budget the trace was recorded with (meta `capture`, checked against the op
        table), None for a full trace."""
        meta = self._file.meta
        if meta.get(S.META_CAPTURE) is None:
            return None
        _ = self.ops  # loading the op table checks the capture's ranges against it
        return meta[S.META_CAPTURE]

    @property
    def input_names(self) -> list[str]:
        return self._file.names(S.GROUP_INPUTS)

    @property
    def param_names(self) -> list[str]:
        """Every param: those stored under /params, then those read from checkpoint files (v1.4)."""
        stored = self._file.names(S.GROUP_PARAMS)
        weights = self._weights.refs
        return stored if weights is None else stored + [name for name in weights.params if name not in stored]

    @property
    def graph_json(self) -> str:
        """The stored graph as text (model/serialize's data-only JSON); `graph()` parses and checks it."""
        return self._file.text(S.DS_IR_JSON)

    def graph(self) -> dict:
        """The graph as a checked dict: valid JSON of bounded depth in model/serialize's format,
        whose bindings are the op table's ops and whose params the trace's inputs and params."""
        def load():
            data = V.parse_json(self.graph_json, V.GRAPH_PART)
            try:
                check_graph(data)
            except GraphFormatError as exc:
                raise SchemaError(V.GRAPH_PART, str(exc)) from None
            V.check_graph_matches(data, self.ops, set(self.input_names) | set(self.param_names))
            return data
        return self._file.guard(V.GRAPH_PART, load)

    @property
    def source_graph_json(self) -> str | None:
        """The source graph as text (v1.2, torch sources; trace/source_graph.py parses it), None without one."""
        present = self._file.has(S.DS_SOURCE_GRAPH, f"/{S.DS_SOURCE_GRAPH}")
        return self._file.text(S.DS_SOURCE_GRAPH) if present else None

    @property
    def tvmscript(self) -> str:
        """Human-readable TVMScript; for display only, never to be parsed or executed."""
        return self._file.text(S.DS_TVMSCRIPT)

    def text_names(self) -> list[str]:
        """The texts under /graph: the graph, its TVMScript, the op table (and what a newer minor adds)."""
        return self._file.names(S.GROUP_GRAPH)

    def text(self, name: str) -> str:
        """One text under /graph by name, checked and verified."""
        return self._file.text(f"{S.GROUP_GRAPH}/{name}")
