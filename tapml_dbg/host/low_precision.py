"""Recompute an op the way a kernel that accumulates in its output's precision would: the `precision`
class's evidence (judge/classify.py).

torch sums float16 in float32 and rounds once; TVM 0.27's llvm legalizations of softmax, mean,
variance and matmul round to float16 at every step of the sum. Each function here takes the op's
real inputs (torch tensors) and returns the value of a sequential sum in the output dtype, every
product and addition rounded to it (as LLVM computes float16 arithmetic: widen, operate, round).
A bfloat16 matmul step is `acc + a * b` in float32, rounded to bfloat16 once (TVM 0.27's bf16
legalization widens the whole expression; measured bit exact against llvm's, docs/coverage.md "bf16").
Ops without a recipe, and reductions longer than `MAX_SEQUENTIAL`, give None: no evidence.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

MAX_SEQUENTIAL = 1 << 16  # terms of one sequential sum; longer ones are not recomputed (too slow)
LOW_PRECISION_DTYPES = ("float16", "bfloat16", "float32")


def recompute_aten(name: str, args: list, kwargs: dict):
    """The aten op `name` (`mean`, `_softmax`, `mm` ...) on `args`, summing in its output dtype; None without a recipe."""
    recipe = _ATEN.get(name)
    if recipe is None:
        return None
    try:
        with _one_thread():
            return recipe(*args, **kwargs)
    except (TypeError, ValueError, IndexError, RuntimeError):
        return None


def recompute_relax(op: str, args: list):
    """A Relax helper binding (`relax.matmul`) on `args` (torch tensors), summing in its dtype; None without a recipe."""
    if op == "relax.matmul" and len(args) == 2:
        with _one_thread():
            return _matmul(args[0], args[1])
    return None


@contextmanager
def _one_thread():
    """torch on one thread for these term-by-term loops: each step is a small elementwise op, and
    splitting it over threads costs more than it brings while the target workers keep the cores
    busy, as they do during a search (on idle cores more threads win; figures: docs/perf.md)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _low(tensor) -> bool:
    return str(tensor.dtype).replace("torch.", "") in LOW_PRECISION_DTYPES


def _sequential_sum(x, dims: list[int], keepdim: bool):
    """Sum over `dims` one term at a time, rounding to x's dtype after every addition."""
    import torch

    dims = sorted(d % x.dim() for d in dims) if dims else list(range(x.dim()))
    kept = [d for d in range(x.dim()) if d not in dims]
    terms = math.prod(x.shape[d] for d in dims)
    if terms > MAX_SEQUENTIAL:
        raise ValueError("too long to sum term by term")
    flat = x.permute(kept + dims).reshape([x.shape[d] for d in kept] + [terms])
    acc = torch.zeros(flat.shape[:-1], dtype=x.dtype)
    for i in range(terms):
        acc = acc + flat[..., i]
    if keepdim:
        acc = acc.reshape([1 if d in dims else x.shape[d] for d in range(x.dim())])
    return acc


def _dims(dim) -> list[int]:
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _sum(x, dim=None, keepdim=False, dtype=None):
    if not _low(x) or dtype is not None:
        raise ValueError("not a low-precision sum")
    return _sequential_sum(x, _dims(dim), keepdim)


def _mean(x, dim=None, keepdim=False, dtype=None):
    if not _low(x) or dtype is not None:
        raise ValueError("not a low-precision mean")
    dims = _dims(dim) or list(range(x.dim()))
    count = math.prod(x.shape[d] for d in dims)
    return _sequential_sum(x, dims, keepdim) / count


def _var(x, dim=None, *, correction=1, keepdim=False):
    if not _low(x):
        raise ValueError("not a low-precision variance")
    dims = _dims(dim) or list(range(x.dim()))
    count = math.prod(x.shape[d] for d in dims)
    mean = _sequential_sum(x, dims, True) / count
    centered = x - mean
    squares = _sequential_sum(centered * centered, dims, keepdim)
    return squares / max(count - (correction if correction is not None else 1), 1)


def _softmax(x, dim, half_to_float=False):
    import torch

    if not _low(x) or half_to_float:
        raise ValueError("not a low-precision softmax")
    shifted = x - x.amax(dim=dim, keepdim=True)
    exps = torch.exp(shifted)
    return exps / _sequential_sum(exps, [dim], True)


def _matmul(a, b):
    """a @ b with the k products summed one at a time in the operands' dtype (batched, broadcast)."""
    import torch

    if not _low(a) or a.dtype != b.dtype or a.dim() < 2 or b.dim() < 2:
        return None
    k = a.shape[-1]
    if k > MAX_SEQUENTIAL:
        return None
    # numpy's broadcast_shapes: torch's imports sympy on first use, which takes seconds (docs/perf.md)
    batch = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    acc = torch.zeros(batch + (a.shape[-2], b.shape[-1]), dtype=a.dtype)
    if a.dtype == torch.bfloat16:  # TVM legalizes bf16 math to float32: acc + a * b, rounded once a step
        wide_a, wide_b = a.float(), b.float()
        for i in range(k):
            acc = (acc.float() + wide_a[..., :, i:i + 1] * wide_b[..., i:i + 1, :]).to(a.dtype)
        return acc
    for i in range(k):
        acc = acc + a[..., :, i:i + 1] * b[..., i:i + 1, :]
    return acc


def _addmm(bias, a, b, *, beta=1, alpha=1):
    product = _matmul(a, b)
    if product is None or beta != 1 or alpha != 1:
        raise ValueError("no low-precision recipe")
    return bias + product


_ATEN = {
    "sum": _sum, "mean": _mean, "var": _var, "_softmax": _softmax,
    "mm": lambda a, b: _matmul(a, b), "bmm": lambda a, b: _matmul(a, b), "addmm": _addmm,
}
