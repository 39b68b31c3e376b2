"""Metrics between a target value and the recorded source value, and the tolerance policy.

Two policies (docs/tolerance.md). The default, `noise-floor`, judges the target's error against
a float64 reference of the op and the source's own error against it (`judge.noise_floor`); it
needs a trace with a source graph. The `fixed` policy, for traces without one (`--source tvm:*`,
v1.0/1.1 traces), for ops with no float64 reference and on request (`tol fixed`), is per dtype
and scale-relative: an output passes when `max_abs_err <= atol + rtol * absmax(source)` and the
NaN/Inf pattern, shape and dtype match. Scale-relative (not element-wise) rtol keeps
reduction-order noise on near-zero elements from raising false alarms. Propagated verdicts get a
looser rtol (`propagated_factor`) because fp noise legitimately accumulates along a chain of ops.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum

import numpy as np

from tapml_dbg.judge.noise_floor import NoiseFigures, NoiseFloor, noise_figures
from tapml_dbg.judge.noise_floor import ratio_text as figures_ratio_text
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


class PolicyKind(StrEnum):
    """Which rule judges a float output."""

    NOISE_FLOOR = "noise-floor"  # against the op's float64 reference and the source's own error
    FIXED = "fixed"  # against the recorded source value with a per-dtype rtol / atol
    EXACT = "exact"  # integers and bools


@dataclass
class TolerancePolicy:
    """The rule (noise floor by default), per-dtype tolerances of the fixed rule, per-op overrides
    (an op with one is judged by the fixed rule), and the propagated loosening factor."""

    by_dtype: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    by_op: dict[str, Tolerance] = field(default_factory=dict)
    propagated_factor: float = DEFAULT_PROPAGATED_FACTOR
    kind: PolicyKind = PolicyKind.NOISE_FLOOR
    noise: NoiseFloor = field(default_factory=NoiseFloor)

    def for_value(self, dtype: str, op: str | None = None, propagated: bool = False) -> Tolerance:
        tol = self.by_op.get(op) if op else None
        if tol is None:
            tol = self.by_dtype.get(dtype, EXACT if not _is_float(dtype) else self.by_dtype["float32"])
        if propagated and _is_float(dtype):
            tol = replace(tol, rtol=tol.rtol * self.propagated_factor, atol=tol.atol * self.propagated_factor)
        return tol

    def ignores(self, setting: str, references: bool = True) -> bool:
        """Whether the active rule ignores a setting of the fixed rule: `"by_dtype"` (a dtype's rtol /
        atol) or `"propagated_factor"`. The noise floor judges every float output that has a float64
        reference against it (with its own propagated floor), so it ignores both; `references`: the
        trace has them (a source graph), else the fixed rule judges every op whatever the kind.
        (Per-op overrides are never ignored: an op with one is judged by the fixed rule.)"""
        return setting in ("by_dtype", "propagated_factor") and self.kind == PolicyKind.NOISE_FLOOR and references

    def to_json(self) -> dict:
        return {"kind": str(self.kind), "noise": self.noise.to_json(),
                "by_dtype": {k: asdict(v) for k, v in self.by_dtype.items()},
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
    policy: str = PolicyKind.FIXED  # the rule that set `passed`
    # the noise-floor figures (None under the fixed rule): errors against the float64 reference
    source_err: float | None = None
    target_err: float | None = None
    noise_bound: float | None = None
    ratio: float | None = None  # target_err / source_err

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
        if m.policy == PolicyKind.NOISE_FLOOR and m.ratio is not None and not m.passed:
            text += f" ({ratio_text(m.source_err, m.target_err)})"
    if m.nan_mismatch:
        text += f" nan!={m.nan_mismatch}"
    if m.inf_mismatch:
        text += f" inf!={m.inf_mismatch}"
    return text


def ratio_text(source_err: float | None, target_err: float | None) -> str:
    """"target 4100x the source's own error"."""
    return figures_ratio_text(NoiseFigures(source_err=source_err or 0.0, target_err=target_err or 0.0))


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype.startswith("bfloat")


def compare_arrays(target: np.ndarray, source: np.ndarray, tol: Tolerance) -> Metrics:
    """Compare one target output with its recorded source value under `tol`.

    The rule itself lives in `tapml_dbg.portable`, which repros copy verbatim, so a repro and
    the engine can never judge the same values differently.
    """
    result = portable_compare(target, source, tol.rtol, tol.atol)
    return Metrics(**{name: result[name] for name in Metrics.__dataclass_fields__ if name in result})


def compare_output(target: np.ndarray, source: np.ndarray, policy: TolerancePolicy, dtype: str,
                   op: str | None = None, propagated: bool = False, reference: np.ndarray | None = None,
                   undefined: np.ndarray | None = None) -> Metrics:
    """One output judged by the policy: the noise floor when a float64 `reference` is given (and the
    policy and the op allow it), else the fixed rule at `dtype`'s tolerance. Elements marked in
    `undefined` (uninitialised memory in the source) are left out of every figure."""
    tol = policy.for_value(dtype, op, propagated)
    target, source = np.asarray(target), np.asarray(source)
    shapes_agree = tuple(target.shape) == tuple(source.shape)
    if undefined is not None and shapes_agree and tuple(np.shape(undefined)) == tuple(source.shape):
        target, source = _zeroed(target, undefined), _zeroed(source, undefined)
        reference = _zeroed(reference, undefined) if reference is not None else None
    else:
        undefined = None
    if shapes_agree and dtype_name(target) != dtype_name(source):  # a type verdict: the values as evidence
        metrics = compare_arrays(_float64(target), _float64(source), tol)
        metrics.dtype_mismatch = f"{dtype_name(target)} vs source {dtype_name(source)}"
        metrics.passed = False
        return metrics
    metrics = compare_arrays(target, source, tol)
    if not _is_float(dtype_name(source)):
        metrics.policy = PolicyKind.EXACT
        return metrics
    if reference is None or policy.kind != PolicyKind.NOISE_FLOOR or (op and op in policy.by_op) \
            or metrics.shape_mismatch or tuple(np.shape(reference)) != tuple(source.shape):
        return metrics
    figures = noise_figures(target, source, reference, dtype_name(source), policy.noise, propagated, undefined)
    metrics.policy = PolicyKind.NOISE_FLOOR
    metrics.source_err, metrics.target_err = figures.source_err, figures.target_err
    metrics.noise_bound, metrics.ratio = figures.bound, figures.ratio
    metrics.mismatched = figures.mismatched + metrics.nan_mismatch + metrics.inf_mismatch
    metrics.passed = figures.passed and not metrics.nan_mismatch and not metrics.inf_mismatch
    return metrics


def _zeroed(array: np.ndarray, undefined: np.ndarray) -> np.ndarray:
    return np.where(undefined, np.zeros((), dtype=array.dtype), array)


def _float64(array: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(array).astype(np.float64)


def worst(metrics: list[Metrics]) -> Metrics:
    """The failing (or else the largest-error) output of a multi-output op."""
    failing = [m for m in metrics if not m.passed]
    pool = failing or metrics
    return max(pool, key=lambda m: m.scale_rel_err if math.isfinite(m.scale_rel_err) else math.inf)  # NaN, inf: worst
