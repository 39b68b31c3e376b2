"""Lazy trace reader: opening reads the header only; every other part loads on request.

The reader is the trace boundary. A trace is untrusted input: everything it returns was checked
first (trace/trace_file.py says how), and any violation becomes a `TraceError` that names the part
and says what to do. Nothing read from the file is ever unpickled, evaluated or imported.

It is split by job; a caller reaches the part it needs:
  `reader.outline`   what the model is: op table, graph and texts, input and param names, capture;
  `reader.recorded`  which ops the recording holds, and how (values, stats only, a view, nothing);
  `reader.tensors`   the values and stats of inputs, params and ops;
  `reader.weights`   the params read from checkpoint files by reference (v1.4).
The header (`path`, `version`, `complete`, `meta`, ...) is on the reader itself.
"""

from __future__ import annotations

from tapml_dbg.trace.indexed_reads import IndexedReads
from tapml_dbg.trace.outline import Outline
from tapml_dbg.trace.recorded import Recorded
from tapml_dbg.trace.tensors import Tensors
from tapml_dbg.trace.trace_file import HEADER_PART, RECORD_AGAIN, TraceFile
from tapml_dbg.trace.weights import Weights

__all__ = ["TraceReader", "RECORD_AGAIN", "HEADER_PART"]


class TraceReader:
    """Read a trace written by `TraceWriter` (any v1.x)."""

    def __init__(self, path):
        self.file = TraceFile(path)  # opens and reads the header: a bad file fails here, in one line
        file = self.file
        self.path, self.file_size, self.version = file.path, file.file_size, file.version
        self.checksummed, self.complete, self.meta = file.checksummed, file.complete, file.meta
        self.weights = Weights(file)
        self.outline = Outline(file, self.weights)
        self._indexed = IndexedReads(file, self.outline)
        self.recorded = Recorded(file, self.outline, self._indexed, self.weights)
        self.tensors = Tensors(file, self.outline, self.recorded, self._indexed, self.weights)

    def close(self) -> None:
        self.file.close()
        self.recorded.close()
        self._indexed.close()
        self.weights.close()

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

