"""Bisection: one bisect run, a small driver over the phases a search goes through.

The phases' decisions are pure (engine/phases.py: which fused prefixes next, what a sweep that
follows the chain runs, the range searched; `first_failing` and `first_failing_speculative` know
nothing but a pass/fail predicate over indices); `Bisection` runs what they ask for, its state in
the object, not on the session. What is built ahead and what runs beside what is the runtime's
(`Runtime.search_overlap`, runtime/overlap.py): the engine hands it a `SearchPlan` (what to build ahead),
then a `BesidePlan` and its sweep, and says what its chain found; it starts no thread.

1. chain: every op compiled alone (once per distinct op) and chained on the target, each value
   screened as it is computed; the first op whose value is wrong, isolated or propagated, is
   the candidate (`engine.chain`). Both verdicts come from executions of shared kernels, so the
   search costs about one run of the model plus one compile per distinct op.
2. fused (engine/phases_fused.py): only when the per-op chain finds nothing, the range is run once
   compiled as one unit, the way TVM builds the model; when that probe fails, a binary search over fused prefixes
   [first, k] (a probe failing when any value it hands on, its frontier, diverges) finds where
   (a fusion bug: every op is right alone and chained). A chain that dies without saying where
   (a kernel that kills the worker) is searched this way too;
3. confirm: a fused candidate's isolated verdict says whether its kernel is wrong (isolated) or
   the error arrives from upstream (propagated, as seen by the probe that ended at it);
4. sweep (engine/phases_sweep.py): isolated verdicts of every op below the candidate, so that an op
   wrong alone by less than its propagated bound (or one that washes out before the model's output)
   is still found
   (the lowest failing op wins); the screen clears most ops without a verdict, and an op whose
   chained value cleared the isolated screen already is not run alone (the chain checks each
   value against both rules and logs it as it goes; the sweep beside it follows that log:
   `isolated.ChainLead`);
5. types: an op whose import declares another dtype or shape than the source computed is a
   divergence of its own (a type verdict), known from the trace without running anything; the
   lowest one below the candidate wins too, even when no value downstream differs;
6. fused diagnosis: only when the culprit is still the fused search's propagated candidate (its
   isolated verdict passes and the probe just before it passed, so every input it reads is
   right), the op is told from a fusion bug (`engine.fused`); nothing runs in this phase otherwise.
7. tokens (generation traces only, engine/generation.py): every op chained once more on the target
   from the same kernels, fed the source's tokens, so each step's logits give its token verdict and
   the first bad token (the first step whose target top-1 differs), with per-step KL.
Kept ops (`Session.kept`, engine/kept.py) are in no phase: no chain unit, no probe's unit, no
sweep, no type verdict; the ops after one are fed its recorded value, so the search names the
next divergence past a known bug.
The culprit's failing verdict is then judged once more with a second run of its unit
(`Verdicts.explain`), so a nondeterministic kernel is told from a wrong one; it carries its class.
Whichever of the chain and the sweep beside it stops first makes that second run while the other
goes on (the runtime's overlap policy: runtime/overlap.py).
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from tapml_dbg.engine.chain import ChainFinding, ChainSearch, ChainSearchParts
from tapml_dbg.engine.generation import GenerationParts, tokens_phase
from tapml_dbg.engine.isolated import IsolatedVerdicts
from tapml_dbg.engine.kept import host_only_note, kept_note
from tapml_dbg.engine.phases import SearchTrace, first_failing, first_failing_speculative, search_range
from tapml_dbg.engine.phases_fused import FusedPrefixes, SearchParts
from tapml_dbg.engine.phases_sweep import IsolatedSweep
from tapml_dbg.engine.references import SourceReference
from tapml_dbg.engine.results import BisectResult, Culprit, StepResult
from tapml_dbg.judge.classify import type_evidence
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode, Verdict, WrongClass
from tapml_dbg.model.host_only import HostOnlyOp
from tapml_dbg.runtime.scheduler import SearchOverlap, SearchPlan

__all__ = ["Bisection", "SearchTrace", "first_failing", "first_failing_speculative"]  # the pure search: phases.py

NEIGHBOURHOOD_RADIUS = 2  # ops shown on each side of a culprit
WASHED_OUT_NOTE = ("the divergence does not persist to the model's output (it washes out or is masked "
                   "downstream)")
TYPE_NOTE = "found by its type alone: the values the model computes downstream agree"
REMEMBERED_NOTE = ("{units} unit run(s) not made again: earlier runs on this trace gave the same units the same "
                   "inputs (the compile cache's memo; TAPML_MEMO=0 runs them all)")
LOST_CHAIN_NOTE = "the per-op chain's worker died without naming an op; searched fused prefixes instead"


def _noop(*_args, **_kwargs) -> None:
    return None


class BisectParts(ChainSearchParts, SearchParts, GenerationParts, Protocol):
    """What a bisect uses of a session (an `engine.session.Session` is one), besides what its chain, its
    fused probes and its tokens use: the user's kept ops and the host-only ones (notes), the source
    reference (its import note, its type changes), the isolated-verdict cache, the target's name, an
    op's step result (the culprit's neighbourhood)."""

    user_kept: set[int]
    host_only: list[HostOnlyOp]
    reference: SourceReference
    isolated_verdicts: IsolatedVerdicts
    target: str

    def step_result(self, index: int, isolated: Verdict | None = None,
                    propagated: Verdict | None = None) -> StepResult: ...


class Bisection:
    """One bisect run over a session (see the module docstring for the phases)."""

    def __init__(self, session: BisectParts, sweep: bool = True, progress: Callable[..., None] = _noop):
        self.session = session
        self.sweep_enabled = sweep
        self.progress = progress
        searched = search_range(len(session.ops), session.reader.outline.capture, session.recorded)
        self.first, self.last, self.notes = searched.first, searched.last, list(searched.notes)
        self.kept = session.kept  # never a unit nor a verdict of this search (engine/kept.py), host-only ops too
        if session.user_kept:
            self.notes.append(kept_note(session.ops, session.user_kept))
        if session.host_only:
            self.notes.append(host_only_note(session.host_only))
        if session.reference.stock_import_note():  # the import-error finding (frontend/stock_import.py)
            self.notes.append(session.reference.stock_import_note())
        self.search_trace = SearchTrace()
        self.parallel = session.lanes.size > 1
        self.explain_units = 0  # units run to classify the culprit (Verdicts.explain), not to find it
        self.chain = ChainFinding()  # what the per-op chain found (phase 1)
        self.beside = None  # what ran beside the sweep while the chain ran (`SearchOverlap.beside_sweep`)
        # phase 4, beside the chain where there is a side worker, following the chain's log of its outcomes;
        # its screen, and the ops only a full verdict may judge (in the chain and the sweep)
        rules = session.verdicts.screen_rule(ISOLATED), session.verdicts.unscreened()
        chain_log = session.lanes.chain_log() if sweep else None
        self.sweep = IsolatedSweep(session.isolated_verdicts, (self.first, self.last), self.kept, rules, chain_log,
                                   session.warm_up_torch, progress)
        # phase 2, only when the chain finds nothing
        self.prefixes = FusedPrefixes(session, self.first, self.last, self.search_trace, self.sweep.unscreened,
                                      progress)
        # phase 7 (a generation trace): its logits handed back by a chain of every op up to them
        self.tokens = tokens_phase(session, self.first)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> BisectResult:
        session = self.session
        started = time.perf_counter()
        units_before, remembered_before = session.lanes.units, session.lanes.cache.remembered
        candidate = self.search()
        end = candidate if candidate is not None else self.last + 1
        earliest = None
        if self.sweep_enabled and self.parallel:  # the sweep's batches and the candidate's unit side by side
            earliest = self.sweep.lowest_failing(end, also=(candidate,) if candidate is not None else ())
        culprit = self.confirm(candidate) if candidate is not None else None
        if self.sweep_enabled:
            if not self.parallel:
                earliest = self.sweep.lowest_failing(end)
            if earliest is not None:
                if culprit is None:
                    self.notes.append(TYPE_NOTE if earliest.wrong == WrongClass.TYPE else WASHED_OUT_NOTE)
                culprit = self._culprit(earliest.index, earliest, ISOLATED)
        typed = [i for i in session.verdicts.type_changed_ops() if self.first <= i < end and i not in self.kept]
        if typed and (culprit is None or typed[0] < culprit.index):
            if culprit is None:
                self.notes.append(TYPE_NOTE)
            culprit = self._culprit(typed[0], session.isolated(typed[0]), ISOLATED)
        if culprit is not None and culprit.verdict == PROPAGATED and culprit.index == candidate \
                and candidate != self.chain.index:
            culprit = self.prefixes.diagnose(candidate) or culprit
        # the search's own units: the neighbourhood is display, the culprit's second run classification
        probes = session.lanes.units - units_before - self.explain_units
        neighbourhood = self.neighbourhood(culprit.index) if culprit else []
        if session.lanes.plan.note:
            self.notes.append(session.lanes.plan.note)
        remembered = session.lanes.cache.remembered - remembered_before
        if remembered:
            self.notes.append(REMEMBERED_NOTE.format(units=remembered))
        tokens = self.tokens.report(session, self.chain.kept) if self.tokens is not None else None
        return BisectResult(diverged=culprit is not None, ops=len(session.ops), probes=probes,
                            seconds=time.perf_counter() - started, target=session.target, culprit=culprit,
                            neighbourhood=neighbourhood, search=self.search_trace.probes, notes=self.notes,
                            kept=sorted(session.user_kept), tokens=tokens,
                            host_only=[entry.to_json() for entry in session.host_only])

    # -- phases 1 and 2: search --------------------------------------------------------------
    def search(self) -> int | None:
        """The first op whose value is wrong on the per-op chain, else the first prefix end k whose
        fused probe fails (None: neither)."""
        if self.last < self.first:
            return None
        self.progress(0, None, f"chain ops {self.first}..{self.last}")
        log = self.sweep.chain_log
        chain = ChainSearch(self.session, self.first, self.last, self.sweep.unscreened,
                            also_keep=set(self.tokens.keep) if self.tokens is not None else set(),
                            log=(log, self.sweep.screen) if log is not None else None)
        # what the search may want built ahead: phase 2's first probes (wanted when the chain finds
        # nothing) and the chain's units; when and where is the runtime's overlap policy
        plan = SearchPlan(probes_ahead=self.prefixes.ahead(), chain_units=chain.units_to_build())
        with self.session.lanes.search_overlap(plan) as overlap:
            beside = self._chain_beside_sweep(chain, overlap) \
                if self.sweep_enabled and self.session.lanes.has_side else None
            self.chain = chain.run(beside)
            self.sweep.chain_cleared()
            overlap.chain_done(found=self.chain.index is not None)
            self.search_trace.probes.extend(self.chain.probes)
            if self.chain.index is not None:
                return self.chain.index
            if self.chain.lost:
                self.notes.append(f"{LOST_CHAIN_NOTE} ({self.chain.message})")
            return self.prefixes.search()

    def _chain_beside_sweep(self, chain: ChainSearch, overlap: SearchOverlap):
        """The chain's first run on a worker of its own while the lanes sweep isolated verdicts from
        `first` up (two cores at work, as the runtime's overlap policy shares them: runtime/overlap.py);
        the sweep stops at the chain's first suspect once it is known, or at a failing op. The request
        and its result, counted; what else ran beside the sweep is taken in."""
        request = chain.request()  # (a trace that cannot feed the chain raises here, first)
        plan = self.sweep.plan_beside(request, chain.timeout, chain.bound)
        self.beside = overlap.beside_sweep(plan, self.sweep.follow)
        self.explain_units += self.sweep.take(self.beside)
        return request, self.beside.chained

    # -- phase 2: confirm ------------------------------------------------------------------
    def confirm(self, candidate: int) -> Culprit:
        """The candidate as a culprit: isolated when its kernel is wrong, else propagated."""
        if candidate == self.chain.index:  # judged by the chain already, isolated first
            verdict = self.chain.verdict
            if verdict.mode == ISOLATED:
                return self._culprit(candidate, verdict, ISOLATED)
            return self._culprit(candidate, verdict, PROPAGATED, upstream=self.chain.upstream)
        verdict = self.session.isolated(candidate)
        if verdict.failed:
            return self._culprit(candidate, verdict, ISOLATED)
        return self._culprit(candidate, self.prefixes.propagated(candidate), PROPAGATED)

    # -- what is searched, and what is shown ------------------------------------------------
    def _culprit(self, index: int, verdict: Verdict, mode: Mode, upstream: dict | None = None) -> Culprit:
        op = self.session.ops[index]
        before = self.session.lanes.units
        verdict = self.session.verdicts.explain(verdict, upstream)
        self.explain_units += self.session.lanes.units - before
        kind = mode if verdict.status.judged else verdict.status
        wrong, evidence = verdict.wrong, verdict.evidence
        if wrong is None and index in self.session.verdicts.type_changed_ops():  # e.g. no verdict (missing): still a type one
            wrong, evidence = WrongClass.TYPE, type_evidence(self.session.reference.type_changes[index])
        return Culprit(op.index, op.name, op.op, op.layer, kind, verdict.worst, verdict.message, wrong, evidence,
                       source_location=op.source_location, step=op.step)

    def neighbourhood(self, index: int) -> list[StepResult]:
        """The culprit and NEIGHBOURHOOD_RADIUS ops on each side, with their isolated verdicts."""
        session = self.session
        window = list(range(max(0, index - NEIGHBOURHOOD_RADIUS),
                            min(len(session.ops), index + NEIGHBOURHOOD_RADIUS + 1)))
        session.isolated_verdicts.fill_window(window)
        return [session.step_result(i, isolated=session.isolated(i)) for i in window]
