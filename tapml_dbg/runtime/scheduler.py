"""The runtime's one entry point for the engine: it takes what to run, and decides how.

The engine imports three runtime modules (DESIGN.md, "Architecture"; tests/test_layers.py): the
plan messages (`messages`: units, chains, batches and their typed results), the target spec
(`target`) and this one. What the engine states here is *what* it wants: a unit or chain run, a
batch of independent units dispatched, a piece of its own work run beside the caller, a search's
plan (what it may want built ahead, its chain beside its sweep) and what its chain found. *How* stays
in runtime/: the worker lanes and the side worker (`lanes`), a search's overlap policy (`overlap`:
what is built ahead and when, what runs beside what), compile lanes and the minimum that makes them
worth starting, the compile cache's unit index (which units are built: its bookkeeping), threads
(`background`), the TVM and torch imports
(`tvm_import`), transforms and their identity (`compile_cache`). A change to the search's
scheduling touches runtime/ only.
"""

from __future__ import annotations

import math
import os
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from tapml_dbg.errors import TapmlError
from tapml_dbg.runtime.background import Background, StopFlag, Stream
from tapml_dbg.runtime.chain_log import ChainLog
from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR, load_transform, transform_identity
from tapml_dbg.runtime.lanes import MIN_COMPILE_LANES, Lanes
from tapml_dbg.runtime.messages import ChainRequest, ChainResult, UnitRequest, UnitResult
from tapml_dbg.runtime.overlap import BesidePlan, SearchOverlap, SearchPlan
from tapml_dbg.runtime.run_memo import RunMemo
from tapml_dbg.runtime.target import TargetSpec, parse_target
from tapml_dbg.runtime.tvm_import import import_tvm_without_torch, warm_up_torch

__all__ = ["DEFAULT_CACHE_DIR", "Background", "BesidePlan", "Runtime", "SearchOverlap", "SearchPlan", "check_setup",
           "transform_identity", "transform_retyped", "warm_up_torch"]

T = TypeVar("T")
OPS_PER_TIMEOUT = 100  # a chain may take the unit timeout once per this many ops
PREPARE_UNITS_PER_LANE = 4  # building ahead starts a compile lane per this many units to build
SERIES_AHEAD_BYTES = 256 * 2**20  # a series made beside the caller keeps at most this much waiting to be taken


def check_setup(spec: TargetSpec) -> None:
    """Fail early, with the one-line error, on a bad target string or transform FILE.py:FUNC; TVM is
    imported without torch (torch comes when a verdict needs it: runtime/tvm_import.py)."""
    import_tvm_without_torch()
    parse_target(spec.target)
    load_transform(spec.transform)


def transform_retyped(spec: TargetSpec) -> dict[str, str]:
    """The bindings whose output dtype the user's transform changes, as its FUNC says (`FUNC.retyped`,
    binding name -> dtype: what `tapml-dbg fix`'s casts set): replay feeds their recorded values in
    that dtype, since the units reading them take it (docs/fix.md)."""
    retyped = getattr(load_transform(spec.transform), "retyped", None)
    return {str(name): str(dtype) for name, dtype in dict(retyped).items()} if isinstance(retyped, dict) else {}


class Runtime(Lanes):
    """The lanes of one session, plus the scheduling policy the engine leaves to the runtime."""

    @classmethod
    def open(cls, trace_path: str | Path, spec: TargetSpec, cache_dir: str | Path, *, start_workers: bool = False,
             searching: bool = False) -> "Runtime":
        """`start_workers`: start the worker processes now, so that they import TVM while the caller
        does; `searching`: a search comes first: its side worker too, and the compile lanes when
        the cache's index knows nothing of this transform text yet (it will compile ahead)."""
        runtime = cls(str(trace_path), spec, str(cache_dir))
        if start_workers:
            runtime.start(beside=searching)
            if searching and not runtime.index.exists():
                runtime.start_compile_lanes()
        return runtime

    # -- work beside the caller ------------------------------------------------------------
    def search_overlap(self, plan: SearchPlan) -> SearchOverlap:
        """A search's overlap policy (runtime/overlap.py), a context manager around the whole search: it
        begins the search, builds `plan`'s units ahead when and where it decides, runs the chain beside
        the sweep (`beside_sweep`) and takes what the chain found (`chain_done`)."""
        return SearchOverlap(self, plan, self._search_memo)

    def series_beside(self, produce: Callable[[Callable[..., UnitResult | ChainResult]], Iterable[T]], name: str,
                      weight: Callable[[T], int]) -> "BesideSeries[T] | None":
        """`produce(run)`'s items made beside the caller, every request it runs (`run(request,
        timeout_s)`) run on the side worker while the caller's own work takes the lanes: two cores at
        work where there are two. None where there is no side worker (the caller makes it itself)."""
        return BesideSeries(self, produce, name, weight) if self.has_side else None

    def chain_log(self) -> ChainLog:
        """A new, empty log for a chain's worker to write its units' outcomes to as it goes (the
        chain's `log`, runtime/chain_log.py), and its reader: a sweep beside the chain follows it."""
        handle, path = tempfile.mkstemp(prefix="tapml-chain-", suffix=".txt")
        os.close(handle)
        self._chain_logs.append(path)
        return ChainLog(path)

    def chain_timeout(self, units: int) -> float:
        """How long a chain of `units` one-op units may take: the unit timeout once per OPS_PER_TIMEOUT."""
        return self.pool.timeout_s * max(1, math.ceil(units / OPS_PER_TIMEOUT))

    # -- building ahead --------------------------------------------------------------------
    @property
    def compiles_ahead(self) -> bool:
        """Enough compile lanes to build a chain's units ahead of it (the unit index is kept for them)."""
        return self.compile_lanes >= MIN_COMPILE_LANES

    def units_to_build(self, units: Iterable[UnitRequest]) -> list[UnitRequest]:
        """The distinct units the cache does not hold yet (as far as its index knows), in order."""
        distinct = {self.index.unit_id(unit.unit_json): unit for unit in units}
        return [unit for unit_id, unit in distinct.items() if not self.index.holds(unit_id)]

    def compile_ahead(self, units: list[UnitRequest], wait: bool = True) -> Background | None:
        """Build `units` side by side on the compile lanes, one lane per few units, their keys noted
        in the index. `wait=False`: in the background when the compile lanes do it all (returned:
        join it before `remember`; `cancel()` starts no more units). None: nothing runs ahead."""
        if not self.compiles_ahead or not units:
            return None
        stop = StopFlag()

        def build() -> None:  # a hint only: whoever needs a unit builds what is missing itself
            try:
                results = self.prepare(units, per_lane=PREPARE_UNITS_PER_LANE, cancel=stop)
            except TapmlError:
                return
            self.index.record((unit.unit_json, result.key) for unit, result in zip(units, results)
                              if result is not None and result.ok)

        if wait or not self.prepares_on_compile_lanes(len(units), PREPARE_UNITS_PER_LANE):
            build()
            return None
        return Background(build, "tapml-prepare", stop=stop)

    def remember(self, request: ChainRequest, result: ChainResult) -> None:
        """Note in the index the key of every unit a chain ran (for the next `units_to_build`)."""
        if self.compiles_ahead and result.unit_keys:
            self.index.record((unit.unit_json, key) for unit, (key, _cached) in zip(request.units, result.unit_keys))

    @cached_property
    def _search_memo(self) -> RunMemo | None:
        config = self.pool.config
        return RunMemo.open(config.cache_dir, config.trace_path, config.spec)


class _Closed(Exception):
    """A series closed before it was done: its work runs nothing more."""


class BesideSeries(Generic[T]):
    """A series made on the side worker (`Runtime.series_beside`): iterate it for its items in order,
    and close it in every case. The side worker's runs are counted from the caller's thread, as the
    lanes' own are (`counted`)."""

    def __init__(self, runtime: Runtime, produce: Callable[[Callable[..., UnitResult | ChainResult]], Iterable[T]],
                 name: str, weight: Callable[[T], int]):
        self._runtime = runtime
        self._runs: list[UnitResult | ChainResult] = []
        self._stop = StopFlag()
        self._stream = Stream(lambda: produce(self._run), name, SERIES_AHEAD_BYTES, weight, stop=self._stop)

    def _run(self, request: UnitRequest | ChainRequest, timeout_s: float | None = None) -> UnitResult | ChainResult:
        if self._stop.is_set():
            raise _Closed()
        result = self._runtime.run_beside(request, timeout_s)
        self._runs.append(result)
        return result

    def __iter__(self) -> Iterator[T]:
        yield from self._stream
        self._count()

    def close(self) -> None:
        """Stop the work if it still runs (its worker killed: a run in flight ends at once), wait for
        it, and count what it ran."""
        if not self._stream.done:
            self._stream.cancel()
            self._runtime.stop_beside()
        self._stream.join()
        self._count()

    def _count(self) -> None:
        runs, self._runs = self._runs, []
        for result in runs:
            self._runtime.counted(result)
