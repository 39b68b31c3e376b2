"""A sound shortcut for the common case: values that pass whichever rule judges them, told cheaply.

Judging one op costs a float64 reference (the op, or the whole model, re-run in float64 by the
source) and the compare rule's float64 passes. Most values a search looks at are plainly right, so
the search first asks `clearly_passes`: from the target value T and the recorded source value S
alone, in float32 arithmetic with a margin, it proves that both rules would pass the value:

- the fixed rule (judge/compare.py): max |T - S| <= atol + rtol * absmax(S);
- the noise floor (judge/noise_floor.py), whatever the float64 reference R turns out to be:
  with e = max |S - R| and d = max |T - S|, max |T - R| <= d + e, and the bound is
  max(F * e, f * absmax(R)) >= max(F * e, f * (absmax(S) - e)) for source factor F and relative
  floor f. For e >= d / (F - 1) the first term covers d + e; below it the second does when
  d * (1 + (1 + f) / (F - 1)) <= f * absmax(S). (R is taken finite wherever S is: float64 has the
  wider range.)

Integers and bools pass when equal; NaN and Inf must sit where the source has the same ones (the
rules leave them out of every figure). Anything else (another shape or dtype, a rule the screen
does not know) is not clear: the full verdict decides. A value the screen passes is never
one the full verdict fails, so the screen changes the cost of a search, not its answer; it makes
no verdict of its own (nothing it passes is shown as a verdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MARGIN = 2.0 ** -16  # relative slack for float32 rounding in d and absmax (~500 float32 ulps)
TINY = 2.0 ** -120  # absolute slack for subnormal differences


@dataclass(frozen=True)
class ScreenRule:
    """What the screen checks a value against, for one mode (isolated or propagated).

    `fixed`: dtype -> (rtol, atol) of the fixed rule, already loosened for the mode; `floors`:
    dtype -> the noise floor's relative floor for the mode (empty: the noise floor never judges);
    `source_factor`: the noise floor's F.
    """

    fixed: dict[str, tuple[float, float]] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)
    source_factor: float = 0.0


def clearly_passes(targets: list, sources: list, rule: ScreenRule) -> bool:
    """Whether every output surely passes the full verdict (False: maybe not, judge it)."""
    return clearly_passes_each(targets, sources, (rule,))[0]


def clearly_passes_each(targets: list, sources: list, rules) -> list[bool]:
    """`clearly_passes` for each of `rules` (a chain's value against its own rule and the isolated
    one), the value measured once."""
    if len(targets) != len(sources):
        return [False] * len(rules)
    passed = [True] * len(rules)
    for t, s in zip(targets, sources):
        measured = _measure(np.asarray(t), np.asarray(s))
        passed = [ok and _passes(measured, rule) for ok, rule in zip(passed, rules)]
        if not any(passed):
            break
    return passed


def _measure(target: np.ndarray, source: np.ndarray):
    """What the rules look at: True or False when settled whatever the rule, else (d, scale, dtype),
    or (0.0, None, dtype) for the source's own value."""
    if target.shape != source.shape or target.dtype != source.dtype:
        return False
    if source.size == 0:
        return True
    kind = source.dtype.kind
    if kind in "iub":
        return bool(np.array_equal(target, source))
    if kind != "f" and source.dtype.name != "bfloat16":
        return False
    dtype = source.dtype.name
    with np.errstate(all="ignore"):
        t = target.astype(np.float32, copy=False)
        s = source.astype(np.float32, copy=False)
        finite = np.isfinite(s)
        if not finite.all():  # NaN/Inf (a -inf attention mask): the same pattern, then the finite rest
            if not _same_non_finite(t, s, finite):
                return False
            t, s = t[finite], s[finite]
            if s.size == 0:
                return True
        elif not np.isfinite(t).all():
            return False
        exact = float(np.max(np.abs(t - s)))
        scale = float(np.max(np.abs(s))) * (1 - MARGIN)
    return (0.0, None, dtype) if exact == 0.0 else (exact * (1 + MARGIN) + TINY, scale, dtype)


def _passes(measured, rule: ScreenRule) -> bool:
    if isinstance(measured, bool):
        return measured
    d, scale, dtype = measured
    if dtype not in rule.fixed:
        return False
    if scale is None:  # the source's own value: its own error is within the noise floor's bound
        return not rule.floors or rule.source_factor >= 1.0
    rtol, atol = rule.fixed[dtype]
    if d > atol + rtol * scale:
        return False
    if not rule.floors:
        return True
    floor = rule.floors.get(dtype)
    if floor is None or rule.source_factor <= 1.0:
        return False
    return d * (1.0 + (1.0 + floor) / (rule.source_factor - 1.0)) <= floor * scale


def _same_non_finite(t: np.ndarray, s: np.ndarray, finite: np.ndarray) -> bool:
    """T is NaN where S is, the same infinity where S is one, finite elsewhere."""
    if not np.array_equal(np.isfinite(t), finite):
        return False
    t_odd, s_odd = t[~finite], s[~finite]
    return bool(np.array_equal(np.isnan(t_odd), np.isnan(s_odd)) and
                np.array_equal(t_odd[~np.isnan(t_odd)], s_odd[~np.isnan(s_odd)]))

