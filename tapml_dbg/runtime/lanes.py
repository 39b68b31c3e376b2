"""The worker lanes of one session: how many, re-planned when a tracker's server goes away.

`Lanes` is the one `UnitRunner` the engine talks to: `run` one unit on lane 0 (sequential work),
`dispatch` independent units over every lane. It counts the units that ran and what the compile
cache did for them (`cache`), and turns a `target-lost` result (a dropped RPC connection: not the
op's fault) into a `TargetError`, a `trace-error` one (a corrupt recorded value) into a `TraceError`.

Besides the run lanes there are compile lanes (`compile_lanes`: one per core of this machine
but the one the run lane keeps busy, at most `COMPILE_LANES_CAP`; `$TAPML_COMPILE_LANES` sets the
number, 0 turns them off): worker processes that only compile, on this host, into the compile
cache. A dispatch of enough units hands each to them first and to a run lane once its library is
built, so the device runs while the host compiles; over RPC only the run lanes touch the remote
device. They start on first use (forked from the session's zygote: runtime/zygote.py).

On a local target one more worker may run beside the lanes (`run_beside`): a search's chain runs
there while the lanes sweep isolated verdicts, so the two use two cores (`$TAPML_SIDE_LANE=0`: no
side worker).
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from tapml_dbg import settings
from tapml_dbg.errors import TargetError, TraceError, TransformError, UsageError
from tapml_dbg.runtime.background import Background, StopFlag
from tapml_dbg.runtime.compile_cache import UnitIndex
from tapml_dbg.runtime.executor import TargetExecutor
from tapml_dbg.runtime.messages import (BuildRequest, ChainRequest, CompileRequest, CompileResult, UnitRequest,
                                       UnitResult, UnitStatus, WorkerConfig)
from tapml_dbg.runtime.pool import Deferred, Dispatch, ExecutorPool, LanePlan, Pipeline, plan_lanes
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.runtime.zygote import ZygoteSlot

COMPILE_LANES_CAP = 16  # compile lanes by default: one per core but one, at most this many
UNITS_PER_COMPILE_LANE = 48  # a dispatch starts one compile lane per this many units ...
MIN_COMPILE_LANES = 2  # ... and none unless it would start this many (one would only move the compiles)
EARLY_SIDE_MIN_CORES = 4  # cores a machine needs for a search's side worker to start with the session
AHEAD_NICENESS = 10  # the worker building units ahead takes idle cycles only: what a search waits on comes first
AHEAD_UNITS_PER_REQUEST = 128  # units a builder ahead sends its worker at a time (built together where they can be)


def default_compile_lanes() -> int:
    """`$TAPML_COMPILE_LANES` when set (0: compile in the run lanes), else one per core but one, capped.

    On a 2-core machine that is one, below MIN_COMPILE_LANES: units compile in the run lane there,
    as the test suite (two pytest workers on two cores) wants."""
    try:
        chosen = settings.value(settings.COMPILE_LANES)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if chosen is not None:
        return chosen
    return max(0, min((os.cpu_count() or 1) - 1, COMPILE_LANES_CAP))


@dataclass
class CacheReport:
    """What the compile cache did for a session's units: libraries compiled, libraries reused."""

    compiled: int = 0
    reused: int = 0
    compiled_ahead: int = 0  # of `compiled`: built speculatively for a later phase (`Lanes.build_ahead`)
    compiled_keys: list[str] = field(default_factory=list)  # in the order they were built
    keys: set[str] = field(default_factory=set)  # every distinct key a unit had
    remembered: int = 0  # units not run at all: the trace's memo gave them (runtime/run_memo.py)

    def add(self, result: UnitResult, ahead: bool = False) -> None:
        """`ahead`: a speculative build (the phase it was for may never come)."""
        self.remembered += result.units_remembered()
        for key, cached in result.units_built():  # (a unit without a key did not compile, or was compile-only)
            self.keys.add(key)
            if cached:
                self.reused += 1
            else:
                self.compiled += 1
                if ahead:
                    self.compiled_ahead += 1
                self.compiled_keys.append(key)


class UnitRunner(Protocol):
    """What runs units: a pool of worker lanes, one lane, or the recorder's in-process runner."""

    def run(self, request: UnitRequest, timeout_s: float | None = None) -> UnitResult: ...


class Lanes:
    """A pool of worker lanes for one trace and one `TargetSpec`."""

    def __init__(self, trace_path: str, spec: TargetSpec, cache_dir: str, compile_lanes: int | None = None):
        self.spec = spec
        self.plan: LanePlan = plan_lanes(spec.parallel, spec.rpc, spec.tracker, spec.key)
        self.zygotes = ZygoteSlot()  # every worker of the session is forked from one TVM import
        handle, self.ledger_path = tempfile.mkstemp(prefix="tapml-keys-", suffix=".txt")  # compile_cache.KeyLedger
        os.close(handle)
        count = default_compile_lanes() if compile_lanes is None else compile_lanes
        # a chain's worker builds the units it lacks together only where no compile lanes build them side by side
        self.pool = ExecutorPool(WorkerConfig(trace_path=trace_path, spec=spec, cache_dir=cache_dir,
                                              ledger_path=self.ledger_path, together=count < MIN_COMPILE_LANES),
                                 lanes=self.plan.lanes, zygotes=self.zygotes)
        host = spec.with_options(rpc=None, tracker=None, key=None)  # compile lanes never open a device
        self.compile_pool = ExecutorPool(WorkerConfig(trace_path=trace_path, spec=host, cache_dir=cache_dir,
                                                      ledger_path=self.ledger_path),
                                         lanes=count, zygotes=self.zygotes) if count > 0 else None
        self.units = 0  # units that ran (probes, verdicts, compiles)
        self.cache = CacheReport()
        self._replan = False
        self._side: TargetExecutor | None = None
        self._ahead: TargetExecutor | None = None  # `build_ahead`'s worker, while it builds
        self._ahead_stop = StopFlag()
        self._index: UnitIndex | None = None
        self._counting = threading.Lock()
        self._chain_logs: list[str] = []  # `Runtime.chain_log`'s files, removed at close

    @property
    def compile_lanes(self) -> int:
        return self.compile_pool.size if self.compile_pool is not None else 0

    @property
    def size(self) -> int:
        return self.pool.size

    @property
    def retired(self) -> int:
        """Workers of every kind (run lanes, the side worker, compile lanes) retired after a fault
        that could have poisoned them (runtime/executor.py)."""
        workers = self.pool.lanes + ([self._side] if self._side is not None else []) \
            + (self.compile_pool.lanes if self.compile_pool is not None else [])
        return sum(worker.retired for worker in workers)

    def run(self, request: UnitRequest | ChainRequest, timeout_s: float | None = None) -> UnitResult:
        """One unit (or one chain of units) on lane 0 (sequential work)."""
        self._ready()
        return self.counted(self.pool.run(request, timeout_s))

    def start(self, beside: bool = False) -> None:
        """Start lane 0's worker without waiting for it: the zygote imports TVM while the caller
        does its own start-up. `beside`: a search comes first (`bisect`), start its side worker too,
        where there are 4 cores or more (on two cores it measured no faster, with or without the
        zygote: the kernels keep both cores busy anyway; docs/perf.md)."""
        self.pool.lanes[0].start()
        if beside and self.has_side and (os.cpu_count() or 1) >= EARLY_SIDE_MIN_CORES:
            self._side_worker().start()

    @property
    def has_side(self) -> bool:
        """A local target on a machine with a core to spare: a second worker may run beside the lanes."""
        return self.spec.rpc is None and self.spec.tracker is None and (os.cpu_count() or 1) > 1 \
            and settings.value(settings.SIDE_LANE)

    def run_beside(self, request: UnitRequest | ChainRequest, timeout_s: float | None = None) -> UnitResult:
        """One long request (a search's chain) on a worker of its own, while the lanes do other work
        from another thread: its own process, so nothing it does crosses a lane's pipe. Pass the
        result to `counted` from the thread that owns the lanes."""
        side = self._side_worker()
        side.interrupted = False
        return side.run(request, timeout_s)

    def side_interrupted(self) -> bool:
        """Whether the side worker was stopped on purpose (`stop_beside`): nothing more runs on it."""
        return self._side is not None and self._side.interrupted

    def _side_worker(self) -> TargetExecutor:
        if self._side is None:
            self._side = TargetExecutor(self.pool.config, self.zygotes)
        return self._side

    @property
    def index(self) -> UnitIndex:
        """The compile cache's index of units already built under this target and transform."""
        if self._index is None:
            self._index = UnitIndex(Path(self.pool.config.cache_dir), self.spec.target, self.spec.transform)
        return self._index

    def forget_index(self) -> None:
        """The transform file was edited: the next `index` is the one of its new text."""
        self._index = None

    def stop_beside(self) -> None:
        """Kill the side worker (a search interrupted while its chain runs): the waiting thread
        gets a crash result, and the next request starts a fresh worker. Killed only: the thread that
        runs its request reaps it (two threads reaping one worker close its pipe twice: EBADF, or a
        descriptor another lane opened since)."""
        if self._side is not None:
            self._side.interrupt()  # (interrupted: its crash is no fault to run again)

    def build_ahead(self, requests: list[UnitRequest], niceness: int = AHEAD_NICENESS) -> None:
        """Compile units a later phase may run (a search's fused probes) into the cache, one after
        another on a worker of their own at a low priority (`niceness`), AHEAD_UNITS_PER_REQUEST to a
        request (`BuildRequest`: built together where the target allows), while the caller goes on:
        on a machine whose cores the search leaves idle part of the time (the chain compiles one unit
        after another), the phase then finds them built. A unit another worker is building is left to
        it; a failure is left to the unit's run to report. Where there is no core to spare: nothing.
        (The requests are the caller's to make: units are built with TVM's BlockBuilder, whose scope
        stack is one per process, so no second thread may build units while the caller does.)"""
        self.stop_ahead()
        if not requests or not self.has_side:
            return
        config = self.pool.config
        host = config.spec.with_options(rpc=None, tracker=None, key=None)  # it never opens a device
        worker = TargetExecutor(replace(config, spec=host, niceness=niceness, together=True), self.zygotes)
        stop = self._ahead_stop = StopFlag()
        self._ahead = worker

        def build() -> None:
            try:
                for start in range(0, len(requests), AHEAD_UNITS_PER_REQUEST):
                    if stop.is_set():
                        return
                    result = worker.run(BuildRequest(requests[start:start + AHEAD_UNITS_PER_REQUEST]))
                    with self._counting:
                        self.cache.add(result, ahead=True)  # libraries built, no probe of the search
            finally:  # stopped: a worker it started again after the stop's kill is killed too; its log goes
                worker.close(kill=stop.is_set())

        Background(build, "tapml-ahead")

    def stop_ahead(self) -> None:
        """Stop building ahead (the search no longer needs those units): the unit being built is dropped."""
        worker, self._ahead = self._ahead, None
        if worker is not None:
            self._ahead_stop.set()
            worker.interrupt()  # (its thread reaps it)

    def prepare(self, requests: list[UnitRequest], per_lane: int | None = None,
                cancel: threading.Event | None = None) -> list[CompileResult | None]:
        """Compile units into the cache without running them (a chain's, before it runs): side by
        side on the compile lanes when there are enough (one per `per_lane` units, default
        UNITS_PER_COMPILE_LANE), else on the run lanes. A unit that fails to compile is left for
        its run to report. The results in the requests' order (each with its cache key; None for
        a unit not started before `cancel` was set: the units being built finish, no more start).
        A lane does not wait for a key another lane is building (units of different ops often
        have one key): it goes on to the next unit."""
        results: list[CompileResult | None] = [None] * len(requests)
        with self.dispatch(per_lane=per_lane) as work:
            for number, request in enumerate(requests):
                work.submit(number, number, CompileRequest.of(request, ahead=True))
            for number, result in work:
                results[number] = self.counted(result, ran=False)
                if cancel is not None and cancel.is_set():
                    work.cancel_above(-1)
        return results

    def dispatch(self, compiled: bool = False, per_lane: int | None = None) -> Deferred:
        """Independent units for all lanes, compiled on the compile lanes first when there are
        enough of them (one per `per_lane` units; see `ExecutorPool.dispatch`, `Pipeline`); pass
        results to `counted`. `compiled`: their libraries are in the cache already (a search's
        chain built them): straight to the run lanes, no hop through a compile lane per unit."""
        self._ready()
        if compiled:
            return Deferred(lambda _units: self.pool.dispatch())
        return Deferred(lambda units: self._dispatch_for(units, per_lane))

    def _dispatch_for(self, units: int, per_lane: int | None = None) -> Dispatch | Pipeline:
        """One compile lane per `per_lane` units (UNITS_PER_COMPILE_LANE), if that makes MIN_COMPILE_LANES or more."""
        wanted = self._compile_lanes_for(units, per_lane)
        if wanted < MIN_COMPILE_LANES:
            return self.pool.dispatch()
        return self.pool.pipeline(self.compile_pool, compile_lanes=wanted)

    def _compile_lanes_for(self, units: int, per_lane: int | None = None) -> int:
        return min(self.compile_lanes, units // max(1, per_lane or UNITS_PER_COMPILE_LANE))

    def prepares_on_compile_lanes(self, units: int, per_lane: int | None = None) -> bool:
        """Whether `prepare` of this many units runs on the compile lanes only (so that the run
        lanes are free for other work meanwhile)."""
        return self._compile_lanes_for(units, per_lane) >= MIN_COMPILE_LANES

    def start_compile_lanes(self) -> None:
        """Start every compile lane's worker without waiting (a search that will compile ahead:
        they are forked as soon as the zygote has imported TVM, beside the session's start-up)."""
        if self.compile_lanes >= MIN_COMPILE_LANES:
            for lane in self.compile_pool.lanes:
                lane.start()

    def counted(self, result: UnitResult, ran: bool = True) -> UnitResult:
        """Count a unit that ran (`ran=False`: one compiled ahead of the run that needs it, in the cache's
        report only: no unit of a search's); a lost connection or a corrupt recorded value is not the
        op's fault: an error, no verdict. (From a search's thread and a prepare's thread at once.)"""
        with self._counting:
            self.units += int(ran)
            self.cache.add(result)
        if result.status == UnitStatus.TRACE_ERROR:
            raise TraceError(result.message)
        if result.status == UnitStatus.TRANSFORM_ERROR:  # the user's pass raised: no verdict is evidence
            raise TransformError(result.message)
        if result.status == UnitStatus.TARGET_LOST:
            # a server may be gone for good: count the tracker's servers again before the next
            # command, so that no lane waits for a lease that never comes
            self._replan = bool(self.spec.tracker)
            raise TargetError(result.message)
        return result

    def _ready(self) -> None:
        if not self._replan:
            return
        self._replan = False
        self.pool.stop_all()  # our own leases go back first, or the tracker would not count them
        self.plan = plan_lanes(self.spec.parallel, self.spec.rpc, self.spec.tracker, self.spec.key)
        self.pool.resize(self.plan.lanes)

    def close(self) -> None:
        """Stop every worker: all are told first, so they exit side by side (one after another, each
        waits for the last one's teardown; figures: docs/perf.md)."""
        self.stop_ahead()
        workers = self.pool.lanes + ([self._side] if self._side is not None else []) \
            + (self.compile_pool.lanes if self.compile_pool is not None else [])
        for worker in workers:
            worker.ask_to_stop()
        for worker in workers:
            worker.close()
        self.zygotes.close()
        for path in [self.ledger_path, *self._chain_logs]:
            try:
                os.unlink(path)
            except OSError:
                pass
