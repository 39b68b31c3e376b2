"""The overlap policy of a search: what is built ahead of it, what runs beside what, on which worker, and when.

A search hands the runtime one plan and gets one policy object back, `SearchOverlap`
(`Runtime.search_overlap(SearchPlan(...))`, a context manager around the whole search): the engine
says what it wants (phase 2's first fused probes, wanted only when the chain finds nothing; the
chain's units the cache does not hold; then, through `beside_sweep`, its chain beside its sweep)
and reports what its chain found (`chain_done`); when and where each runs is decided here:

- the search begins: what its workers record from now on is its own (the run memo's
  `begin_search`: those records are not "remembered" units);
- building ahead, on idle cycles (`Lanes.build_ahead`): the chain's units from its end (the chain
  builds them from its start: the two meet halfway), and the fused probes first where a core is
  spare beside the chain's worker and the sweep's lane (AHEAD_SPARE_MIN_CORES), or after a search on
  this trace and device whose chain found nothing (the memo's note). Elsewhere the probes are held
  until the chain has found nothing: on two busy cores a probe's build (the whole model's, the size
  of TVM's own build) takes part of a core the chain and the sweep need, and no phase runs it when
  the chain finds the divergence, as it mostly does when a user bisects (figures: docs/perf.md);
- with compile lanes, the chain's units compiled ahead of it on them, in a thread beside the chain
  (`Runtime.compile_ahead`; cancelled on an interrupt, joined before the outcome);
- the chain's end (`chain_done`): found, nothing more is built ahead (no fused probe to make); the
  memo notes what it found, for the next search's choice above; the search's end: building ahead
  stops (what it did not build by now is not wanted).

A bisect's per-op chain (its phase 1) and its sweep of isolated verdicts (phase 4) overlap: the
chain runs on the side worker (`Lanes.run_beside`) from a thread of the runtime's own while the
caller sweeps on the run lanes. The engine hands over a `BesidePlan`, what it wants (the chain's
request, what a suspect's second run is, which ops the sweep has still to do and how a batch of them
is made) and the sweep itself; `ChainBesideSweep` decides how the two share the cores:

- the chain's worker, once its chain stopped at a suspect while the sweep still runs, runs that op
  alone once more (the second run that tells a nondeterministic kernel from a wrong one:
  `Verdicts.explain`) on a core that would otherwise sit idle;
- a chain whose first run found nothing has the held fused probes built now, at the search's own
  priority, beside the rest of the sweep (they are wanted next), and takes the upper
  SIDE_SWEEP_SHARE of the ops the sweep has not reached yet, when they are SIDE_SWEEP_MIN_OPS or
  more, as one screened batch: its worker has just read every recorded value the chain screened, so
  an op costs it a fraction of what it costs a lane (figures: docs/perf.md); the sweep stops below
  them (`SweepBeside.bound`);
- the sweep's lane, once the sweep is done while the chain still runs, runs the lowest op the sweep
  found failing alone once more (the same second run, from the other side);
- the sweep follows the chain (`SweepBeside.chain_done`, `wait`): the waiting is here, not in the
  engine. The chain's worker, another process, tells how far it got only through its log file
  (runtime/chain_log.py), so the sweep looks at the log every FOLLOW_POLL_S while it waits; the
  chain's return (or its thread's end) wakes it at once;
- Ctrl-C or a lost target: the compiles ahead are cancelled, the side worker is killed (nothing it
  runs outlives the search), and its thread is joined.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from tapml_dbg.errors import TraceError
from tapml_dbg.runtime.background import Background
from tapml_dbg.runtime.messages import BatchResult, ChainRequest, ChainResult, UnitRequest, UnitResult

SIDE_SWEEP_MIN_OPS = 64  # the sweep's ops left when the chain is done that are worth a run beside it
SIDE_SWEEP_SHARE = 0.75  # the part of them the chain's worker takes (see the module docstring)
FOLLOW_POLL_S = 0.02  # how often a sweep that follows a chain looks at the chain's log while it waits
AHEAD_SPARE_MIN_CORES = 3  # a core beside the chain's worker and the sweep's lane: probes built ahead cost nothing

Spare = tuple[int, UnitRequest]  # (op, its isolated unit): a run made once more, for the op's second verdict


class SideLanes(Protocol):
    """What the policy uses of the session's `Runtime` (runtime/scheduler.py, which imports this module)."""

    def run(self, request, timeout_s: float | None = None) -> UnitResult: ...
    def run_beside(self, request, timeout_s: float | None = None) -> UnitResult: ...
    def counted(self, result: UnitResult, ran: bool = True) -> UnitResult: ...
    def stop_beside(self) -> None: ...
    def side_interrupted(self) -> bool: ...
    def chain_timeout(self, units: int) -> float: ...


class SearchLanes(SideLanes, Protocol):
    """What the search's policy uses of the `Runtime` besides the side lanes: building ahead."""

    def build_ahead(self, requests: list[UnitRequest], niceness: int = ...) -> None: ...
    def stop_ahead(self) -> None: ...
    def compile_ahead(self, units: list[UnitRequest], wait: bool = True) -> Background | None: ...


class SearchMemo(Protocol):
    """What the policy uses of the run memo (runtime/run_memo.py): the search's start, and its note."""

    def begin_search(self) -> None: ...
    def last_search(self) -> dict | None: ...
    def note_search(self, chain_found: bool) -> None: ...


@dataclass(frozen=True)
class BesidePlan:
    """What the engine wants run beside its sweep (what; `ChainBesideSweep` decides how).

    `chain`: the chain's first request, `timeout` its limit; `bound_of(result)`: the highest op a sweep
    still needs once the chain's run is back (None: every op); `spare_of(result)`: the op the chain
    stopped at and its isolated unit (None: no such run); `left()`: the ops the sweep has still to
    settle once the chain found nothing; `batch_of(ops)`: a screened batch of them (request, the ops
    it holds); `lowest_failing()`: the lowest op the sweep found failing and its isolated unit;
    `on_start()`: the caller's own work once the chain is started (a warm-up)."""

    chain: ChainRequest
    timeout: float
    bound_of: Callable[[ChainResult], int | None]
    spare_of: Callable[[ChainResult], Spare | None]
    left: Callable[[], list[int]]
    batch_of: Callable[[list[int]], tuple[UnitRequest, list[int]]]
    lowest_failing: Callable[[], Spare | None]
    on_start: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class BesideOutcome:
    """What ran beside the sweep, every result counted: the chain's first run; the sweep's upper part run
    on the chain's worker (the ops, the batch's result, the suspects at which it stops); the runs made
    once more for an op's second verdict, on the chain's worker (`side_spare`) or on the sweep's lane
    once the sweep was done (`lane_spare`), each (op, result), and how many units they took."""

    chained: ChainResult
    top: tuple[list[int], BatchResult, int] | None = None
    side_spare: tuple[int, UnitResult] | None = None
    lane_spare: tuple[int, UnitResult] | None = None
    spare_units: int = 0


class SweepBeside:
    """The sweep's view of the chain beside it: how far it may go, and whether the chain is done."""

    def __init__(self, policy: "ChainBesideSweep"):
        self._policy = policy

    def bound(self) -> int | None:
        """The highest op the sweep still needs (None: every op): below the chain's worker's share, else
        the chain's first suspect once the chain is back."""
        policy = self._policy
        if policy.split is not None:
            return policy.split - 1
        return policy.plan.bound_of(policy.chained) if policy.chained is not None else None

    def building(self) -> bool:
        """The compile lanes still build the chain's units ahead."""
        building = self._policy.building
        return building is not None and building.is_alive()

    def chain_done(self) -> bool:
        """The chain's run is back (or its thread ended): what it did not reach is the sweep's."""
        running = self._policy.running
        return self._policy.chained is not None or running is None or not running.is_alive()

    def wait(self) -> None:
        """Wait a moment for the chain to go on (the sweep has nothing to run until it does): until its
        log may say more (FOLLOW_POLL_S: the worker, another process, writes a file), or at once when
        the chain's run is back."""
        self._policy.chain_back.wait(FOLLOW_POLL_S)


class ChainBesideSweep:
    """One search's chain on the side worker beside its sweep on the lanes (`SearchOverlap.beside_sweep`)."""

    def __init__(self, runtime: SideLanes, plan: BesidePlan, building: Background | None = None,
                 found_nothing: Callable[[], None] = lambda: None):
        """`building`: the compiles ahead of the chain (cancelled on an interrupt, joined before the
        outcome); `found_nothing()`: the search's policy, told from the chain's thread that the chain's
        first run found nothing (`SearchOverlap`: the held fused probes are wanted next)."""
        self.runtime, self.plan, self.building = runtime, plan, building
        self.found_nothing = found_nothing
        self.chain_back = threading.Event()  # set once `chained` is (or the chain's thread ended without it)
        self.chained: ChainResult | None = None  # the chain's run, once back (set by the chain's thread)
        self.split: int | None = None  # the sweep's ops from here on run on the chain's worker
        self.top: tuple[list[int], BatchResult, int] | None = None
        self.side_spare: tuple[int, UnitResult] | None = None
        self.sweeping = False
        self.running: Background | None = None

    def run(self, sweep: Callable[[SweepBeside], None]) -> BesideOutcome:
        """The chain beside `sweep(view)`, the sweep in the caller's thread; what ran beside it."""
        self.sweeping = True
        self.running = Background(self._chain_then_top, "tapml-chain")
        building = self.building
        try:
            self.plan.on_start()
            lane_spare, units = self._sweep(sweep)
        except BaseException:  # Ctrl-C, a lost target: the chain's worker must not outlive the search,
            if building is not None:  # nor its compiles ahead (the next command's units use those lanes)
                building.cancel()
            self.runtime.stop_beside()
            raise
        finally:
            self.running.join()
            if building is not None:
                building.join()  # its keys are in the index before the chain's own (ChainSearch.remember)
        chained = self.runtime.counted(self.running.result())
        top = None
        if self.top is not None:
            held, result, most = self.top
            top = (held, self.runtime.counted(result), most)
        side_spare = None
        if self.side_spare is not None and self.side_spare[1].ok:  # a unit to classify the culprit, not to find it
            side_spare = (self.side_spare[0], self.runtime.counted(self.side_spare[1]))
            units += 1
        return BesideOutcome(chained, top, side_spare, lane_spare, units)

    def _sweep(self, sweep: Callable[[SweepBeside], None]) -> tuple[tuple[int, UnitResult] | None, int]:
        """The sweep; then, while the chain goes on, the lowest op it found failing run once more on the
        sweep's lane, which would sit idle until the chain is done: (that run, units run)."""
        try:
            sweep(SweepBeside(self))
        finally:
            self.sweeping = False
        if not self.running.is_alive():
            return None, 0
        spare = self.plan.lowest_failing()
        if spare is None:
            return None, 0
        index, request = spare
        try:
            return (index, self.runtime.run(request)), 1
        except TraceError:  # as `Verdicts.explain` does: the verdict stands without its second run
            return None, 1

    def _chain_then_top(self) -> ChainResult:
        """The chain on the side worker, then what its worker does next (`_after_chain`)."""
        try:
            result = self.runtime.run_beside(self.plan.chain, self.plan.timeout)
            self.chained = result
        finally:
            self.chain_back.set()
        return self._after_chain(result)

    def _after_chain(self, result: ChainResult) -> ChainResult:
        """Its suspect's second run (`_spare_run_beside`); or, when it found nothing (the sweep then has
        every op to do), the upper part of the ops the sweep has not reached yet, on the same worker,
        while the lanes sweep the rest: the chain's worker does not sit idle."""
        runtime = self.runtime
        if result.suspects:
            self._spare_run_beside(result)
            return result
        self.found_nothing()  # (a chain that died says nowhere: the fused probes search it)
        if not result.ok:
            return result
        top = side_share(self.plan.left())
        if not top:
            return result
        batch, held = self.plan.batch_of(top)
        if held:
            self.split = held[0]
            self.top = (held, runtime.run_beside(batch, runtime.chain_timeout(len(held))), batch.suspects)
        return result

    def _spare_run_beside(self, result: ChainResult) -> None:
        """The chain's first suspect alone on recorded inputs, on the chain's worker while the sweep
        reaches the op on another: in another process than the first run (another layout of memory
        for a stray read). Not once the sweep is done: the chain's worker is then what the search
        waits on."""
        if not self.sweeping:
            return
        spare = self.plan.spare_of(result)
        if spare is not None and not self.runtime.side_interrupted():
            self.side_spare = (spare[0], self.runtime.run_beside(spare[1]))


def side_share(left: list[int], share: float = SIDE_SWEEP_SHARE, least: int = SIDE_SWEEP_MIN_OPS) -> list[int]:
    """The upper `share` of the ops a sweep has left, for the chain's worker ([]: fewer than `least`)."""
    top = left[int(len(left) * (1 - share)):]
    return top if len(top) >= least else []


@dataclass(frozen=True)
class SearchPlan:
    """What a search wants built ahead of it (what; `SearchOverlap` decides when and where): phase 2's
    first fused probes, wanted only when the chain finds nothing (`probes_ahead`), and the chain's
    units the cache does not hold yet, in the chain's order (`chain_units`)."""

    probes_ahead: list[UnitRequest]
    chain_units: list[UnitRequest]


class SearchOverlap:
    """One search's overlap policy from its start to its end (`Runtime.search_overlap`; the module
    docstring says what it decides). Use it as a context manager around the whole search: entering
    it begins the search and starts building ahead; `beside_sweep` runs the chain beside the sweep;
    `chain_done` takes what the chain found; leaving it stops building ahead."""

    def __init__(self, runtime: SearchLanes, plan: SearchPlan, memo: SearchMemo | None):
        self.runtime, self.plan, self.memo = runtime, plan, memo
        self._held: list[UnitRequest] = []  # the fused probes, until the chain found nothing

    def __enter__(self) -> "SearchOverlap":
        if self.memo is not None:  # records from here on are this search's own, not earlier runs'
            self.memo.begin_search()
        chain_units = self.plan.chain_units[::-1]  # from the chain's end: the chain builds them from its start
        if self._probes_ahead_wanted():
            self.runtime.build_ahead(self.plan.probes_ahead + chain_units)
        else:
            self._held = list(self.plan.probes_ahead)
            self.runtime.build_ahead(chain_units)
        return self

    def __exit__(self, *_exc) -> None:
        self.runtime.stop_ahead()  # what it did not build by now is not wanted

    def beside_sweep(self, plan: BesidePlan, sweep: Callable[[SweepBeside], None]) -> BesideOutcome:
        """The search's chain (`plan`) on the side worker while `sweep(view)` runs in the caller's thread
        on the lanes, its units compiled ahead on the compile lanes meanwhile; what ran beside, counted."""
        building = self.runtime.compile_ahead(self.plan.chain_units, wait=False)
        return ChainBesideSweep(self.runtime, plan, building, self._chain_found_nothing).run(sweep)

    def chain_done(self, found: bool) -> None:
        """The chain is done: `found`, the divergence (no fused probe to make, so nothing more is built
        ahead). Noted for the next search's choice of what to build ahead."""
        if self.memo is not None:
            self.memo.note_search(found)
        if found:
            self.runtime.stop_ahead()

    def _chain_found_nothing(self) -> None:
        """The chain's first run is back without a suspect (from the chain's thread): the fused probes
        are wanted next, so the ones held are built now, at the search's own priority, beside the
        rest of the sweep."""
        held, self._held = self._held, []
        if held and not self.runtime.side_interrupted():  # (Ctrl-C: no phase follows)
            self.runtime.build_ahead(held, niceness=0)

    def _probes_ahead_wanted(self) -> bool:
        """The fused probes are built from the start: a core is spare, or the last search's chain on this
        trace and device found nothing."""
        if (os.cpu_count() or 1) >= AHEAD_SPARE_MIN_CORES:
            return True
        noted = self.memo.last_search() if self.memo is not None else None
        return bool(noted) and not noted.get("chain_found")
