"""torch tensors as numpy arrays, exactly: what the recorder stores (the one implementation is
`runtime/torch_values.py`, shared with the source runner)."""

from __future__ import annotations

from tapml_dbg.runtime.torch_values import to_numpy

__all__ = ["to_numpy"]
