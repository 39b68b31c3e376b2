"""The screen of a tolerance policy: what the search checks values against before it asks for a
verdict. The check itself is numpy only (`tapml_dbg.portable.screen`), so the target worker runs it
where the values are, and only values it cannot clear come back."""

from __future__ import annotations

from tapml_dbg.judge.compare import PolicyKind, TolerancePolicy
from tapml_dbg.portable.screen import ScreenRule, clearly_passes  # noqa: F401 (the judge's names for them)


def rule_for(policy: TolerancePolicy, propagated: bool) -> ScreenRule:
    """The screen of a `judge.compare.TolerancePolicy` in one mode (per-op tolerances are not in
    it: ops with one are left to the full verdict, see `Verdicts.unscreened`)."""
    fixed = {}
    for dtype in policy.by_dtype:
        tol = policy.for_value(dtype, None, propagated)
        fixed[dtype] = (tol.rtol, tol.atol)
    floors = {}
    if policy.kind == PolicyKind.NOISE_FLOOR:
        floors = {dtype: policy.noise.relative_floor(dtype, propagated) for dtype in policy.by_dtype}
    return ScreenRule(fixed, floors, policy.noise.source_factor)
