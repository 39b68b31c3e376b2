"""The trace: one HDF5 file holding a model's graph, inputs, params and every op's outputs.

The format (v1.3) is documented in docs/trace-format.md; `schema` holds its names and limits,
`capture` the capture budgets (record a window of ops with tensors, every op with stats). The
reader is the boundary for untrusted files: `h5safe` checks what HDF5 may follow, read and
allocate, `validate` every JSON part, `verify` reads a whole trace for `info --verify`. The reader
is split by job (`reader.outline`, `reader.recorded`, `reader.tensors`, `reader.weights`: see reader.py).
"""

from tapml_dbg.trace.reader import TraceReader
from tapml_dbg.trace.schema import FORMAT_NAME, FORMAT_VERSION
from tapml_dbg.trace.stats import tensor_stats
from tapml_dbg.trace.writer import TraceWriter

__all__ = ["TraceWriter", "TraceReader", "FORMAT_NAME", "FORMAT_VERSION", "tensor_stats"]
