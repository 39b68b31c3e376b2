"""torch tensors as numpy arrays, exactly: what the recorder stores (the one implementation is
`host/torch_values.py`, shared with the source runner)."""

from __future__ import annotations

from tapml_dbg.host.torch_values import to_numpy

__all__ = ["to_numpy"]
