"""The worker lanes of one session: how many, re-planned when a tracker's server goes away.

`Lanes` is the one `UnitRunner` the engine talks to: `run` one unit on lane 0 (sequential work),
`dispatch` independent units over every lane. It counts the units that ran, and turns a
`target-lost` result (a dropped RPC connection: not the op's fault) into a `TargetError`.
"""

from __future__ import annotations

from typing import Protocol

from tapml_dbg.errors import TargetError
from tapml_dbg.runtime.messages import UnitRequest, UnitResult, UnitStatus, WorkerConfig
from tapml_dbg.runtime.pool import Dispatch, ExecutorPool, LanePlan, plan_lanes
from tapml_dbg.runtime.target import TargetSpec


class UnitRunner(Protocol):
    """What runs units: a pool of worker lanes, one lane, or the recorder's in-process runner."""

    def run(self, request: UnitRequest, timeout_s: float | None = None) -> UnitResult: ...


class Lanes:
    """A pool of worker lanes for one trace and one `TargetSpec`."""

    def __init__(self, trace_path: str, spec: TargetSpec, cache_dir: str):
        self.spec = spec
        self.plan: LanePlan = plan_lanes(spec.parallel, spec.rpc, spec.tracker, spec.key)
        self.pool = ExecutorPool(WorkerConfig(trace_path=trace_path, spec=spec, cache_dir=cache_dir),
                                 lanes=self.plan.lanes)
        self.units = 0  # units that ran (probes, verdicts, compiles)
        self._replan = False

    @property
    def size(self) -> int:
        return self.pool.size

    def run(self, request: UnitRequest, timeout_s: float | None = None) -> UnitResult:
        """One unit on lane 0 (sequential work)."""
        self._ready()
        return self.counted(self.pool.run(request, timeout_s))

    def dispatch(self) -> Dispatch:
        """Independent units for all lanes (see `ExecutorPool.dispatch`); pass results to `counted`."""
        self._ready()
        return self.pool.dispatch()

    def counted(self, result: UnitResult) -> UnitResult:
        """Count a unit that ran; a lost connection is not the op's fault: an error, no verdict."""
        self.units += 1
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
        self.pool.close()
