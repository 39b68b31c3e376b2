"""The noise-floor rule: the target's error is judged against the source's own error, not a fixed rtol.

For one float output, with R the float64 reference (the op re-executed in float64 by the source
runner, on the same recorded inputs for an isolated verdict; the whole model run in float64 for
a propagated one), S the source's recorded value and T the target's:

    source_err = max |S - R|        target_err = max |T - R|         (finite, defined elements)
    floor      = (ulp_factor * eps(dtype) + accumulation_factor * eps(accumulation dtype)) * absmax(R)
    bound      = max(source_factor * source_err, floor)     (the floor x propagated_factor when propagated)

and the output passes when `target_err <= bound` and its NaN/Inf pattern, shape and dtype match
the source's. The verdict reports `target_err / source_err` ("target 4100x the source's own
error"). The accumulation term is the error of a legitimate kernel that sums in float32 (at
least) in another order than torch; an op that rounds to float16 at every step of a long sum is
far above it. docs/tolerance.md says why each constant is what it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

BLOCK = 1 << 20  # elements per block: float64 temporaries stay small for any tensor

# machine epsilon (one ulp at 1.0) of each float dtype
EPS = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7,
       "float8_e4m3fn": 2.0 ** -3, "float8_e5m2": 2.0 ** -2}
# the narrowest accumulation a correct kernel may use for an output of this dtype
ACCUMULATION_DTYPE = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32",
                      "float8_e4m3fn": "float32", "float8_e5m2": "float32"}

# Defaults, calibrated on the clean examples and the clean zoo (docs/tolerance.md "The constants").
DEFAULT_SOURCE_FACTOR = 16.0
DEFAULT_ULP_FACTOR = 4.0
DEFAULT_ACCUMULATION_FACTOR = 256.0
DEFAULT_PROPAGATED_FLOOR_FACTOR = 10.0


@dataclass(frozen=True)
class NoiseFloor:
    """The constants of the noise-floor rule (see the module docstring)."""

    source_factor: float = DEFAULT_SOURCE_FACTOR
    ulp_factor: float = DEFAULT_ULP_FACTOR
    accumulation_factor: float = DEFAULT_ACCUMULATION_FACTOR
    propagated_factor: float = DEFAULT_PROPAGATED_FLOOR_FACTOR

    def relative_floor(self, dtype: str, propagated: bool = False) -> float:
        """The floor as a fraction of the output's scale."""
        eps = EPS.get(dtype, EPS["float32"])
        acc = EPS[ACCUMULATION_DTYPE.get(dtype, "float32")]
        floor = self.ulp_factor * eps + self.accumulation_factor * acc
        return floor * (self.propagated_factor if propagated else 1.0)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Reference:
    """What one op's outputs are measured against besides the recorded source value.

    `values`: the float64 reference of each output (None: none for that output); `undefined`:
    per output, a bool mask of uninitialised elements (None: every element is defined); `note`:
    why there is no float64 reference (the fixed policy then judges); `undefined_op`: the whole
    value is uninitialised memory (not judged at all).
    """

    values: list = field(default_factory=list)
    undefined: list = field(default_factory=list)
    note: str = ""
    undefined_op: bool = False

    def value(self, k: int):
        return self.values[k] if k < len(self.values) else None

    def mask(self, k: int):
        return self.undefined[k] if k < len(self.undefined) else None


@dataclass
class NoiseFigures:
    """The noise-floor figures of one output."""

    source_err: float = 0.0
    target_err: float = 0.0
    scale: float = 0.0
    floor: float = 0.0
    bound: float = 0.0
    mismatched: int = 0  # elements farther than the bound from the reference

    @property
    def ratio(self) -> float:
        """target_err / source_err: how many times the source's own error the target is off by."""
        if self.source_err > 0:
            return self.target_err / self.source_err
        return 0.0 if self.target_err == 0 else math.inf

    @property
    def passed(self) -> bool:
        return self.target_err <= self.bound


def noise_figures(target: np.ndarray, source: np.ndarray, reference: np.ndarray, dtype: str,
                  rule: NoiseFloor, propagated: bool = False, undefined: np.ndarray | None = None) -> NoiseFigures:
    """source_err, target_err, the floor and the bound of one output (shapes must agree)."""
    figures = NoiseFigures()
    t, s, r = (np.asarray(a).reshape(-1) for a in (target, source, reference))
    u = np.asarray(undefined).reshape(-1) if undefined is not None else None
    with np.errstate(all="ignore"):
        for start in range(0, s.size, BLOCK):
            stop = start + BLOCK
            t64, s64, r64 = (a[start:stop].astype(np.float64) for a in (t, s, r))
            keep = np.isfinite(s64) & np.isfinite(r64)
            if u is not None:
                keep &= ~u[start:stop]
            if not np.any(keep):
                continue
            figures.scale = max(figures.scale, float(np.max(np.abs(r64[keep]))))
            figures.source_err = max(figures.source_err, float(np.max(np.abs(s64[keep] - r64[keep]))))
            both = keep & np.isfinite(t64)
            if np.any(both):
                figures.target_err = max(figures.target_err, float(np.max(np.abs(t64[both] - r64[both]))))
    figures.floor = rule.relative_floor(dtype, propagated) * figures.scale
    figures.bound = max(rule.source_factor * figures.source_err, figures.floor)
    if figures.target_err > figures.bound:  # how many elements are out, against the reference
        with np.errstate(all="ignore"):
            for start in range(0, s.size, BLOCK):
                stop = start + BLOCK
                t64, r64 = t[start:stop].astype(np.float64), r[start:stop].astype(np.float64)
                out = np.abs(t64 - r64) > figures.bound
                if u is not None:
                    out &= ~u[start:stop]
                figures.mismatched += int(np.count_nonzero(out))
    return figures


def ratio_text(figures: NoiseFigures) -> str:
    """"target 4100x the source's own error" (or what stands in for it when the source is exact)."""
    ratio = figures.ratio
    if math.isinf(ratio):
        return "the source is exact here; the target is not"
    return f"target {ratio:.3g}x the source's own error"
