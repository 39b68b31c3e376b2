"""torch tensors as numpy arrays, exactly (bfloat16 included): what the recorder stores."""

from __future__ import annotations

import numpy as np


def to_numpy(tensor) -> np.ndarray:
    """torch tensor → numpy without a copy (a strided view when the tensor is one), bfloat16 kept
    exactly (as ml_dtypes.bfloat16). The trace writer makes the one contiguous copy it needs."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return tensor.numpy()
    except (RuntimeError, TypeError):  # e.g. a lazily negated view: materialise it
        return tensor.contiguous().numpy()
