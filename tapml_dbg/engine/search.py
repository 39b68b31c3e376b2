"""Bisection: the pure search over op indices, and the phases a bisect run goes through.

`first_failing` and `first_failing_speculative` know nothing but a pass/fail predicate over
indices. `Bisection` is one bisect run over a session, as explicit phases whose state lives in
the object, not on the session:
1. chain: every op compiled alone (once per distinct op) and chained on the target, each value
   screened as it is computed; the first op whose value is wrong, isolated or propagated, is
   the candidate (`engine.chain`). Both verdicts come from executions of shared kernels, so the
   search costs about one run of the model plus one compile per distinct op.
2. fused: only when the per-op chain finds nothing, the range is run once compiled as one unit,
   the way TVM builds the model; when that probe fails, a binary search over fused prefixes
   [first, k] (a probe failing when any value it hands on, its frontier, diverges) finds where
   (a fusion bug: every op is right alone and chained). A chain that dies without saying where
   (a kernel that kills the worker) is searched this way too;
3. confirm: a fused candidate's isolated verdict says whether its kernel is wrong (isolated) or
   the error arrives from upstream (propagated, as seen by the probe that ended at it);
4. sweep: isolated verdicts of every op below the candidate, so that an op wrong alone by less
   than its propagated bound (or one that washes out before the model's output) is still found
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
goes on (`_spare_run_beside`, `_spare_run_of_lowest_failing`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

from tapml_dbg.engine import fused
from tapml_dbg.engine.chain import ChainFinding, ChainSearch
from tapml_dbg.engine.generation import output_name, teacher_forced, trace_generation
from tapml_dbg.engine.isolated import ChainLead, SweepPlan
from tapml_dbg.engine.kept import host_only_note, kept_note
from tapml_dbg.engine.results import BisectResult, Culprit, StepResult
from tapml_dbg.errors import TraceError
from tapml_dbg.judge.classify import type_evidence
from tapml_dbg.judge.screen import clearly_passes
from tapml_dbg.judge.verdict import FUSED, ISOLATED, PROPAGATED, Mode, Status, Verdict, WrongClass
from tapml_dbg.model.analysis import frontier
from tapml_dbg.model.generation import fused_spans
from tapml_dbg.runtime.messages import UnitResult

NEIGHBOURHOOD_RADIUS = 2  # ops shown on each side of a culprit
SIDE_SWEEP_MIN_OPS = 64  # the sweep's ops left when the chain is done that are worth a run beside it
# the part of them the chain's worker takes: it has just read every recorded value the chain screened
# (its worker keeps them), so an op costs it a fraction of what it costs a lane (figures: docs/perf.md)
SIDE_SWEEP_SHARE = 0.75
WASHED_OUT_NOTE = ("the divergence does not persist to the model's output (it washes out or is masked "
                   "downstream)")
TYPE_NOTE = "found by its type alone: the values the model computes downstream agree"
REMEMBERED_NOTE = ("{units} unit run(s) not made again: earlier runs on this trace gave the same units the same "
                   "inputs (the compile cache's memo; TAPML_MEMO=0 runs them all)")
LOST_CHAIN_NOTE = "the per-op chain's worker died without naming an op; searched fused prefixes instead"


@dataclass
class SearchTrace:
    """The probes a search made, in order, as (index, failed)."""

    probes: list[tuple[int, bool]] = field(default_factory=list)


def first_failing(lo: int, hi: int, failed: Callable[[int], bool], trace: SearchTrace | None = None) -> int | None:
    """Smallest k in [lo, hi] with `failed(k)`, assuming failures persist once they start.

    Probes `hi` first (is anything wrong at all?), then halves, so the cost is 1 + ceil(log2(n))
    probes. When failures do not persist the answer is still a transition point: `failed(k)`
    is true and `failed(k - 1)` false (or k == lo).
    """
    trace = trace if trace is not None else SearchTrace()

    def probe(k: int) -> bool:
        result = bool(failed(k))
        trace.probes.append((k, result))
        return result

    if hi < lo or not probe(hi):
        return None
    good, bad = lo - 1, hi  # invariant: failed(bad) is true; failed(good) false (or good < lo)
    while bad - good > 1:
        middle = (good + bad) // 2
        if probe(middle):
            bad = middle
        else:
            good = middle
    return bad


def first_failing_speculative(lo: int, hi: int, failed_many: Callable[[list[int]], list[bool]], width: int,
                              trace: SearchTrace | None = None) -> int | None:
    """`first_failing`'s answer and probe path, probing up to `width` points per round.

    `failed_many(ks)` returns `failed(k)` for each k of a round (e.g. computed side by side).
    Each round probes the first `width` not-yet-known points of `first_failing`'s own decision
    tree, breadth first from where the search stands ("failed" branch first on a tie: its prefix
    is the shorter, cheaper probe); the search then follows the tree as far as the known results
    go. So for any deterministic `failed` (persistent or not) the answer and `trace.probes` are
    exactly `first_failing`'s; probes off the path are wasted work, at most `width - 1` a round.
    With `width == 1` it makes the same calls as `first_failing`.
    """
    trace = trace if trace is not None else SearchTrace()
    if hi < lo:
        return None
    width = max(1, int(width))
    known: dict[int, bool] = {}

    def probe_point(state: tuple) -> int | None:  # None: the state is an answer
        if state[0] == "top":
            return hi
        if state[0] == "done":
            return None
        good, bad = state[1], state[2]
        return (good + bad) // 2 if bad - good > 1 else None

    def follow(state: tuple, result: bool) -> tuple:
        if state[0] == "top":  # is anything wrong at all?
            return ("range", lo - 1, hi) if result else ("done", None, None)
        good, bad = state[1], state[2]
        middle = (good + bad) // 2
        return ("range", good, middle) if result else ("range", middle, bad)

    state: tuple = ("top", None, None)
    while True:
        point = probe_point(state)
        while point is not None and point in known:  # walk the path as far as results are known
            trace.probes.append((point, known[point]))
            state = follow(state, known[point])
            point = probe_point(state)
        if point is None:
            return None if state[0] == "done" else state[2]
        wanted: list[int] = []
        level = [state]
        while level and len(wanted) < width:
            below = []
            for node in level:
                k = probe_point(node)
                if k is None:
                    continue
                if k in known:
                    below.append(follow(node, known[k]))
                    continue
                if len(wanted) < width and k not in wanted:
                    wanted.append(k)
                    below += [follow(node, True), follow(node, False)]
            level = below
        results = failed_many(wanted)
        known.update((k, bool(r)) for k, r in zip(wanted, results))


def _noop(*_args, **_kwargs) -> None:
    return None


class Bisection:
    """One bisect run over an `engine.session.Session` (see the module docstring for the phases)."""

    def __init__(self, session, sweep: bool = True, progress: Callable[..., None] = _noop):
        self.session = session
        self.sweep_enabled = sweep
        self.progress = progress
        self.first, self.last, self.notes = self._search_range()
        self.kept = session.kept  # never a unit nor a verdict of this search (engine/kept.py), host-only ops too
        if session.user_kept:
            self.notes.append(kept_note(session.ops, session.user_kept))
        if session.host_only:
            self.notes.append(host_only_note(session.host_only))
        if session.reference.stock_import_note():  # the import-error finding (frontend/stock_import.py)
            self.notes.append(session.reference.stock_import_note())
        self.search_trace = SearchTrace()
        self.probe_results: dict[int, UnitResult] = {}  # prefix end k -> the probe's result
        self.parallel = session.lanes.size > 1
        self.explain_units = 0  # units run to classify the culprit (Verdicts.explain), not to find it
        self.chain = ChainFinding()  # what the per-op chain found (phase 1)
        self.fused_first = self.first  # where the fused probes start: `first`, or a generation step's first op
        self.by_step = False  # the fused probes are a generation's steps (`_fused_search_by_step`)
        self.split: int | None = None  # the sweep's ops from here on run beside it (`_chain_then_top`)
        self.chained = None  # the chain's first run's result, once it is done (beside the sweep)
        self.top = None  # (ops, result, most) of the sweep's upper part, run beside it
        self.spare = None  # (op, result): the chain's first suspect run alone once more beside the sweep
        self.sweeping = False  # the sweep beside the chain is still running
        self.screen = session.verdicts.screen_rule(ISOLATED)  # the sweep's
        # the chain's outcomes as it goes, which the sweep follows (`ChainLead`)
        self.chain_log = session.lanes.chain_log() if sweep else None
        self.unscreened = session.verdicts.unscreened()  # ops only a full verdict may judge, in the chain and the sweep
        # a generation's output, handed back by a chain of every op up to it (its tokens need no second run)
        self.output = output_name(session) if trace_generation(session) is not None and self.first == 0 else None

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> BisectResult:
        session = self.session
        started = time.perf_counter()
        units_before, remembered_before = session.lanes.units, session.lanes.cache.remembered
        try:
            candidate = self.search()
        finally:
            session.lanes.stop_ahead()  # what it did not build by now is not wanted
        end = candidate if candidate is not None else self.last + 1
        earliest = None
        if self.sweep_enabled and self.parallel:  # the sweep's batches and the candidate's unit side by side
            also = (candidate,) if candidate is not None else ()
            earliest = session.isolated_verdicts.lowest_failing(self._judged(self.first, end),
                                                                replace(self._sweep_plan, also=also), self.progress)
        culprit = self.confirm(candidate) if candidate is not None else None
        if self.sweep_enabled:
            if not self.parallel:
                earliest = session.isolated_verdicts.lowest_failing(self._judged(self.first, end), self._sweep_plan,
                                                                    self.progress)
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
            culprit = self.fused_phase(candidate) or culprit
        # the search's own units: the neighbourhood is display, the culprit's second run classification
        probes = session.lanes.units - units_before - self.explain_units
        neighbourhood = self.neighbourhood(culprit.index) if culprit else []
        if session.lanes.plan.note:
            self.notes.append(session.lanes.plan.note)
        remembered = session.lanes.cache.remembered - remembered_before
        if remembered:
            self.notes.append(REMEMBERED_NOTE.format(units=remembered))
        tokens = teacher_forced(session, self.chain.kept.get(self.output)) \
            if trace_generation(session) is not None else None
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
        self.session.lanes.begin_search()  # records from here on are this search's own, not earlier runs'
        chain = ChainSearch(self.session, self.first, self.last, self.unscreened,
                            also_keep={self.output} if self.output else set(),
                            log=(self.chain_log, self.screen) if self.chain_log is not None else None)
        # on idle cycles while the chain runs: phase 2's first probes (where the runtime expects them
        # wanted), then the chain's units from its end (the chain builds them from its start: the two meet halfway)
        self.session.lanes.build_ahead_of_search(self._probes_ahead(), chain.units_to_build()[::-1])
        beside = self._chain_beside_sweep(chain) if self.sweep_enabled and self.session.lanes.has_side else None
        self.chain = chain.run(beside)
        self._chain_cleared()
        self.session.lanes.note_search(chain_found=self.chain.index is not None)
        self.search_trace.probes.extend(self.chain.probes)
        if self.chain.index is not None:
            self.session.lanes.stop_ahead()  # no fused probe to make
            return self.chain.index
        if self.chain.lost:
            self.notes.append(f"{LOST_CHAIN_NOTE} ({self.chain.message})")
        return self.fused_search()

    def _chain_beside_sweep(self, chain: ChainSearch):
        """The chain's first run on a worker of its own while the lanes sweep isolated verdicts from
        `first` up (two cores at work); the sweep stops at the chain's first suspect once it is
        known, or at a failing op. The request and its result, counted."""
        session = self.session
        request = chain.request()  # (a trace that cannot feed the chain raises here, first)
        preparing = chain.prepare(wait=False)  # compile lanes build ahead while the chain runs
        self.chained, self.top, self.spare, self.sweeping = None, None, None, True
        running = session.lanes.beside(lambda: self._chain_then_top(request, chain), "tapml-chain")
        session.warm_up_torch()  # while the chain runs (not before its request: the import holds the GIL)
        try:
            self._sweep_beside(chain, running, preparing)
        except BaseException:  # Ctrl-C, a lost target: the chain's worker must not outlive the search,
            if preparing is not None:  # nor its compiles ahead (the next command's units use those lanes)
                preparing.cancel()
            session.lanes.stop_beside()
            raise
        finally:
            running.join()
            if preparing is not None:
                preparing.join()  # its keys are in the index before the chain's own (ChainSearch.remember)
        chained = session.lanes.counted(running.result())
        if self.top is not None:  # the sweep's upper part, run beside it once the chain was done
            held, result, most = self.top
            session.isolated_verdicts.absorb(held, session.lanes.counted(result), most)
        if self.spare is not None and self.spare[1].ok:  # a unit to classify the culprit, not to find it
            index, result = self.spare
            session.isolated_verdicts.add_spare_run(index, session.lanes.counted(result))
            self.explain_units += 1
        return request, chained

    def _chain_then_top(self, request, chain: ChainSearch):
        """The chain on the side worker; when it found nothing (the sweep then has every op to do), the
        upper part (SIDE_SWEEP_SHARE) of the ops the sweep has not reached yet, on the same worker, while
        the lanes sweep the rest (`self.split` bounds them): the chain's worker does not sit idle."""
        result = self.session.lanes.run_beside(request, chain.timeout)
        self.chained = result
        if result.suspects:
            self._spare_run_beside(self.session.by_name[result.suspects[0]].index)
            return result
        self.session.lanes.chain_found_nothing()  # (a chain that died says nowhere: the fused probes search it)
        if not result.ok:
            return result
        self._chain_cleared()
        verdicts = self.session.isolated_verdicts
        left = [i for i in self._judged(self.first, self.last + 1)
                if i not in verdicts.cache and i not in verdicts.screened and self.session.ops[i].outputs]
        top = left[int(len(left) * (1 - SIDE_SWEEP_SHARE)):]
        if len(top) < SIDE_SWEEP_MIN_OPS:
            return result
        batch, held = self.session.requests.isolated_batch(top, self.screen, self.unscreened)
        if held:
            self.split = held[0]
            self.top = (held, self.session.lanes.run_beside(batch, self.session.lanes.chain_timeout(len(held))),
                        batch.suspects)
        return result

    def _spare_run_beside(self, index: int) -> None:
        """The chain's first suspect alone on recorded inputs, on the chain's worker while the sweep
        reaches the op on another: when the op is the culprit, this is the second run that tells a
        nondeterministic kernel from a wrong one (`Verdicts.explain`), made on a core that would sit
        idle, in another process than the first run (another layout of memory for a stray read)."""
        if not self.sweeping:  # the sweep is done: the chain's worker is what the search waits on
            return
        request = self._spare_request(index)
        if request is not None and not self.session.lanes.side_interrupted():
            self.spare = (index, self.session.lanes.run_beside(request))

    def _spare_request(self, index: int):
        """Op `index`'s isolated unit for a spare run (None: the trace cannot feed it)."""
        request = self.session.isolated_verdicts.request(index)
        return None if isinstance(request, Verdict) else request

    def _sweep_beside(self, chain: ChainSearch, running, preparing) -> None:
        """While the compile lanes build ahead, the sweep runs the ops whose units are built and
        leaves the others to the end (it does not wait for a build the chain waits for too)."""
        plan = replace(self._sweep_plan, stop_at_failure=True, bound=lambda: self.split - 1 if self.split is not None
                       else (chain.bound(self.chained) if self.chained is not None else None),
                       building=preparing.is_alive if preparing is not None else None,
                       lead=ChainLead(self.chain_log, lambda: self.chained is not None or not running.is_alive())
                       if self.chain_log is not None else None)
        judged = self._judged(self.first, self.last + 1)
        try:
            self.session.isolated_verdicts.fill(judged, plan, self.progress)
        finally:
            self.sweeping = False
        if running.is_alive():  # the chain goes on: the sweep's lane would sit idle until it is done
            self._spare_run_of_lowest_failing(judged)

    def _chain_cleared(self) -> None:
        """The ops whose chained values cleared the isolated screen, as far as the chain's log says:
        settled for every sweep of this search (`isolated.ChainLead`)."""
        if self.chain_log is None:
            return
        self.chain_log.refresh()
        by_name = self.session.by_name
        self.session.isolated_verdicts.screened.update(by_name[name].index for name in self.chain_log.cleared
                                                       if name in by_name)

    def _spare_run_of_lowest_failing(self, judged: list[int]) -> None:
        """The lowest op the sweep found failing, alone once more on the sweep's lane while the chain
        still runs: when it is the culprit, its second run (`Verdicts.explain`) is made already."""
        verdicts = self.session.isolated_verdicts
        failed = verdicts.lowest_failed(judged)
        if failed is None or verdicts.failed_runs.get(failed.index) is None:
            return
        index, request = failed.index, self._spare_request(failed.index)
        if request is None:
            return
        try:
            verdicts.add_spare_run(index, self.session.lanes.run(request))
        except TraceError:  # as `Verdicts.explain` does: the verdict stands without its second run
            return
        finally:
            self.explain_units += 1

    @property
    def _sweep_plan(self) -> SweepPlan:
        """The search's sweeps: screened, their units prepared ahead or built by a run lane itself."""
        return SweepPlan(screen=self.screen, unscreened=self.unscreened, compiled=True)

    def _spans(self) -> list[range]:
        """The spans the fused probes cover: the search's range, or a generation's steps in it."""
        return [span for span in fused_spans(self.session.ops) if span.stop > self.first and span.start <= self.last]

    def _probes_ahead(self) -> list:
        """The fused probes phase 2 starts with, one of each kind (a generation's decode steps are one
        structure): built ahead, in case the chain finds nothing (`Lanes.build_ahead`)."""
        spans = self._spans()
        kinds_seen, requests = set(), []
        for span in spans:
            kinds = tuple(self.session.ops[i].op for i in span)
            if kinds not in kinds_seen:
                kinds_seen.add(kinds)
                first, last = max(span.start, self.first), min(span.stop - 1, self.last)
                requests.append(self._probe_request(first, last, by_step=len(spans) > 1))
        return [request for request in requests if request is not None]

    def fused_search(self) -> int | None:
        """The first prefix end k whose fused probe fails (None: no prefix fails)."""
        spans = self._spans()
        if len(spans) > 1:
            return self._fused_search_by_step(spans)
        if self.parallel:  # same answer and path as first_failing, ~1.5x fewer rounds with 2 lanes
            return first_failing_speculative(self.first, self.last, self._prefixes_fail, self.session.lanes.size,
                                             self.search_trace)
        return first_failing(self.first, self.last, self._prefix_fails, self.search_trace)

    def _fused_search_by_step(self, spans: list[range]) -> int | None:
        """A generation trace: each step fused as one unit fed the recorded values of the steps before it
        (as a deployment runs a prefill and each decode step as calls of their own, no unit spans two
        steps); the first step whose unit fails is searched over its fused prefixes. Decode steps are
        one structure, so their units compile once."""
        self.by_step = True
        for span in spans:
            self.fused_first = max(span.start, self.first)
            last = min(span.stop - 1, self.last)
            if self._prefix_fails(last):  # searched from its end again (the unit is compiled: a run)
                return first_failing(self.fused_first, last, self._prefix_fails, self.search_trace)
            self.search_trace.probes.append((last, False))
        self.fused_first = self.first
        return None

    def _total_steps(self) -> int:
        return max(1, math.ceil(math.log2(max(self.last - self.first + 1, 2)))) + 1

    def _prefix_fails(self, k: int) -> bool:
        self.progress(len(self.search_trace.probes), self._total_steps(), f"probe ops {self.fused_first}..{k}")
        request = self._prefix_request(k)
        return request is not None and self._outcome(k, self.session.lanes.run(request))

    def _prefixes_fail(self, ks: list[int]) -> list[bool]:
        """One round of speculative probes, side by side."""
        self.progress(len(self.search_trace.probes), self._total_steps(),
                      f"probe ops {self.first}.." + f", {self.first}..".join(map(str, ks)))
        outcomes = {}
        with self.session.lanes.dispatch() as work:
            for k in ks:
                request = self._prefix_request(k)
                if request is None:  # nothing but kept ops: nothing on the target to fail
                    outcomes[k] = False
                else:
                    work.submit(k, k, request)
            for k, result in work:
                outcomes[k] = self._outcome(k, self.session.lanes.counted(result))
        return [outcomes[k] for k in ks]

    def _frontier(self, k: int, first: int | None = None) -> list[str]:
        kept = {self.session.ops[i].name for i in self.kept}
        first = self.fused_first if first is None else first
        return [name for name in frontier(self.session.ops, self.session.consumers, first, k) if name not in kept]

    def _prefix_request(self, k: int):
        """The fused probe of ops [first, k]."""
        return self._probe_request(self.fused_first, k, self.by_step)

    def _probe_request(self, first: int, k: int, by_step: bool):
        """The fused probe of ops [first, k], kept ops cut out (their recorded values are its inputs);
        None when it holds nothing but kept ops. `by_step`: a generation's steps, one structure for
        every decode step (the first reads the prefill's values: `build_unit`'s input_per_use)."""
        names = [op.name for op in self.session.ops[first:k + 1] if op.index not in self.kept]
        outputs = self._frontier(k, first)
        if not names or not outputs:
            return None
        return self.session.requests.ops_request(names, outputs, input_per_use=by_step)

    def _outcome(self, k: int, result: UnitResult) -> bool:
        """Whether the probe of prefix [first, k] failed: it did not run, or a frontier value diverges."""
        self.probe_results[k] = result
        if not result.ok:
            return True
        for name, outputs in zip(self._frontier(k), result.outputs):
            op = self.session.by_name[name]
            if self._surely_passes(op.index, name, outputs):
                continue
            if not self.session.verdicts.judge(op.index, PROPAGATED, result, outputs).passed:
                self.probe_results[k] = replace(result, message=f"op {op.index} ({name}) diverges")  # (frozen)
                return True
        return False

    def _surely_passes(self, index: int, name: str, outputs) -> bool:
        """A probe's value that clears the propagated screen passes its full verdict (judge/screen.py),
        as in the chain: judged without the float64 run of the whole source graph that a propagated
        reference needs (a crash's fused search on the 1.1B Llama spent most of its time there)."""
        screen, judged_in_full = self._probe_screen
        return name not in judged_in_full and index in self.session.recorded \
            and clearly_passes(outputs, self.session.source_values(index), screen)

    @cached_property
    def _probe_screen(self):
        """(the propagated screen rule, the ops it may not clear), for the fused probes only."""
        verdicts = self.session.verdicts
        return verdicts.screen_rule(PROPAGATED), self.unscreened | verdicts.type_changed_names()

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
        return self._culprit(candidate, self.propagated_from_probe(candidate), PROPAGATED)

    def propagated_from_probe(self, index: int) -> Verdict:
        """The propagated verdict of `index` as seen by the prefix probe that ended at it."""
        op = self.session.ops[index]
        probe = self.probe_results.get(index)
        if probe is None or not probe.ok:
            return Verdict(index, op.name, PROPAGATED, Status(probe.status) if probe else Status.ERROR,
                           message=probe.message if probe else "")
        names = self._frontier(index)
        if op.name not in names:
            return Verdict(index, op.name, PROPAGATED, Status.ERROR, message="no value for the op in the probe")
        return self.session.verdicts.judge(index, PROPAGATED, probe, probe.outputs[names.index(op.name)])

    # -- phase 5: fused ----------------------------------------------------------------------
    def fused_phase(self, candidate: int) -> Culprit | None:
        """The propagated candidate as a fused culprit, when only a unit with its producers is wrong."""
        if candidate != self.fused_first and (candidate - 1, False) not in self.search_trace.probes:
            return None  # an input of the candidate may be wrong already: not a fusion question
        unit = fused.diagnose(self.session, candidate, self.fused_first, self._upstream_values(candidate))
        return self.fused_culprit(unit) if unit is not None else None

    def fused_culprit(self, unit: fused.FusedUnit) -> Culprit:
        op, verdict = self.session.ops[unit.index], unit.verdict
        return Culprit(op.index, op.name, op.op, op.layer, FUSED, verdict.worst, unit.describe(), verdict.wrong,
                       verdict.evidence, unit=list(zip(unit.ops, unit.names)), source_location=op.source_location, step=op.step)

    def _upstream_values(self, index: int) -> dict | None:
        """The target's values of op `index`'s inputs, from the passing probe of [first, index - 1]."""
        probe = self.probe_results.get(index - 1)
        if probe is None or not probe.ok:
            return None
        wanted = set(self.session.ops[index].inputs)
        return {name: values for name, values in zip(self._frontier(index - 1), probe.outputs) if name in wanted}

    # -- what is searched, and what is shown ------------------------------------------------
    def _search_range(self) -> tuple[int, int, list[str]]:
        """Ops [first, last] the search covers, and notes on what it leaves out.

        A full trace: op 0 to the end of the recorded prefix. A trace recorded with a capture
        budget (--window / --max-bytes) holds tensors for its window only: search the window.
        """
        session = self.session
        count = len(session.ops)
        capture = session.reader.outline.capture
        if capture is None:
            last = self._last_recorded(0)
            incomplete = last < count - 1
            return 0, last, [f"the trace is incomplete: searched ops 0..{last} only"] if incomplete else []
        first = int(capture.get("first", 0))
        end = min(int(capture.get("end", count)), count)
        last = min(self._last_recorded(first), end - 1)
        how = " ".join(f"--{key.replace('_', '-')} {capture[key]}" for key in ("window", "max_bytes")
                       if capture.get(key) is not None)
        return first, last, [f"the trace holds tensors for ops {first}..{end - 1} only (recorded with {how}): "
                             f"searched ops {first}..{last}; record another window to search elsewhere"]

    def _judged(self, start: int, end: int) -> list[int]:
        """Ops [start, end) whose verdicts a search may name: all but the kept ones."""
        return [i for i in range(start, end) if i not in self.kept]

    def _last_recorded(self, first: int) -> int:
        """The last op of the unbroken run of recorded ops from `first`."""
        last = first - 1
        while last + 1 < len(self.session.ops) and (last + 1) in self.session.recorded:
            last += 1
        return last

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
