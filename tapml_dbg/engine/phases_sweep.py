"""Phase 4 of a bisect, the isolated sweep, and what it asks the runtime to run beside the per-op chain.

The sweep judges every op below the candidate alone on recorded inputs, so that an op wrong alone by
less than its propagated bound (or one whose error washes out before the model's output) is still
found: the lowest failing op wins. The screen clears most ops without a verdict, and an op whose
chained value cleared the isolated screen already is not run alone: the chain logs each outcome as it
goes and the sweep follows that log (`isolated.ChainLead`, deciding by `phases.follow_chain`).

Where there is a side worker, the sweep runs while the chain does: this phase states what it wants
beside it as a `BesidePlan` (the chain's request, the second run of the chain's first suspect or of
the sweep's lowest failing op, which ops are left and how a batch of them is made) and takes in what
ran (`take`); when and on which worker is the runtime's overlap policy (runtime/overlap.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Callable, Container, Protocol

from tapml_dbg.engine.isolated import ChainLead, IsolatedVerdicts, SweepPlan
from tapml_dbg.judge.verdict import Verdict
from tapml_dbg.portable.screen import ScreenRule
from tapml_dbg.runtime.scheduler import BesidePlan


class ChainLog(Protocol):
    """The chain's log as the sweep reads it (`Runtime.chain_log`, runtime/chain_log.py)."""

    path: str
    reached: set[str]
    cleared: set[str]

    def refresh(self) -> None: ...


class IsolatedSweep:
    """The isolated sweep of ops [first, last] of one search (kept ops are never swept)."""

    def __init__(self, verdicts: IsolatedVerdicts, span: tuple[int, int], kept: Container[int],
                 rules: tuple[ScreenRule | None, set[str]], chain_log: ChainLog | None,
                 on_start: Callable[[], None], progress: Callable[..., None]):
        """`verdicts`: the session's isolated-verdict cache; `span`: (first, last); `kept`: ops never swept
        (engine/kept.py); `rules`: (the isolated screen, the ops only a full verdict may judge); `chain_log`:
        the log the chain writes and the sweep follows (None: it follows none); `on_start`: what the caller
        does once the chain is started beside it (a warm-up)."""
        self.verdicts = verdicts
        self.first, self.last = span
        self.kept = kept
        self.screen, self.unscreened = rules
        self.chain_log = chain_log
        self.on_start = on_start
        self.progress = progress

    @cached_property
    def _index(self) -> dict[str, int]:
        return {op.name: op.index for op in self.verdicts.ops}

    def judged(self, start: int, end: int) -> list[int]:
        """Ops [start, end) whose verdicts a search may name: all but the kept ones."""
        return [i for i in range(start, end) if i not in self.kept]

    @property
    def plan(self) -> SweepPlan:
        """The search's sweeps: screened, their units prepared ahead or built by a run lane itself."""
        return SweepPlan(screen=self.screen, unscreened=self.unscreened, compiled=True)

    def lowest_failing(self, end: int, also: tuple[int, ...] | None = None) -> Verdict | None:
        """The lowest failing op of [first, end) (`also`: ops whose verdict is wanted anyway, run first)."""
        plan = self.plan if also is None else replace(self.plan, also=also)
        return self.verdicts.lowest_failing(self.judged(self.first, end), plan, self.progress)

    # -- beside the chain -----------------------------------------------------------------------
    def plan_beside(self, request, timeout: float, bound_of: Callable) -> BesidePlan:
        """What this sweep wants run beside it while the chain's `request` runs (`bound_of(result)`: the
        highest op the sweep still needs once the chain is back)."""
        return BesidePlan(chain=request, timeout=timeout, bound_of=bound_of, spare_of=self._suspect_spare,
                          left=self._left, batch_of=self._side_batch, lowest_failing=self._lowest_failing_spare,
                          on_start=self.on_start)  # (not before its request: the import holds the GIL)

    def follow(self, beside) -> None:
        """The sweep beside the chain (`beside`: the runtime's view of it), following the chain's log;
        while the compile lanes build ahead, it runs the ops whose units are built and leaves the others
        to the end (it does not wait for a build the chain waits for too)."""
        plan = replace(self.plan, stop_at_failure=True, bound=beside.bound, building=beside.building,
                       lead=ChainLead(self.chain_log, beside.chain_done, beside.wait)
                       if self.chain_log is not None else None)
        self.verdicts.fill(self.judged(self.first, self.last + 1), plan, self.progress)

    def take(self, beside) -> int:
        """What ran beside the sweep (`SearchOverlap.beside_sweep`'s outcome), taken in; the units run to
        classify the culprit (its second run), not to find it."""
        verdicts = self.verdicts
        if beside.top is not None:  # the sweep's upper part, run beside it once the chain was done
            verdicts.absorb(*beside.top)
        for spare in (beside.lane_spare, beside.side_spare):
            if spare is not None:
                verdicts.add_spare_run(*spare)
        return beside.spare_units

    def chain_cleared(self) -> None:
        """The ops whose chained values cleared the isolated screen, as far as the chain's log says:
        settled for every sweep of this search (`isolated.ChainLead`)."""
        if self.chain_log is None:
            return
        self.chain_log.refresh()
        self.verdicts.screened.update(self._index[name] for name in self.chain_log.cleared if name in self._index)

    def _suspect_spare(self, chained):
        """The chain's first suspect and its isolated unit, for a second run beside the sweep (None: none)."""
        index = self._index[chained.suspects[0]]
        request = self._spare_request(index)
        return (index, request) if request is not None else None

    def _left(self) -> list[int]:
        """The ops the sweep has still to settle, once the chain (done, having found nothing) is read."""
        self.chain_cleared()
        verdicts = self.verdicts
        return [i for i in self.judged(self.first, self.last + 1)
                if i not in verdicts.cache and i not in verdicts.screened and verdicts.ops[i].outputs]

    def _side_batch(self, ops: list[int]):
        """A screened batch of `ops` for the chain's worker: (request, the ops it holds)."""
        return self.verdicts.requests.isolated_batch(ops, self.screen, self.unscreened)

    def _lowest_failing_spare(self):
        """The lowest op the sweep found failing and its isolated unit, for a second run (None: none)."""
        verdicts = self.verdicts
        failed = verdicts.lowest_failed(self.judged(self.first, self.last + 1))
        if failed is None or verdicts.failed_runs.get(failed.index) is None:
            return None
        request = self._spare_request(failed.index)
        return (failed.index, request) if request is not None else None

    def _spare_request(self, index: int):
        """Op `index`'s isolated unit for a spare run (None: the trace cannot feed it)."""
        request = self.verdicts.request(index)
        return None if isinstance(request, Verdict) else request
