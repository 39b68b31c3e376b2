"""The one compare rule: a target output against its recorded source value.

The engine's `judge.compare` calls `compare` too, so a repro and a session can never judge the
same values differently. Memory stays bounded for any tensor size: figures are accumulated over
blocks of COMPARE_BLOCK elements.
"""

from __future__ import annotations

import math

import numpy as np

from .codec import dtype_name

COMPARE_RULE = ("an output passes when max_abs_err <= atol + rtol * absmax(source), both over finite "
                "elements, and the NaN/Inf pattern, the shape and the dtype match the source; integer "
                "and bool outputs must match exactly; outputs nothing in the model reads are reported, "
                "not judged")
COMPARE_BLOCK = 1 << 20  # elements per block: the float64 temporaries stay ~10 x 8 MiB for any tensor
TINY_MAGNITUDE = 1e-30  # sources smaller than this (or than atol) do not enter the relative error


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def _blocks(*flat: np.ndarray):
    """Aligned slices of 1-D arrays, COMPARE_BLOCK elements at a time: float64 copies of a block stay
    small, while a 40M-element tensor converted in one go needs GiBs."""
    for start in range(0, flat[0].size, COMPARE_BLOCK):
        yield tuple(array[start:start + COMPARE_BLOCK] for array in flat)


class _Cosine:
    """Cosine similarity accumulated over blocks."""

    def __init__(self):
        self.dot = self.aa = self.bb = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        self.dot += float(np.dot(a, b))
        self.aa += float(np.dot(a, a))
        self.bb += float(np.dot(b, b))

    def value(self) -> float:
        na, nb = math.sqrt(self.aa), math.sqrt(self.bb)
        if na == 0 and nb == 0:
            return 1.0
        if na == 0 or nb == 0:
            return 0.0
        return self.dot / (na * nb)


def compare(target: np.ndarray, source: np.ndarray, rtol: float, atol: float) -> dict:
    """Metrics of one target output against its recorded source value (the rule in COMPARE_RULE)."""
    with np.errstate(all="ignore"):
        return _compare(np.asarray(target), np.asarray(source), float(rtol), float(atol))


def _compare(target: np.ndarray, source: np.ndarray, rtol: float, atol: float) -> dict:
    m = {"max_abs_err": 0.0, "max_rel_err": 0.0, "scale_rel_err": 0.0, "cosine": 1.0, "nan_mismatch": 0,
         "inf_mismatch": 0, "shape_mismatch": "", "dtype_mismatch": "", "mismatched": 0,
         "numel": int(source.size), "passed": True, "rtol": rtol, "atol": atol, "bound": atol, "absmax": 0.0}
    if tuple(target.shape) != tuple(source.shape):
        m["shape_mismatch"] = f"{tuple(target.shape)} vs source {tuple(source.shape)}"
        m["passed"] = False
        return m
    if dtype_name(target) != dtype_name(source):
        m["dtype_mismatch"] = f"{dtype_name(target)} vs source {dtype_name(source)}"
        m["passed"] = False
        return m
    if source.size == 0:
        return m
    target, source = target.reshape(-1), source.reshape(-1)  # one copy at most, if not contiguous
    if not _is_float(dtype_name(source)):
        return _compare_exact(target, source, m)
    scale = 0.0  # pass 1: the source's largest finite magnitude sets the bound
    native = source.dtype.kind == "f"  # abs and max are exact in numpy's own float types: no float64 copy
    for (s_block,) in _blocks(source):
        block = s_block if native else s_block.astype(np.float64)
        scale = max(scale, float(np.max(np.abs(np.where(np.isfinite(block), block, 0)))))
    bound = atol + rtol * scale
    if _same_bits(target, source):  # a move, a copy, an exact kernel: every error figure is zero
        m.update(absmax=scale, bound=bound, scale_rel_err=0.0)
        return m
    cosine = _Cosine()
    for t_block, s_block in _blocks(target, source):  # pass 2: every other figure
        t64, s64 = t_block.astype(np.float64), s_block.astype(np.float64)
        t_nan, s_nan = np.isnan(t64), np.isnan(s64)
        t_inf, s_inf = np.isinf(t64), np.isinf(s64)
        m["nan_mismatch"] += int(np.count_nonzero(t_nan != s_nan))
        same_inf = (t_inf & s_inf) & (np.sign(t64) == np.sign(s64))
        m["inf_mismatch"] += int(np.count_nonzero((t_inf | s_inf) & ~same_inf & ~(t_nan | s_nan)))
        finite = np.isfinite(t64) & np.isfinite(s64)
        diff = np.abs(np.where(finite, t64 - s64, 0.0))
        m["max_abs_err"] = max(m["max_abs_err"], float(np.max(diff)))
        significant = (np.abs(s64) > max(atol, TINY_MAGNITUDE)) & finite
        if np.any(significant):
            m["max_rel_err"] = max(m["max_rel_err"], float(np.max(diff[significant] / np.abs(s64[significant]))))
        cosine.add(np.where(finite, t64, 0.0), np.where(finite, s64, 0.0))
        m["mismatched"] += int(np.count_nonzero(diff > bound))
    m["absmax"] = scale
    m["scale_rel_err"] = m["max_abs_err"] / scale if scale > 0 else (0.0 if m["max_abs_err"] == 0 else math.inf)
    m["cosine"] = cosine.value()
    if m["nan_mismatch"] or m["inf_mismatch"]:  # finite-only figures would look perfect
        m["cosine"] = math.nan
        m["max_abs_err"] = math.inf
    m["bound"] = bound
    m["mismatched"] += m["nan_mismatch"] + m["inf_mismatch"]
    m["passed"] = m["max_abs_err"] <= bound and not m["nan_mismatch"] and not m["inf_mismatch"]
    return m


def _same_bits(target: np.ndarray, source: np.ndarray) -> bool:
    """Whether two flat arrays of one dtype hold the same bytes (NaNs in the same places included):
    one cheap pass that spares the float64 passes for the many ops a target computes exactly (a
    large model's weight transposes and reshapes are most of its elements)."""
    if target.dtype.itemsize != source.dtype.itemsize:
        return False
    return bool(np.array_equal(np.ascontiguousarray(target).view(np.uint8), np.ascontiguousarray(source).view(np.uint8)))


def _compare_exact(target: np.ndarray, source: np.ndarray, m: dict) -> dict:
    """Integers and bools must match exactly; the float figures say by how much they do not."""
    m["bound"] = 0.0
    m["mismatched"] = int(np.count_nonzero(target != source))
    if m["mismatched"]:
        scale, cosine = 1.0, _Cosine()
        for t_block, s_block in _blocks(target, source):
            t64, s64 = t_block.astype(np.float64), s_block.astype(np.float64)
            m["max_abs_err"] = max(m["max_abs_err"], float(np.max(np.abs(t64 - s64))))
            scale = max(scale, float(np.max(np.abs(s64))))
            cosine.add(t64, s64)
        m["scale_rel_err"] = m["max_abs_err"] / scale
        m["cosine"] = cosine.value()
    m["passed"] = m["mismatched"] == 0
    return m


def format_metrics(m: dict) -> str:
    """One output's metrics as a repro prints them (the bound spelled out, so a reader can check it)."""
    if m.get("shape_mismatch"):
        return f"shape {m['shape_mismatch']}"
    if m.get("dtype_mismatch"):
        return f"dtype {m['dtype_mismatch']}"
    if m.get("noise_bound") is not None:  # the noise floor (portable/noise.py), as the session judged it
        text = (f"|target - float64 reference|={_g(m['target_err'])} (bound {_g(m['noise_bound'])}: the noise "
                f"floor; the source's own error {_g(m['source_err'])}; {m.get('ratio_text', '')}) "
                f"max_abs_err vs source={_g(m['max_abs_err'])} scale_rel={_g(m['scale_rel_err'])} "
                f"cos={m['cosine']:.6f}")
    else:
        text = (f"max_abs_err={_g(m['max_abs_err'])} (bound {_g(m['bound'])} = atol {_g(m['atol'])} + rtol "
                f"{_g(m['rtol'])} * absmax {_g(m['absmax'])}) scale_rel={_g(m['scale_rel_err'])} "
                f"max_rel={_g(m['max_rel_err'])} cos={m['cosine']:.6f}")
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        text += f" nan_mismatch={m['nan_mismatch']} inf_mismatch={m['inf_mismatch']}"
    return text + f" mismatched={m['mismatched']}/{m['numel']}"


def _g(value) -> str:
    return "nan" if value is None else f"{value:.3g}"
