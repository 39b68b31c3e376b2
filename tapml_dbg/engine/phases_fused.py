"""Phase 2 of a bisect, the fused prefixes, and what its probes tell phases 3 and 6.

Only when the per-op chain finds nothing (or dies without saying where) is the range run compiled as
one unit, the way TVM builds the model; when that probe fails, a binary search over fused prefixes
[first, k] (`phases.PrefixSearch`: a probe fails when any value it hands on, its frontier, diverges)
finds where: a fusion bug, every op right alone and chained. A generation trace's steps are fused
one unit each, fed the recorded values of the steps before (`_by_step`). The probes' results say
later what the candidate's propagated verdict is (`propagated`) and what the target computed for its
inputs (`upstream`, for the fused diagnosis: engine/fused.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cached_property
from typing import Callable, Protocol

import numpy as np

from tapml_dbg.engine import fused
from tapml_dbg.engine.fused import UnitParts
from tapml_dbg.engine.phases import SearchTrace, first_failing, first_failing_speculative, is_fusion_question
from tapml_dbg.engine.results import Culprit
from tapml_dbg.judge.screen import clearly_passes
from tapml_dbg.judge.verdict import PROPAGATED, Status, Verdict
from tapml_dbg.model.analysis import frontier
from tapml_dbg.model.generation import fused_spans
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.runtime.messages import UnitResult


class SearchParts(UnitParts, Protocol):
    """What the fused probes use of a session besides a unit's parts (an `engine.session.Session` is one):
    the ops by name, who reads each value, which ops the trace holds values for, and those values."""

    by_name: dict[str, OpInfo]
    consumers: dict[str, list[int]]
    recorded: set[int]
    source_values: Callable[[int], list[np.ndarray]]


class FusedPrefixes:
    """The fused probes of ops [first, last] of a session, kept ops cut out; their results by prefix end."""

    def __init__(self, session: SearchParts, first: int, last: int, trace: SearchTrace, unscreened: set[str],
                 progress: Callable[..., None]):
        """`trace`: the search's probe path, appended to; `unscreened`: the ops only a full verdict may judge."""
        self.session = session
        self.first, self.last = first, last
        self.trace = trace
        self.unscreened = unscreened
        self.progress = progress
        self.kept = session.kept
        self.results: dict[int, UnitResult] = {}  # prefix end k -> the probe's result
        self.start = first  # where the probes start: `first`, or a generation step's first op
        self.by_step = False  # the probes are a generation's steps (`_by_step`)

    def spans(self) -> list[range]:
        """The spans the probes cover: the search's range, or a generation's steps in it."""
        return [span for span in fused_spans(self.session.ops) if span.stop > self.first and span.start <= self.last]

    def ahead(self) -> list:
        """The probes this phase starts with, one of each kind (a generation's decode steps are one
        structure): built ahead, in case the chain finds nothing (`Lanes.build_ahead`)."""
        spans = self.spans()
        kinds_seen, requests = set(), []
        for span in spans:
            kinds = tuple(self.session.ops[i].op for i in span)
            if kinds not in kinds_seen:
                kinds_seen.add(kinds)
                first, last = max(span.start, self.first), min(span.stop - 1, self.last)
                requests.append(self.request(first, last, by_step=len(spans) > 1))
        return [request for request in requests if request is not None]

    def search(self) -> int | None:
        """The first prefix end k whose fused probe fails (None: no prefix fails)."""
        spans = self.spans()
        if len(spans) > 1:
            return self._by_step(spans)
        lanes = self.session.lanes.size
        if lanes > 1:  # same answer and path as first_failing, ~1.5x fewer rounds with 2 lanes
            return first_failing_speculative(self.first, self.last, self._fail_many, lanes, self.trace)
        return first_failing(self.first, self.last, self.fails, self.trace)

    def _by_step(self, spans: list[range]) -> int | None:
        """A generation trace: each step fused as one unit fed the recorded values of the steps before it
        (as a deployment runs a prefill and each decode step as calls of their own, no unit spans two
        steps); the first step whose unit fails is searched over its fused prefixes. Decode steps are
        one structure, so their units compile once."""
        self.by_step = True
        for span in spans:
            self.start = max(span.start, self.first)
            last = min(span.stop - 1, self.last)
            if self.fails(last):  # searched from its end again (the unit is compiled: a run)
                return first_failing(self.start, last, self.fails, self.trace)
            self.trace.probes.append((last, False))
        self.start = self.first
        return None

    def _total_steps(self) -> int:
        return max(1, math.ceil(math.log2(max(self.last - self.first + 1, 2)))) + 1

    def fails(self, k: int) -> bool:
        self.progress(len(self.trace.probes), self._total_steps(), f"probe ops {self.start}..{k}")
        request = self.request(self.start, k, self.by_step)
        return request is not None and self._outcome(k, self.session.lanes.run(request))

    def _fail_many(self, ks: list[int]) -> list[bool]:
        """One round of speculative probes, side by side."""
        self.progress(len(self.trace.probes), self._total_steps(),
                      f"probe ops {self.first}.." + f", {self.first}..".join(map(str, ks)))
        outcomes = {}
        with self.session.lanes.dispatch() as work:
            for k in ks:
                request = self.request(self.start, k, self.by_step)
                if request is None:  # nothing but kept ops: nothing on the target to fail
                    outcomes[k] = False
                else:
                    work.submit(k, k, request)
            for k, result in work:
                outcomes[k] = self._outcome(k, self.session.lanes.counted(result))
        return [outcomes[k] for k in ks]

    def frontier(self, k: int, first: int | None = None) -> list[str]:
        kept = {self.session.ops[i].name for i in self.kept}
        first = self.start if first is None else first
        return [name for name in frontier(self.session.ops, self.session.consumers, first, k) if name not in kept]

    def request(self, first: int, k: int, by_step: bool):
        """The fused probe of ops [first, k], kept ops cut out (their recorded values are its inputs);
        None when it holds nothing but kept ops. `by_step`: a generation's steps, one structure for
        every decode step (the first reads the prefill's values: `build_unit`'s input_per_use)."""
        names = [op.name for op in self.session.ops[first:k + 1] if op.index not in self.kept]
        outputs = self.frontier(k, first)
        if not names or not outputs:
            return None
        return self.session.requests.ops_request(names, outputs, input_per_use=by_step)

    def _outcome(self, k: int, result: UnitResult) -> bool:
        """Whether the probe of prefix [start, k] failed: it did not run, or a frontier value diverges."""
        self.results[k] = result
        if not result.ok:
            return True
        for name, outputs in zip(self.frontier(k), result.outputs):
            op = self.session.by_name[name]
            if self._surely_passes(op.index, name, outputs):
                continue
            if not self.session.verdicts.judge(op.index, PROPAGATED, result, outputs).passed:
                self.results[k] = replace(result, message=f"op {op.index} ({name}) diverges")  # (results are frozen)
                return True
        return False

    def _surely_passes(self, index: int, name: str, outputs) -> bool:
        """A probe's value that clears the propagated screen passes its full verdict (judge/screen.py),
        as in the chain: judged without the float64 run of the whole source graph that a propagated
        reference needs (a crash's fused search on the 1.1B Llama spent most of its time there)."""
        screen, judged_in_full = self._screen
        return name not in judged_in_full and index in self.session.recorded \
            and clearly_passes(outputs, self.session.source_values(index), screen)

    @cached_property
    def _screen(self):
        """(the propagated screen rule, the ops it may not clear), for the fused probes only."""
        verdicts = self.session.verdicts
        return verdicts.screen_rule(PROPAGATED), self.unscreened | verdicts.type_changed_names()

    # -- what the probes tell the later phases --------------------------------------------------
    def propagated(self, index: int) -> Verdict:
        """The propagated verdict of `index` as seen by the prefix probe that ended at it (phase 3)."""
        op = self.session.ops[index]
        probe = self.results.get(index)
        if probe is None or not probe.ok:
            return Verdict(index, op.name, PROPAGATED, Status(probe.status) if probe else Status.ERROR,
                           message=probe.message if probe else "")
        names = self.frontier(index)
        if op.name not in names:
            return Verdict(index, op.name, PROPAGATED, Status.ERROR, message="no value for the op in the probe")
        return self.session.verdicts.judge(index, PROPAGATED, probe, probe.outputs[names.index(op.name)])

    def diagnose(self, candidate: int) -> Culprit | None:
        """Phase 6: the propagated candidate as a fused culprit, when only a unit with its producers is
        wrong (engine/fused.py); None when an input of it may be wrong already, or it is not a fusion."""
        if not is_fusion_question(candidate, self.start, self.trace.probes):
            return None
        unit = fused.diagnose(self.session, candidate, self.start, self.upstream(candidate))
        return unit.culprit(self.session.ops[unit.index]) if unit is not None else None

    def upstream(self, index: int) -> dict | None:
        """The target's values of op `index`'s inputs, from the passing probe of [start, index - 1]."""
        probe = self.results.get(index - 1)
        if probe is None or not probe.ok:
            return None
        wanted = set(self.session.ops[index].inputs)
        return {name: values for name, values in zip(self.frontier(index - 1), probe.outputs) if name in wanted}
