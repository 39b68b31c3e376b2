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

from dataclasses import asdict, dataclass, field

import numpy as np

from tapml_dbg.portable.noise import NoiseFigures, ratio_text  # noqa: F401 (the judge's names for them)
from tapml_dbg.portable.noise import noise_figures as portable_noise_figures

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


def noise_figures(target: np.ndarray, source: np.ndarray, reference: np.ndarray, dtype: str,
                  rule: NoiseFloor, propagated: bool = False, undefined: np.ndarray | None = None) -> NoiseFigures:
    """The figures of one output under `rule` (computed by portable/noise.py, as a repro computes them)."""
    return portable_noise_figures(target, source, reference, rule.source_factor,
                                  rule.relative_floor(dtype, propagated), undefined)

