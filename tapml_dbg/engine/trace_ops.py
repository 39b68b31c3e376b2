"""A trace's ops as a session reads them once: in order, by name, who reads each value, the tuple
fields nobody reads, the op selectors' table, and the recorded values.

Read only after it is made, so the collaborators that need the graph (verdicts, the propagated
replay, chains of per-op kernels, mixed runs) share it instead of reaching into the session.
"""

from __future__ import annotations

import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.model.analysis import consumers_of, dead_tuple_fields
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.select import OpTable
from tapml_dbg.trace import TraceReader


class TraceOps:
    """One trace's op graph (`main`, its Relax function, and `ops`, its bindings) and recorded values."""

    def __init__(self, reader: TraceReader, main, ops: list[OpInfo], recorded: set[int]):
        self.reader = reader
        self.main = main
        self.ops = ops
        self.by_name = {op.name: op for op in ops}
        self.op_table = OpTable.of(ops)
        self.consumers = consumers_of(ops)
        self.dead_fields = dead_tuple_fields(main)
        self.recorded = recorded  # ops whose values the trace holds
        self.input_names = set(reader.outline.input_names)

    def source_values(self, index: int) -> list[np.ndarray]:
        """Op `index`'s recorded values; TraceError (what to record) when the trace has none."""
        if index not in self.recorded:
            raise TraceError(self.reader.recorded.missing_values_message(index))
        return self.reader.tensors.op_outputs(index)
