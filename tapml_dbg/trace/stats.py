"""Per-tensor summary stored beside every tensor, so a trace can be scanned without loading it.

All floats are Python floats computed in float64 over the *finite* values only; NaN and Inf
are counted separately. A field is None when there is no finite value to summarise.
"""

from __future__ import annotations

import math

import numpy as np

from tapml_dbg.trace.schema import BITS_DTYPES

FP16_MAX = 65504.0  # largest finite float16; `fp16_headroom` is measured against it

STATS_FIELDS = ("min", "max", "mean", "absmax", "nan", "inf", "numel", "fp16_headroom")


def tensor_stats(array) -> dict:
    """min, max, mean, absmax, nan, inf, numel, fp16_headroom (= log2(65504 / absmax))."""
    # casting a signalling NaN raises the "invalid" flag; stats are not the place to warn
    with np.errstate(all="ignore"):
        return _stats(np.asarray(array))


def _stats(arr: np.ndarray) -> dict:
    numel = int(arr.size)
    out = dict.fromkeys(STATS_FIELDS)
    out.update(nan=0, inf=0, numel=numel)
    if numel == 0:
        return out
    if arr.dtype.name in BITS_DTYPES:
        arr = arr.astype(np.float32)  # exact for bfloat16 / float8; numpy ufuncs work on it
    if arr.dtype.kind == "f":
        fast = _finite_float_stats(arr, numel)
        if fast is not None:
            lo, hi, mean = fast
        else:
            nan = int(np.count_nonzero(np.isnan(arr)))
            inf = int(np.count_nonzero(np.isinf(arr)))
            out.update(nan=nan, inf=inf)
            if nan + inf == numel:
                return out
            where = np.isfinite(arr) if nan + inf else True
            lo = float(np.min(arr, where=where, initial=np.inf))
            hi = float(np.max(arr, where=where, initial=-np.inf))
            mean = float(np.mean(arr, dtype=np.float64, where=where))
    elif arr.dtype.kind in "biu":
        lo, hi = float(arr.min()), float(arr.max())
        mean = float(np.mean(arr, dtype=np.float64))
    else:
        raise TypeError(f"no stats for dtype {arr.dtype}")
    absmax = max(abs(lo), abs(hi))
    out.update(min=lo, max=hi, mean=mean, absmax=absmax)
    out["fp16_headroom"] = math.log2(FP16_MAX / absmax) if absmax > 0 else None
    return out


def _finite_float_stats(arr: np.ndarray, numel: int) -> tuple[float, float, float] | None:
    """(min, max, mean) in three passes when every element is finite, else None.

    The float64 sum of float16/float32 values cannot overflow, so it is finite exactly when no
    element is NaN or Inf; the common case then skips the NaN/Inf masks (five passes and two
    temporaries). The mean is the same float64 sum np.mean computes, divided the same way. A
    float64 sum that overflows only sends the tensor down the general path.
    """
    total = float(np.add.reduce(arr, axis=None, dtype=np.float64))
    if not math.isfinite(total):
        return None
    return float(arr.min()), float(arr.max()), total / numel
