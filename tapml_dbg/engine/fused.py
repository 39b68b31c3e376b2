"""The fused phase of a bisect: an op that is right alone and on right inputs, wrong compiled with its producers.

A propagated culprit (its value in the model fails, its isolated verdict passes, every input it
reads passed the probe before it) is either an op that amplifies the small errors it is fed, or a
unit that is wrong only when compiled as one function: a fusion or schedule bug. One extra unit
tells them apart: the op alone, fed the target's own upstream values from that passing probe. If
that fails, the op amplifies (propagated stays). If it passes, every piece is right and only the
compiled-together unit is wrong: grow a unit backwards from the op over its producers (contiguous
ops, trimmed to those the op's value depends on), each fed the recorded inputs of the unit, until
one fails at the op's output: the smallest failing unit names the fusion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.results import Culprit
from tapml_dbg.engine.verdicts import Verdicts
from tapml_dbg.errors import TraceError
from tapml_dbg.judge.verdict import FUSED, PROPAGATED, Status, Verdict, WrongClass
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.runtime.scheduler import Runtime

FUSED_MAX_OPS = 8  # the largest unit grown around an op (ops); beyond it the culprit stays propagated


class UnitParts(Protocol):
    """What the fused diagnosis uses of a session (an `engine.session.Session` is one): its ops, the kept
    ones (cut out of every unit), how a unit is made (`requests`), run (`lanes`) and judged (`verdicts`)."""

    ops: list[OpInfo]
    kept: set[int]
    lanes: Runtime
    requests: RequestBuilder
    verdicts: Verdicts


@dataclass
class FusedUnit:
    """The smallest unit around op `index` found to fail when compiled as one function."""

    index: int
    ops: list[int]  # in order, the op last
    names: list[str]
    verdict: Verdict  # the op's value out of the unit fed recorded inputs, mode FUSED

    @property
    def first(self) -> int:
        return self.ops[0]

    @property
    def selector(self) -> str:
        """The unit as an op range (`dump --ops A:B`, B excluded as in every selector)."""
        return f"{self.first}:{self.index + 1}"

    def describe(self) -> str:
        """'#2 addmm passes alone; fails compiled with #1 addmm_p0: fused, 2 ops'."""
        others = ", ".join(f"#{i} {n}" for i, n in zip(self.ops, self.names) if i != self.index)
        return (f"#{self.index} {self.names[-1]} passes alone; fails compiled with {others}: "
                f"fused, {len(self.ops)} ops")

    def culprit(self, op) -> Culprit:
        """The unit as a bisect's fused culprit (`op`: the `OpInfo` of its last op)."""
        verdict = self.verdict
        return Culprit(op.index, op.name, op.op, op.layer, FUSED, verdict.worst, self.describe(), verdict.wrong,
                       verdict.evidence, unit=list(zip(self.ops, self.names)), source_location=op.source_location,
                       step=op.step)


def producers_within(session: UnitParts, index: int, first: int) -> list[int]:
    """Op `index` and the ops in [first, index) its value depends on, in order; a kept op
    (engine/kept.py) is cut out, its recorded value an input of the unit."""
    keep = {index}
    for op in reversed(session.ops[first:index]):
        if op.index in session.kept:
            continue
        if any(op.name in session.ops[i].inputs for i in keep):
            keep.add(op.index)
    return sorted(keep)


def unit_verdict(session: UnitParts, ops: list[int], index: int,
                 target_values: dict[str, list[np.ndarray]] | None = None) -> Verdict:
    """Op `index`'s value out of ops `ops` compiled as one unit, judged as a value that crossed target ops."""
    names = [session.ops[i].name for i in ops]
    result = session.lanes.run(session.requests.ops_request(names, [session.ops[index].name], target_values))
    verdict = session.verdicts.judge(index, PROPAGATED, result, result.outputs[0] if result.ok else None)
    return verdict


def alone_on_target_inputs(session: UnitParts, index: int, upstream: dict[str, list[np.ndarray]]) -> Verdict:
    """Op `index` compiled alone, fed the target's values of its inputs (`upstream`: name -> values)."""
    return unit_verdict(session, [index], index, upstream)


def grow(session: UnitParts, index: int, first: int, max_ops: int = FUSED_MAX_OPS) -> FusedUnit | None:
    """The smallest unit [j, index] (trimmed to the op's producers) failing at op `index`, or None.

    Units are fed recorded inputs; growth stops at `first`, at `max_ops` ops, or at an op the trace
    holds no values for.
    """
    tried: set[tuple[int, ...]] = set()
    for start in range(index - 1, max(first, index - max_ops + 1) - 1, -1):
        ops = producers_within(session, index, start)
        if len(ops) < 2 or tuple(ops) in tried:
            continue
        tried.add(tuple(ops))
        try:
            verdict = unit_verdict(session, ops, index)
        except TraceError:
            return None
        if verdict.status == Status.FAIL:
            names = [session.ops[i].name for i in ops]
            fused = Verdict(index, session.ops[index].name, FUSED, Status.FAIL, verdict.metrics, verdict.message)
            unit = FusedUnit(index, ops, names, fused)
            fused.wrong = WrongClass.FUSED
            fused.evidence = (f"right alone and on the target's own inputs, wrong only compiled with its "
                              f"producers (its values: {verdict.wrong or 'wrong'})")
            return unit
    return None


def diagnose(session: UnitParts, index: int, first: int, upstream: dict[str, list[np.ndarray]] | None) -> FusedUnit | None:
    """Whether propagated culprit `index` is a fusion bug: its fused unit, or None (it amplifies, or no
    unit up to FUSED_MAX_OPS fails). `upstream`: the target's values of its inputs from the passing probe."""
    if upstream is not None:
        alone = alone_on_target_inputs(session, index, upstream)
        if alone.failed:  # wrong on the target's own inputs by itself: the error arrives and grows here
            return None
    return grow(session, index, first)


def find_unit(session: UnitParts, index: int) -> FusedUnit | None:
    """Op `index`'s fused unit for a dump: None at the cost of one unit when the largest unit around it
    (FUSED_MAX_OPS ops of its producers) passes, else the smallest failing one (`grow`)."""
    try:
        widest = producers_within(session, index, max(0, index - FUSED_MAX_OPS + 1))
        if len(widest) < 2 or unit_verdict(session, widest, index).status != Status.FAIL:
            return None
    except TraceError:
        return None
    return grow(session, index, 0)
