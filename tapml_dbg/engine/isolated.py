"""Isolated verdicts (each op alone on recorded inputs), cached, one unit per op, over every lane.

Each op is its own unit, so the compile cache (keyed by the unit's structure after the user's
transform) compiles an op once however many identical copies of it the model holds (GPT-2 124M:
717 ops, 68 distinct units), and an edited transform recompiles only the ops it changes. The
units of a sweep go through `Runtime.dispatch`: compiled side by side on the compile lanes, run
as they are built; a crash is that op's verdict only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable

from tapml_dbg.engine.phases import follow_chain
from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.judge.verdict import ISOLATED, Status, Verdict
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.portable.screen import ScreenRule
from tapml_dbg.runtime.scheduler import Runtime
from tapml_dbg.runtime.messages import BatchResult, Result, UnitRequest, UnitResult, UnitStatus

SWEEP_BATCH = 32  # screened isolated runs per request: one round trip instead of 32 (a search's stop at a suspect)
KEPT_FAILED_RUNS = 4  # failing ops whose outputs are kept for their second run (Verdicts.explain)

Judge = Callable[[int, str, Result, list], Verdict]  # (index, mode, result, outputs) -> verdict
Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass(frozen=True)
class SweepPlan:
    """How a sweep of isolated verdicts runs (the ops themselves are `fill`'s first argument).

    `screen`: ops whose outputs clearly pass it get no verdict, only the knowledge that they pass
    (judge/screen.py): what a search needs, at a fraction of the cost; the ops then run SWEEP_BATCH to
    a request. `unscreened`: ops only a full verdict may judge. `stop_at_failure`: units above the first
    failing op are not started (the lowest failing op is then the one a sequential sweep finds,
    whatever the lane count). `compiled`: the units' libraries are cached already
    (`Runtime.dispatch`). `also`: ops whose verdict is wanted anyway (a bisect's candidate): their
    units go first and are never cancelled. `bound()`, asked after each result: the highest op still
    wanted, once it is known (None: all of them). `building()`: compile lanes are building units
    ahead; while they do, a batch skips the ops whose units are not built yet instead of waiting for
    them, and those ops run once everything else has. `lead`: a chain running beside the sweep
    (`ChainLead`), which the sweep follows instead of starting every op at once.
    """

    screen: ScreenRule | None = None
    unscreened: frozenset[str] | set[str] = frozenset()
    stop_at_failure: bool = False
    compiled: bool = False
    also: tuple[int, ...] = ()
    bound: Callable[[], int | None] | None = None
    building: Callable[[], bool] | None = None
    lead: "ChainLead | None" = None


@dataclass(frozen=True)
class ChainLead:
    """A chain that a sweep beside it follows (runtime/chain_log.py): an op is run alone only once the
    chain has been past it, and not at all when the chain's value of it cleared the isolated screen
    (the op's kernel, fed the target's own values of its inputs, gave a value that passes the
    isolated rule, which is what running it alone on the recorded inputs would be asked). `log`: the
    chain's (`Runtime.chain_log`); `done()`: the chain has ended (what it did not reach is swept);
    `wait()`: the runtime's wait for the chain to go on, when the sweep has nothing else to run."""

    log: object
    done: Callable[[], bool]
    wait: Callable[[], None]


class IsolatedVerdicts:
    """The isolated-verdict cache of one session, and the ways to fill it."""

    def __init__(self, ops: list[OpInfo], requests: RequestBuilder, lanes: Runtime, judge: Judge):
        self.ops = ops
        self.requests = requests
        self.lanes = lanes
        self.judge = judge
        self.cache: dict[int, Verdict] = {}
        self.screened: set[int] = set()  # ops whose isolated run clearly passed the screen (no verdict kept)
        self.failed_runs: OrderedDict[int, UnitResult] = OrderedDict()  # the last few failing ops' runs
        self.spare_runs: dict[int, UnitResult] = {}  # a run made beside a search, for a second one (`runs_of`)

    def clear(self) -> None:
        self.cache.clear()
        self.screened.clear()
        self.failed_runs.clear()
        self.spare_runs.clear()

    def runs_of(self, index: int) -> list[UnitResult]:
        """Runs of op `index`'s isolated unit made already, for `Verdicts.explain`'s two: the one a
        failing verdict was judged from (one of the last KEPT_FAILED_RUNS) first, then one a search
        made beside its sweep (`add_spare_run`). A spare run is used once."""
        runs = [run for run in (self.failed_runs.get(index), self.spare_runs.pop(index, None)) if run is not None]
        return runs[:2]

    def add_spare_run(self, index: int, result: UnitResult) -> None:
        """A run of op `index`'s isolated unit made on a worker that would sit idle: a search's chain
        worker once its chain stopped at the op, or the sweep's lane once the sweep stopped at it."""
        if result.ok:
            self.spare_runs[index] = result

    def get(self, index: int) -> Verdict:
        """One op's isolated verdict (a `missing` one, not cached, when the trace lacks its values)."""
        if index in self.cache:
            return self.cache[index]
        request = self.request(index)
        if isinstance(request, Verdict):
            return request
        return self.done(index, self.lanes.run(request))

    def value(self, index: int) -> list | None:
        """Op `index`'s target value fed recorded inputs, the one its isolated verdict compares (None:
        its run failed); run again, not cached (the REPL's `print`)."""
        name = self.ops[index].name
        result = self.lanes.run(self.requests.ops_request([name], [name]))
        return result.outputs[0] if result.ok else None

    def request(self, index: int) -> UnitRequest | Verdict:
        request = self.requests.isolated(index)
        if isinstance(request, str):  # nothing to feed it or to compare with: say so without compiling
            return Verdict(index, self.ops[index].name, ISOLATED, Status.MISSING, message=request)
        return request

    def done(self, index: int, result: UnitResult) -> Verdict:
        verdict = self.judge(index, ISOLATED, result, result.outputs[0] if result.ok else None)
        self.cache[index] = verdict
        if verdict.failed and result.ok:
            self.failed_runs[index] = result
            while len(self.failed_runs) > KEPT_FAILED_RUNS:
                self.failed_runs.popitem(last=False)
        return verdict

    def lowest_failing(self, indices: list[int], plan: SweepPlan = SweepPlan(),
                       progress: Progress = _noop) -> Verdict | None:
        """The sweep: verdicts for `indices` until the lowest failing one is known; that verdict, if any
        (`plan`, its `stop_at_failure` set)."""
        self.fill(indices, replace(plan, stop_at_failure=True), progress)
        return self.lowest_failed(indices)

    def lowest_failed(self, indices: list[int]) -> Verdict | None:
        """The first of `indices` whose cached verdict fails (nothing runs)."""
        return next((self.cache[i] for i in indices if i in self.cache and self.cache[i].failed), None)

    def fill(self, indices: list[int], plan: SweepPlan = SweepPlan(), progress: Progress = _noop) -> None:
        """Fill the cache for `indices` as `plan` says: one unit per op (a batch of them per request
        when screened), lowest first, over all lanes. A batch that fails part-way runs its remaining
        ops one unit each, so that a crash is one op's verdict.
        """
        first = [i for i in dict.fromkeys(plan.also) if i not in self.cache]
        known = self.screened if plan.screen is not None else set()
        todo = [i for i in dict.fromkeys(indices)
                if i not in self.cache and i not in known and i not in first and self.ops[i].outputs]
        with self.lanes.dispatch(plan.compiled) as work:
            _Sweep(self, work, plan, todo, set(indices), progress).run(first)

    def _results(self, tag, result: UnitResult | BatchResult, work, submit_batch: Callable[[list[int]], None],
                 defer: Callable[[int], None]):
        """(op, verdict) of each op a result settles (verdict None: cleared by the screen); the ops
        it skipped go to `defer`."""
        if not (isinstance(tag, tuple) and tag[0] == "batch"):
            yield tag, self.done(tag, result)
            return
        _batch, held, most = tag  # most: the suspects at which the worker stops
        batch = list(held)
        names = [self.ops[i].name for i in batch]
        suspects = dict(zip(result.suspects, result.outputs))
        skipped = set(result.deferred)
        if not result.ok:
            ran = names.index(result.failed_op) if result.failed_op in names else 0
        elif len(result.suspects) >= most:  # it stopped at its last suspect
            ran = names.index(result.suspects[-1]) + 1
        else:
            ran = len(batch)
        for index, name in zip(batch[:ran], names[:ran]):
            if name in skipped:
                defer(index)
            elif name in suspects:
                yield index, self.done(index, UnitResult(UnitStatus.OK, outputs=[suspects[name]]))
            else:
                self.screened.add(index)
                yield index, None
        if result.ok:
            if batch[ran:]:
                submit_batch(batch[ran:])
            return
        for index in batch[ran:]:  # one unit each from the op that did not run: its own verdict
            self._submit(work, index, index)

    def absorb(self, held: list[int], result: BatchResult, most: int) -> None:
        """A screened batch (`RequestBuilder.isolated_batch` of `held`, stopping at its `most`-th suspect)
        that ran beside a sweep: the ops it ran are settled as `fill` settles them; those it did not run,
        and all of a batch that failed, are left to the next sweep."""
        if result.ok:
            for _settled in self._results(("batch", tuple(held), most), result, None, lambda _batch: None,
                                          lambda _index: None):
                pass

    def fill_window(self, indices: list[int]) -> None:
        """Verdicts of a few ops side by side, one unit each (the neighbourhood of a culprit)."""
        if self.lanes.size == 1:
            return  # `get` computes them one by one anyway
        with self.lanes.dispatch() as work:
            for i in indices:
                if i not in self.cache:
                    self._submit(work, i, i)
            for i, result in work:
                self.done(i, self.lanes.counted(result))

    def _submit(self, work, key, index: int) -> None:
        request = self.request(index)
        if isinstance(request, UnitRequest):  # else `get` says why it has no verdict, without compiling
            work.submit(key, index, request)


class _Sweep:
    """One `fill`: its units in flight (`work`), the ops it has left, and how far a chain it follows has got."""

    def __init__(self, verdicts: IsolatedVerdicts, work, plan: SweepPlan, todo: list[int], wanted: set[int],
                 progress: Progress):
        self.verdicts, self.work, self.plan, self.progress = verdicts, work, plan, progress
        self.todo, self.swept, self.wanted = todo, set(todo), wanted
        self.finished = 0
        self.later: list[int] = []  # ops a batch skipped, their units not built yet
        # ops the lead has not passed yet
        self.following = list(todo) if plan.lead is not None and plan.screen is not None else []
        self.cut: int | None = None  # no op above it is wanted any more

    def run(self, first: list[int]) -> None:
        plan, work = self.plan, self.work
        for index in first:  # first, and never cancelled
            self.verdicts._submit(work, -1, index)
        if plan.screen is not None and plan.lead is None:
            for batch in chunks(self.todo, SWEEP_BATCH):
                self.submit_batch(batch)
        elif plan.screen is None:
            for index in self.todo:
                self.verdicts._submit(work, index, index)
        while True:
            if self.following:
                self.follow()
            for tag, result in work:
                self.settle(tag, result)
            if self.later:
                for batch in chunks(sorted(self.later), SWEEP_BATCH):  # built by now, or waited for
                    self.submit_batch(batch, defer=False)
                self.later.clear()
                continue
            if not self.following:  # (`follow` drops the ops above a failure or the bound)
                return
            if not work.pending:
                self.plan.lead.wait()  # (the runtime's: nothing to run until the chain goes on)

    def settle(self, tag, result: UnitResult | BatchResult) -> None:
        verdicts = self.verdicts
        for index, verdict in verdicts._results(tag, verdicts.lanes.counted(result), self.work, self.submit_batch,
                                                self.later.append):
            if index in self.swept:
                self.finished += 1
                self.progress(self.finished, len(self.todo), f"isolated sweep op {index}")
            if self.plan.stop_at_failure and verdict is not None and verdict.failed and index in self.wanted:
                self.cancel_above(index)
        self.apply_bound()

    def submit_batch(self, batch: list[int], defer: bool = True) -> None:
        """A sweep that stops at the first failure stops each batch at its first suspect: the ops after it
        are not needed when it fails, and go again as a batch when it passes; `defer`: skip unbuilt units
        while the compile lanes are still building."""
        plan = self.plan
        defer = defer and plan.building is not None and plan.building()
        request, held = self.verdicts.requests.isolated_batch(batch, plan.screen, plan.unscreened,
                                                              stop_at_suspect=plan.stop_at_failure,
                                                              defer_unbuilt=defer)
        if held:
            self.work.submit(held[0], ("batch", tuple(held), request.suspects), request)

    def follow(self) -> None:
        """Settle or submit the ops the lead has passed (`phases.follow_chain`); the rest wait."""
        lead = self.plan.lead
        lead.log.refresh()
        done = lead.done()
        self.apply_bound()
        ops = self.verdicts.ops
        step = follow_chain(self.following, lambda index: ops[index].name, lead.log.reached, lead.log.cleared,
                            done, self.cut, SWEEP_BATCH)
        for index in step.cleared:  # its chained value cleared the isolated screen
            self.verdicts.screened.add(index)
            self.finished += 1
            self.progress(self.finished, len(self.todo), f"isolated sweep op {index} (cleared by the chain)")
        for batch in step.batches:
            self.submit_batch(list(batch))
        self.following = list(step.waiting)

    def apply_bound(self) -> None:
        limit = self.plan.bound() if self.plan.bound is not None else None
        if limit is not None:
            self.cancel_above(limit)

    def cancel_above(self, index: int) -> None:
        self.cut = index if self.cut is None else min(self.cut, index)
        self.work.cancel_above(index)


def chunks(indices: list[int], size: int) -> list[list[int]]:
    """Split indices into runs of at most `size`, for batched isolated sweeps."""
    return [indices[start:start + size] for start in range(0, len(indices), max(size, 1))]
