"""The trace: one HDF5 file holding a model's graph, inputs, params and every op's outputs.

The format (v1) is documented in docs/trace-format.md; `schema` holds its names.
"""

from .reader import TraceReader
from .schema import FORMAT_NAME, FORMAT_VERSION
from .stats import tensor_stats
from .writer import TraceWriter

__all__ = ["TraceWriter", "TraceReader", "FORMAT_NAME", "FORMAT_VERSION", "tensor_stats"]
