"""torch tensors <-> numpy arrays, exactly (bfloat16 and float8 included), for the recorder and the source runner."""

from __future__ import annotations

import numpy as np

# ml_dtypes float types torch also has: numpy holds them as ml_dtypes, torch as its own dtype
_BITS = {"bfloat16": ("bfloat16", np.int16), "float8_e4m3fn": ("float8_e4m3fn", np.uint8),
         "float8_e5m2": ("float8_e5m2", np.uint8)}


def to_numpy(tensor) -> np.ndarray:
    """torch tensor → numpy without a copy (a strided view when the tensor is one), bfloat16 and
    float8 kept exactly (as ml_dtypes). The trace writer makes the one contiguous copy it needs."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.layout != torch.strided:  # a sparse param or buffer: stored dense, as TVM binds it
        tensor = tensor.to_dense()
    name = str(tensor.dtype).replace("torch.", "")
    if name in _BITS:
        import ml_dtypes

        bits = torch.int16 if _BITS[name][1] is np.int16 else torch.uint8
        return tensor.contiguous().view(bits).numpy().view(getattr(ml_dtypes, _BITS[name][0]))
    try:
        return tensor.numpy()
    except (RuntimeError, TypeError):  # e.g. a lazily negated view: materialise it
        return tensor.contiguous().numpy()


def to_torch(array: np.ndarray):
    """numpy (ml_dtypes included) → torch CPU tensor sharing the bits; 0-d stays 0-d."""
    import torch

    array = np.asarray(array)
    name = array.dtype.name
    if name in _BITS:
        bits = np.require(array, requirements="C").view(_BITS[name][1])
        return torch.from_numpy(bits).view(getattr(torch, name))
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))  # 0-d stays 0-d
