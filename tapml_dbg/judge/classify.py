"""What kind of wrong a failing verdict is, and the evidence, in the order the checks are made:

1. `type`: an output's declared dtype or shape differs from the source's (a frontend divergence),
   or an input had to be cast at replay time because its producer's import changed its type;
2. `nondeterministic`: a second run of the same unit on the target gave other bits (an
   out-of-bounds read, a race); only known when the engine ran it twice;
3. `nan/inf`: the target's NaN/Inf pattern differs from the source's;
4. `precision`: recomputing the op on the host while accumulating in the output's low precision
   (the engine's `host/low_precision.py`) lands much closer to the target than the float64
   reference does: the kernel is right but sums in too narrow a type;
5. `semantic`: none of the above: far outside any precision explanation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tapml_dbg.judge.compare import Metrics
from tapml_dbg.judge.verdict import WrongClass

# `precision` when the low-precision recomputation is at most this share of the target's error away
# from the target (the reference being the float64 value, or the source's where there is none)
PRECISION_EXPLAINED_SHARE = 0.5


@dataclass
class Evidence:
    """What the engine measured beyond the verdict itself, to tell the classes apart."""

    low_precision: list | None = None  # per output: the op recomputed accumulating in its dtype (or None)
    rerun: list | None = None  # the unit's outputs from a second run on the target


@dataclass
class Classified:
    wrong: WrongClass
    evidence: str


@dataclass
class Facts:
    """The static facts of one op's verdict: type changes of its outputs, inputs cast at replay."""

    type_changes: list = field(default_factory=list)  # trace.source_graph.TypeChange of judged outputs
    cast_inputs: list[str] = field(default_factory=list)  # "mul (float32 -> the declared int64)"


def classify(metrics: list[Metrics], outputs: list, source: list, references: list, facts: Facts,
             evidence: Evidence | Callable[[], Evidence] | None = None, live: list[int] | None = None) -> Classified:
    """The class of a failing verdict over `outputs` (its judged outputs are `live`, default all).
    `evidence` may be a function: it is called only when the static facts do not decide the class."""
    live = list(range(len(metrics))) if live is None else live
    if facts.type_changes:
        return Classified(WrongClass.TYPE, type_evidence(facts.type_changes))
    if facts.cast_inputs:
        return Classified(WrongClass.TYPE, "fed values the import changed the type of (cast at replay time): "
                          + ", ".join(facts.cast_inputs))
    evidence = (evidence() if callable(evidence) else evidence) or Evidence()  # measured only when needed
    if evidence.rerun is not None:
        differing = _differing(outputs, evidence.rerun)
        if differing:
            return Classified(WrongClass.NONDETERMINISTIC,
                              f"two runs of the same unit on the target differ at {differing} element(s): an "
                              "out-of-bounds read or a race")
    failing = [k for k in live if k < len(metrics) and not metrics[k].passed] or live
    for k in failing:
        m = metrics[k]
        if m.nan_mismatch or m.inf_mismatch:
            return Classified(WrongClass.NAN_INF, _nan_text(outputs[k], source[k]))
    if evidence.low_precision is not None:
        for k in failing:
            lowp = evidence.low_precision[k] if k < len(evidence.low_precision) else None
            explained = _explains(lowp, outputs[k], references[k] if k < len(references) else None, source[k])
            if explained:
                return Classified(WrongClass.PRECISION, explained)
    m = metrics[failing[0]]
    how = f"target {m.ratio:.3g}x the source's own error" if m.ratio is not None and math.isfinite(m.ratio) \
        else f"scale-relative error {m.scale_rel_err:.3g}"
    why = "no low-precision accumulation explains it" if evidence.low_precision is not None \
        else "no low-precision recomputation exists for this op"
    return Classified(WrongClass.SEMANTIC, f"{how}; {why}")


def type_evidence(changes: list) -> str:
    """The evidence of a `type` class: each output whose import changed its type, and how."""
    return "; ".join(f"output {c.output}: {c.describe()}" for c in changes)


def _explains(lowp, target, reference, source) -> str:
    """The evidence text when accumulating in low precision explains the target, else ""."""
    if lowp is None or np.shape(lowp) != np.shape(target):
        return ""
    base = reference if reference is not None and np.shape(reference) == np.shape(target) else source
    off_reference = _max_diff(target, base)
    off_lowp = _max_diff(target, lowp)
    if not math.isfinite(off_reference) or off_reference == 0 or off_lowp > PRECISION_EXPLAINED_SHARE * off_reference:
        return ""
    dtype = np.asarray(lowp).dtype
    return (f"accumulating in {dtype} on the host reproduces it: the target is {off_lowp:.3g} from that, "
            f"{off_reference:.3g} from the {'float64 reference' if base is reference else 'source'}")


def _max_diff(a, b) -> float:
    with np.errstate(all="ignore"):
        a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        both = np.isfinite(a64) & np.isfinite(b64)
        return float(np.max(np.abs(a64[both] - b64[both]))) if np.any(both) else math.inf


def _differing(first: list, second: list) -> int:
    """Elements whose bits differ between two runs' outputs (a different count or shape: all of them)."""
    count = 0
    for a, b in zip(first, second):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            count += max(a.size, b.size)
            continue
        if a.size:
            bits = np.dtype(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else None
            if bits is None or a.dtype == np.bool_:
                count += int(np.count_nonzero(a != b))
            else:
                count += int(np.count_nonzero(np.ascontiguousarray(a).view(bits) != np.ascontiguousarray(b).view(bits)))
    return count + abs(len(first) - len(second))


def _nan_text(target, source) -> str:
    with np.errstate(all="ignore"):
        t, s = np.asarray(target, dtype=np.float64), np.asarray(source, dtype=np.float64)
    if t.shape != s.shape:
        return "NaN/Inf pattern differs"
    new_nan = int(np.count_nonzero(np.isnan(t) & ~np.isnan(s)))
    new_inf = int(np.count_nonzero(np.isinf(t) & ~np.isinf(s)))
    lost = int(np.count_nonzero(~np.isfinite(s) & np.isfinite(t)))
    parts = [f"{new_nan} NaN" if new_nan else "", f"{new_inf} Inf" if new_inf else ""]
    text = " and ".join(p for p in parts if p)
    text = f"target has {text} where the source is finite" if text else ""
    if lost:
        text += ("; " if text else "") + f"{lost} element(s) finite on the target where the source is NaN/Inf"
    return text or "the signs of infinities differ"
