"""Helper ops computed on the host: the source's value for bindings torch has no node for.

A torch source has no value of its own for a helper binding (the matmul inside an `addmm`, the
index cast inside an `embedding`): the recorder must compute it from recorded inputs. Doing
that with TVM costs a compile per helper and, for a matmul, an unscheduled kernel (figures:
docs/perf.md). Worse, a reference computed by the compiler under test hides
that compiler's bugs (TVM 0.27's llvm matmul accumulates fp16 in fp16: 2% off at k=4096). Here:

- ops that only move bits (reshape, permute_dims, expand_dims, squeeze, flatten, broadcast_to,
  take with in-range indices, zeros/ones, tuple, get_item, alias) are computed by numpy; they
  cannot change a value;
- elementwise arithmetic (add, subtract, multiply, divide, astype) is correctly rounded in
  IEEE arithmetic, so numpy gives the value any backend must give. The first op of each kind
  (op, input dtypes, output dtype) in a recording is *also* computed by tvm:llvm and compared
  bit for bit; on any difference that kind is computed by TVM for the rest of the recording
  (and the value TVM gave is the one recorded);
- `matmul` is computed by torch, the source: its BLAS sums in its own order (and accumulates
  fp16 in fp32), so the value is the source's, not any backend's bit pattern; replay compares
  it within tolerance like every other op.

Anything else (convolutions, pooling, norms, unusual dtypes or attributes) returns None and the
recorder falls back to TVM. A helper that has no tensor output computes nothing, on the host; one
TVM cannot compute alone stops the recording with one line naming it (never a traceback).

`HOST_OPS_MODE` (env `TAPML_HOST_OPS`): `verify-first` (default, as above), `verify-all` (every
elementwise host value is checked against TVM: slow, for tests), `off` (TVM computes every
helper).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import numpy as np

from tapml_dbg import settings
from tapml_dbg.errors import ModelError
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.units import bindings_by_name, tuple_item_values
from tapml_dbg.record.tensors import to_numpy

HOST_OPS_MODES = ("verify-first", "verify-all", "off")
HOST_OPS_MODE = settings.value(settings.HOST_OPS)

MOVE_OPS = frozenset({"relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
                      "relax.flatten", "relax.broadcast_to", "relax.take", "relax.zeros_like",
                      "relax.ones_like", "relax.zeros", "relax.ones", "tuple", "get_item", "alias"})
ARITH_OPS = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.astype"})
SOURCE_OPS = frozenset({"relax.matmul"})  # the source (torch) computes these; never TVM's bits


class HostOps:
    """Compute helper ops on the host when exactly possible; verify arithmetic kinds against TVM."""

    def __init__(self, main, tvm_run: Callable[[OpInfo], list[np.ndarray]], mode: str | None = None):
        mode = mode or HOST_OPS_MODE
        if mode not in HOST_OPS_MODES:
            raise ValueError(f"{settings.HOST_OPS} must be one of {', '.join(HOST_OPS_MODES)}, not {mode!r}")
        self.mode = mode
        self.bindings = bindings_by_name(main)
        self.tvm_run = _named_failures(tvm_run)
        self.trusted: dict[tuple, bool] = {}  # kind -> host matched TVM on its first op
        self.counts: Counter = Counter()  # "host", "verified", "tvm", "mismatch"

    def compute(self, op: OpInfo, values: dict[str, list[np.ndarray]]) -> tuple[list[np.ndarray], bool]:
        """The op's flattened outputs and whether the host computed them (False: tvm:llvm did)."""
        host = None
        if not op.outputs:  # no tensor to compute (an empty tuple)
            self.counts["host"] += 1
            return [], True
        if self.mode != "off" and (op.relax_op in MOVE_OPS or op.relax_op in ARITH_OPS
                                   or op.relax_op in SOURCE_OPS):
            try:
                host = self._host(op, values)
            except (KeyError, ValueError, TypeError, IndexError, RuntimeError):
                host = None  # an input or attribute this code does not understand: TVM decides
        if host is None:
            self.counts["tvm"] += 1
            return self.tvm_run(op), False
        kind = (op.relax_op, tuple(str(a.dtype) for a in self._inputs(op, values)),
                tuple(spec.dtype for spec in op.outputs))
        check = op.relax_op not in SOURCE_OPS and (
            self.mode == "verify-all" or (op.relax_op in ARITH_OPS and kind not in self.trusted))
        if check:
            reference = self.tvm_run(op)
            same = _bit_equal(host, reference)
            self.trusted.setdefault(kind, same)
            if not same:
                self.trusted[kind] = False
                self.counts["mismatch"] += 1
                self.counts["tvm"] += 1
                return reference, False
            self.counts["verified"] += 1
        elif op.relax_op in ARITH_OPS and not self.trusted.get(kind, False):
            self.counts["tvm"] += 1
            return self.tvm_run(op), False
        self.counts["host"] += 1
        return host, True

    # ---- the host implementations --------------------------------------------------------
    def _inputs(self, op: OpInfo, values) -> list[np.ndarray]:
        arrays = []
        for name in op.inputs:
            arrays.extend(values[name])
        return arrays

    def _host(self, op: OpInfo, values) -> list[np.ndarray] | None:
        from tvm import relax

        value = self.bindings[op.name].value
        if op.relax_op == "tuple":
            out = []
            for item in value.fields:
                if not isinstance(item, relax.Var):
                    return None
                out.extend(values[item.name])
            return _checked(out, op)
        if op.relax_op == "alias":
            return _checked(list(values[value.name]), op)
        if op.relax_op == "get_item":
            return _checked(tuple_item_values(value, values), op)
        if not isinstance(value, relax.Call):
            return None
        args = []
        for arg in value.args:
            if isinstance(arg, relax.Var):
                field = values[arg.name]
                if len(field) != 1:
                    return None
                args.append(field[0])
            elif type(arg).__name__.endswith("Const") and hasattr(getattr(arg, "value", None), "numpy"):
                args.append(arg.value.numpy())  # a tensor constant (tvm.ir GenericConst in 0.27)
            elif type(arg).__name__ in ("ShapeExpr", "PrimValue", "DataTypeImm", "StringImm"):
                continue  # the output spec carries the shape
            else:
                return None
        if len(op.outputs) != 1:
            return None
        spec = op.outputs[0]
        result = _HOST[op.relax_op](args, value.attrs, spec.shape, _dtype(spec.dtype))
        return None if result is None else _checked([result], op)


def _named_failures(tvm_run: Callable[[OpInfo], list[np.ndarray]]) -> Callable[[OpInfo], list[np.ndarray]]:
    """`tvm_run` whose failures are one line naming the helper op (TVM's own errors are pages)."""
    def run(op: OpInfo) -> list[np.ndarray]:
        try:
            return tvm_run(op)
        except Exception as exc:
            text = str(exc).strip().splitlines()
            raise ModelError(f"cannot compute helper op {op.name} ({op.relax_op}, part of {op.op}) for the trace: "
                             f"tvm:llvm fails on it alone ({type(exc).__name__}: {text[0][:200] if text else ''}); "
                             "rewrite that part of the model or report it") from exc
    return run


def _checked(arrays: list[np.ndarray] | None, op: OpInfo) -> list[np.ndarray] | None:
    """The host result only when it has exactly the op's output shapes and dtypes."""
    if arrays is None or len(arrays) != len(op.outputs):
        return None
    for array, spec in zip(arrays, op.outputs):
        if tuple(array.shape) != tuple(spec.shape) or array.dtype != _dtype(spec.dtype):
            return None
    return arrays



def _dtype(name: str) -> np.dtype:
    if name == "bool":
        return np.dtype(np.bool_)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _bit_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype == np.bool_:
            if not np.array_equal(x, y):
                return False
        elif not np.array_equal(np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}"),
                                np.ascontiguousarray(y).view(f"u{y.dtype.itemsize}")):
            return False
    return True


# ---- one function per op: (args, attrs, out_shape, out_dtype) -> array | None -------------

def _reshape(args, attrs, shape, dtype):
    (x,) = args[:1]
    return x.reshape(shape) if x.dtype == dtype and x.size == math.prod(shape) else None


def _permute(args, attrs, shape, dtype):
    x = args[0]
    axes = None if attrs.axes is None else [int(a) for a in attrs.axes]
    return np.transpose(x, axes)


def _broadcast(args, attrs, shape, dtype):
    return np.broadcast_to(args[0], shape)


def _take(args, attrs, shape, dtype):
    x, indices = args[0], args[1]
    mode = str(getattr(attrs, "mode", "fast"))
    axis = getattr(attrs, "axis", None)
    if mode != "fast" or indices.dtype.kind not in "iu" or axis is None:
        return None
    axis = int(axis)
    size = x.shape[axis]
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= size):
        return None  # out-of-range indices: TVM's "fast" mode is undefined there; let TVM answer
    return np.take(x, indices, axis=axis)


def _fill(value):
    def fill(args, attrs, shape, dtype):
        return np.full(shape, value, dtype=dtype)
    return fill


def _matmul(args, attrs, shape, dtype):
    """torch.matmul, as the source computes it (batched, broadcast and 1-D operands included)."""
    import torch

    a, b = args[0], args[1]
    if a.dtype != dtype or b.dtype != dtype or dtype.kind not in "fiu" and dtype != _dtype("bfloat16"):
        return None
    if a.ndim == 0 or b.ndim == 0:
        return None
    out = to_numpy(torch.matmul(_to_torch(a), _to_torch(b)))
    return out if tuple(out.shape) == tuple(shape) else None


def _to_torch(array: np.ndarray):
    import torch

    if array.dtype == _dtype("bfloat16"):  # numpy's bfloat16 (ml_dtypes) is not torch's: share the bits
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def _binary(ufunc, kinds: str):
    def apply(args, attrs, shape, dtype):
        if len(args) != 2 or dtype.kind not in kinds:
            return None
        x, y = args
        if x.dtype != dtype or y.dtype != dtype:
            return None
        with np.errstate(all="ignore"):
            return ufunc(x, y, dtype=dtype)
    return apply


def _astype(args, attrs, shape, dtype):
    x = args[0]
    src, dst = x.dtype.kind, dtype.kind
    if dst == "b" or src not in "biuf" or dst not in "iuf":
        return None
    if src == "f" and dst in "iu":  # NaN / out-of-range casts are undefined in LLVM: leave to TVM
        if not np.all(np.isfinite(x)):
            return None
        info = np.iinfo(dtype)
        if x.size and (float(x.min()) <= info.min - 1 or float(x.max()) >= info.max + 1):
            return None
    with np.errstate(all="ignore"):
        return x.astype(dtype)


_HOST = {
    "relax.reshape": _reshape, "relax.expand_dims": _reshape, "relax.squeeze": _reshape,
    "relax.flatten": _reshape, "relax.permute_dims": _permute, "relax.broadcast_to": _broadcast,
    "relax.take": _take, "relax.zeros_like": _fill(0), "relax.zeros": _fill(0), "relax.ones_like": _fill(1),
    "relax.ones": _fill(1), "relax.matmul": _matmul, "relax.add": _binary(np.add, "fiu"),
    "relax.subtract": _binary(np.subtract, "fiu"), "relax.multiply": _binary(np.multiply, "fiu"),
    "relax.divide": _binary(np.divide, "f"), "relax.astype": _astype,
}
