"""The noise-floor figures of one output, shared by the engine's judge and every repro.

`judge/noise_floor.py` holds the rule (its constants, why they are what they are); this module
computes what the rule needs from arrays, so that a repro judged by the noise floor (its float64
reference stored in data.npz) and the session that dumped it can never disagree. numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NOISE_BLOCK = 1 << 20  # elements per block: float64 temporaries stay small for any tensor
NOISE_RULE = ("an output passes when max |target - R| <= max(source_factor * max |source - R|, floor), R the "
              "float64 reference, floor = relative_floor * absmax(R), over finite defined elements, and the "
              "NaN/Inf pattern, the shape and the dtype match the source")


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


def noise_figures(target: np.ndarray, source: np.ndarray, reference: np.ndarray, source_factor: float,
                  relative_floor: float, undefined: np.ndarray | None = None) -> NoiseFigures:
    """source_err, target_err, the floor and the bound of one output (shapes must agree)."""
    figures = NoiseFigures()
    t, s, r = (np.asarray(a).reshape(-1) for a in (target, source, reference))
    u = np.asarray(undefined).reshape(-1) if undefined is not None else None
    with np.errstate(all="ignore"):
        for start in range(0, s.size, NOISE_BLOCK):
            stop = start + NOISE_BLOCK
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
    figures.floor = relative_floor * figures.scale
    figures.bound = max(source_factor * figures.source_err, figures.floor)
    if figures.target_err > figures.bound:  # how many elements are out, against the reference
        with np.errstate(all="ignore"):
            for start in range(0, s.size, NOISE_BLOCK):
                stop = start + NOISE_BLOCK
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
