"""Float64 values of helper bindings (Relax bindings with no FX node of their own) on the host.

The matmul inside an `addmm`, the reshapes around an `embedding`, the output tuple: the source
runner has no node for them, yet the noise floor needs their float64 reference. These are the
bindings the recorder itself computes on the host (record/host_ops.py), evaluated here in float64
instead of their declared dtype: moves move, elementwise arithmetic and matmul are exact to
float64. Anything else (convolutions, pooling, norms: the recorder has tvm:llvm compute those)
gives None: no reference, and the fixed rule judges the op.
"""

from __future__ import annotations

import numpy as np

from tapml_dbg.model.units import flatten_ty, tuple_item_values
from tapml_dbg.host.low_precision import recompute_relax
from tapml_dbg.host.torch_values import to_numpy, to_torch

MOVES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.permute_dims",
         "relax.broadcast_to", "relax.take", "relax.zeros", "relax.ones", "relax.zeros_like", "relax.ones_like")
ARITHMETIC = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
              "relax.divide": np.divide}


def helper_value(binding, values: dict[str, list[np.ndarray]], low_precision: bool = False) -> list[np.ndarray] | None:
    """The binding's flattened outputs from `values` (name -> flattened arrays), in float64; None when
    this module does not compute it. `low_precision`: instead, the op summing in its declared dtype
    (only `relax.matmul`; judge/classify.py's precision evidence)."""
    from tvm import relax

    value = binding.value
    specs = flatten_ty(binding.var.ty) or []
    try:
        if isinstance(value, relax.Tuple):
            out = []
            for item in value.fields:
                if not isinstance(item, relax.Var):
                    return None
                out.extend(values[item.name])
            return None if low_precision else out
        if isinstance(value, relax.Var):
            return None if low_precision else list(values[value.name])
        if isinstance(value, relax.TupleGetItem):
            return None if low_precision else tuple_item_values(value, values)
        if not isinstance(value, relax.Call) or len(specs) != 1:
            return None
        op = getattr(value.op, "name", "")
        args = [_argument(arg, values) for arg in value.args]
        if any(arg is _UNKNOWN for arg in args):
            return None
        arrays = [a for a in args if a is not None]
        if low_precision:
            if op != "relax.matmul" or len(arrays) != 2:
                return None
            low = recompute_relax(op, [to_torch(a) for a in arrays])
            return None if low is None else [to_numpy(low)]
        result = _compute(op, arrays, value.attrs, specs[0])
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError):
        return None
    return None if result is None else [result]


_UNKNOWN = object()


def _argument(arg, values):
    from tvm import relax

    if isinstance(arg, relax.Var):
        field = values[arg.name]
        return field[0] if len(field) == 1 else _UNKNOWN
    if type(arg).__name__.endswith("Const") and hasattr(getattr(arg, "value", None), "numpy"):
        return arg.value.numpy()
    if type(arg).__name__ in ("ShapeExpr", "PrimValue", "DataTypeImm", "StringImm"):
        return None  # the output spec carries the shape
    return _UNKNOWN


def _float64(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    return array.astype(np.float64) if array.dtype.kind == "f" or array.dtype.name == "bfloat16" else array


def _compute(op: str, args: list[np.ndarray], attrs, spec) -> np.ndarray | None:
    shape = tuple(spec.shape)
    is_float = spec.dtype.startswith("float") or spec.dtype.startswith("bfloat")
    if op in ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"):
        return _float64(args[0]).reshape(shape)
    if op == "relax.permute_dims":
        axes = None if attrs.axes is None else [int(a) for a in attrs.axes]
        return np.transpose(_float64(args[0]), axes)
    if op == "relax.broadcast_to":
        return np.broadcast_to(_float64(args[0]), shape)
    if op == "relax.take":
        x, indices = args[0], args[1]
        axis = int(attrs.axis) if getattr(attrs, "axis", None) is not None else None
        if axis is None or indices.dtype.kind not in "iu" or (indices.size and (
                int(indices.min()) < 0 or int(indices.max()) >= x.shape[axis])):
            return None
        return np.take(_float64(x), indices, axis=axis)
    if op in ("relax.zeros", "relax.zeros_like", "relax.ones", "relax.ones_like"):
        fill = 1.0 if "ones" in op else 0.0
        return np.full(shape, fill, dtype=np.float64 if is_float else spec.dtype)
    if op in ARITHMETIC and len(args) == 2 and is_float:
        with np.errstate(all="ignore"):
            return ARITHMETIC[op](_float64(args[0]), _float64(args[1]))
    if op == "relax.matmul" and len(args) == 2 and is_float:
        import torch

        return to_numpy(torch.matmul(to_torch(_float64(args[0])), to_torch(_float64(args[1]))))
    if op == "relax.astype":
        x = _float64(args[0])
        if is_float:
            return x.astype(np.float64)
        return x.astype(spec.dtype) if x.dtype.kind != "f" or np.all(np.isfinite(x)) else None
    return None

