"""Metrics between a target value and the recorded source value, and the tolerance policy.

The default policy is per dtype and scale-relative: an output passes when
`max_abs_err <= atol + rtol * absmax(source)` and the NaN/Inf pattern, shape and dtype match.
Scale-relative (not element-wise) rtol keeps reduction-order noise on near-zero elements from
raising false alarms, while a 0.1% error on a kernel's whole output is still caught in fp32.
Propagated verdicts get a looser rtol (`propagated_factor`) because fp noise legitimately
accumulates along a chain of ops.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from tapml_dbg.portable import compare as portable_compare
from tapml_dbg.portable import dtype_name  # noqa: F401  (re-exported: one spelling of dtypes)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


# Defaults, documented in docs/tolerance.md. fp32: TVM and torch reduce in different orders,
# giving ~1e-6 relative noise; 1e-4 leaves two orders of margin and still catches 1e-3 faults.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-9, atol=1e-12),
    "float32": Tolerance(rtol=1e-4, atol=1e-6),
    "float16": Tolerance(rtol=1e-2, atol=1e-3),  # one fp16 ulp is ~1e-3 relative
    "bfloat16": Tolerance(rtol=4e-2, atol=1e-2),  # one bf16 ulp is ~8e-3 relative
}
EXACT = Tolerance(rtol=0.0, atol=0.0)  # ints and bools must match exactly
DEFAULT_PROPAGATED_FACTOR = 10.0


@dataclass
class TolerancePolicy:
    """Per-dtype tolerances, per-op overrides, and the propagated loosening factor."""

    by_dtype: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    by_op: dict[str, Tolerance] = field(default_factory=dict)
    propagated_factor: float = DEFAULT_PROPAGATED_FACTOR

    def for_value(self, dtype: str, op: str | None = None, propagated: bool = False) -> Tolerance:
        tol = self.by_op.get(op) if op else None
        if tol is None:
            tol = self.by_dtype.get(dtype, EXACT if not _is_float(dtype) else self.by_dtype["float32"])
        if propagated and _is_float(dtype):
            tol = replace(tol, rtol=tol.rtol * self.propagated_factor, atol=tol.atol * self.propagated_factor)
        return tol

    def to_json(self) -> dict:
        return {"by_dtype": {k: asdict(v) for k, v in self.by_dtype.items()},
                "by_op": {k: asdict(v) for k, v in self.by_op.items()},
                "propagated_factor": self.propagated_factor}


@dataclass
class Metrics:
    """Comparison of one output tensor."""

    max_abs_err: float = 0.0
    max_rel_err: float = 0.0  # element-wise, over elements with |source| > atol
    scale_rel_err: float = 0.0  # max_abs_err / absmax(source): what rtol is checked against
    cosine: float = 1.0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    shape_mismatch: str = ""
    dtype_mismatch: str = ""
    mismatched: int = 0  # elements outside tolerance
    numel: int = 0
    passed: bool = True
    rtol: float = 0.0
    atol: float = 0.0

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}

    def summary(self) -> str:
        return metrics_text(self)


def metrics_text(m: Metrics, compact: bool = False) -> str:
    """The one wording of a comparison: `compact` for a table cell, else the summary repros and the UI print.

    A shape or dtype mismatch is the whole story; otherwise the errors, then any NaN/Inf pattern
    mismatch. (`portable.format_metrics` words the same figures inside a repro, which
    cannot import this package.)
    """
    if m.shape_mismatch:
        return f"shape {m.shape_mismatch}"
    if m.dtype_mismatch:
        return f"dtype {m.dtype_mismatch}"
    if compact:
        text = f"rel={m.scale_rel_err:.1e}"
    else:
        text = f"max_abs={m.max_abs_err:.3g} rel={m.scale_rel_err:.3g} cos={m.cosine:.6f}"
    if m.nan_mismatch:
        text += f" nan!={m.nan_mismatch}"
    if m.inf_mismatch:
        text += f" inf!={m.inf_mismatch}"
    return text


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def compare_arrays(target: np.ndarray, source: np.ndarray, tol: Tolerance) -> Metrics:
    """Compare one target output with its recorded source value under `tol`.

    The rule itself lives in `tapml_dbg.portable`, which repros copy verbatim, so a repro and
    the engine can never judge the same values differently.
    """
    result = portable_compare(target, source, tol.rtol, tol.atol)
    return Metrics(**{name: result[name] for name in Metrics.__dataclass_fields__})


def worst(metrics: list[Metrics]) -> Metrics:
    """The failing (or else the largest-error) output of a multi-output op."""
    failing = [m for m in metrics if not m.passed]
    pool = failing or metrics
    return max(pool, key=lambda m: m.scale_rel_err if math.isfinite(m.scale_rel_err) else math.inf)  # NaN, inf: worst
