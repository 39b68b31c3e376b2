"""A pool of target workers, so independent units run side by side.

One lane is one `TargetExecutor`: one worker process, and, over a tracker, one remote session
that the worker leases for itself. `Session` sends sequential work (a step, a prefix probe in a
plain bisect) to lane 0 through `run`, and independent work (the isolated sweep's batches, the
per-op compiles of `compile`, the neighbourhood's verdicts, speculative prefix probes) to all
lanes through `dispatch`.

A crash or a timeout stays in its lane: it is that unit's result, the lane starts a fresh worker
for its next unit, the other lanes go on. The pool itself never raises for what happens inside
TVM; the session decides what a `target-lost` result means.

Lanes run their units from plain threads: each thread only waits on its worker's socket, so the
GIL is not the bottleneck; compiling and running happen in the worker processes.
"""

from __future__ import annotations

import heapq
import os
import queue
import socket
import threading
from dataclasses import dataclass, replace
from typing import Any, Iterator

from tapml_dbg.errors import UsageError
from tapml_dbg.portable import split_host_port
from tapml_dbg.runtime.executor import TargetExecutor
from tapml_dbg.runtime.messages import AnyResult, CompileRequest, Request, UnitRequest, WorkerConfig
from tapml_dbg.runtime.zygote import ZygoteSlot

DEFAULT_PARALLEL = 1  # lanes for a local target or one `--rpc` server unless `--parallel N` says more
TRACKER_PROBE_TIMEOUT_S = 5.0  # how long to wait for the tracker's summary before planning one lane
LANE_JOIN_TIMEOUT_S = 30.0  # how long closing waits for a lane thread after its worker was killed
RESULT_POLL_S = 0.1  # how often the waiting thread wakes up (so Ctrl-C is seen promptly)


@dataclass
class LanePlan:
    """How many lanes, and why (a note for the user when a request could not be honoured)."""

    lanes: int
    free_servers: int | None = None  # what the tracker said, when asked
    note: str = ""


def free_servers(tracker: str, key: str | None, timeout_s: float = TRACKER_PROBE_TIMEOUT_S) -> int | None:
    """Free servers for `key` in the tracker's summary; None when the tracker cannot be asked.

    None is not an error here: the worker that connects later reports an unreachable tracker
    with the usual one-line `TargetError`.
    """
    if not key:
        return None
    try:
        host, port = split_host_port(tracker, "--tracker")
        # tvm's connect_tracker retries for a minute on a dead address: check that it listens first
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
        from tvm import rpc as tvm_rpc

        client = tvm_rpc.connect_tracker(host, port)
        try:
            summary = client.summary()
        finally:
            client.close()
        return int(summary.get("queue_info", {}).get(key, {}).get("free", 0))
    except Exception:
        return None


def plan_lanes(parallel: int | None, rpc: str | None, tracker: str | None, key: str | None) -> LanePlan:
    """Lanes for a session.

    - tracker: one lane per free server for the key (`summary()["queue_info"][key]["free"]`),
      at most one per CPU of this machine (every lane compiles here), so a big device farm is
      not leased whole by default; `--parallel N` asks for N but never more than are free, since
      a lane whose lease waits in the tracker's queue would look like a hanging unit and earn a
      false `timeout` verdict.
    - `--rpc HOST:PORT`: one lane. A TVM RPC server serves one session at a time, so a second
      lane would wait for the first to end, which never happens.
    - local: `--parallel N` lanes (default 1). Useful for compile-bound work even on one device.
    """
    if parallel is not None and parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {parallel}")
    if tracker:
        free = free_servers(tracker, key)
        if free is None:
            return LanePlan(1, None, "" if parallel in (None, 1) else
                            f"--parallel {parallel}: could not read the tracker's summary; using one lane")
        if parallel is None:
            return LanePlan(max(1, min(free, os.cpu_count() or 1)), free)
        if parallel > max(1, free):
            return LanePlan(max(1, free), free, f"--parallel {parallel}: the tracker has {free} free "
                            f"'{key}' server(s); using {max(1, free)} lane(s)")
        return LanePlan(parallel, free)
    if rpc:
        note = "" if parallel in (None, 1) else (
            f"--parallel {parallel}: one RPC server serves one session at a time; using one lane "
            "(register several servers with a tracker for parallel probes)")
        return LanePlan(1, None, note)
    return LanePlan(parallel or DEFAULT_PARALLEL)


class _Lane(TargetExecutor):
    """An executor that another thread may interrupt (kill its worker) while it waits."""

    def interrupt(self) -> None:
        self.interrupted = True  # also covers a worker that is being started right now
        process = self._process  # read once: the lane's own thread may reap it concurrently
        if process is not None:
            process.kill()

    def _ensure_started(self) -> None:
        super()._ensure_started()
        if self.interrupted and self._process is not None:
            self._process.kill()


class ExecutorPool:
    """`lanes` executors of one configuration; each lane leases its own device."""

    def __init__(self, config: WorkerConfig, lanes: int = 1, zygotes: ZygoteSlot | None = None):
        self.config = config
        self.lanes = [_Lane(config, zygotes) for _ in range(max(1, int(lanes)))]
        self.units = [0] * len(self.lanes)  # units each lane has run (tests check that all were used)

    @property
    def size(self) -> int:
        return len(self.lanes)

    @property
    def timeout_s(self) -> float:
        return self.lanes[0].timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        for lane in self.lanes:
            lane.timeout_s = value

    @property
    def restarts(self) -> int:
        return sum(lane.restarts for lane in self.lanes)

    @property
    def retired(self) -> int:
        """Workers ended because a result could have poisoned them (a sticky fault: executor.py)."""
        return sum(lane.retired for lane in self.lanes)

    @property
    def recycled(self) -> int:
        """Workers replaced for their memory (see executor.WORKER_GROWTH_MIB)."""
        return sum(lane.recycled for lane in self.lanes)

    def run(self, request: Request, timeout_s: float | None = None) -> AnyResult:
        """One unit on lane 0, in this thread (sequential work)."""
        self.lanes[0].interrupted = False
        result = self.lanes[0].run(request, timeout_s)
        self.units[0] += 1
        return result

    def dispatch(self, timeout_s: float | None = None) -> "Dispatch":
        """A batch of independent units: `submit` them, then iterate over the results."""
        return Dispatch(self, timeout_s)

    def pipeline(self, compile_pool: "ExecutorPool", timeout_s: float | None = None,
                 compile_lanes: int | None = None) -> "Pipeline":
        """Like `dispatch`, but each unit is compiled on one of `compile_pool`'s lanes first."""
        return Pipeline(compile_pool, self, timeout_s, compile_lanes)

    def resize(self, lanes: int) -> None:
        """Keep lane 0, drop or add the others (their workers stop, releasing their leases)."""
        lanes = max(1, int(lanes))
        for lane in self.lanes[lanes:]:
            lane.close()
        self.lanes = self.lanes[:lanes] + [_Lane(self.config)
                                           for _ in range(lanes - len(self.lanes))]
        self.units = (self.units + [0] * lanes)[:lanes]

    def stop_all(self) -> None:
        """Stop every lane's worker (a lane starts a fresh one, with a fresh lease, when next used)."""
        for lane in self.lanes:
            lane.stop()


class Dispatch:
    """Units handed to the lanes lowest key first; results come back as they finish.

        with pool.dispatch() as work:
            for key, tag in items: work.submit(key, tag, request)
            for tag, result in work:          # completion order
                ...                           # may submit more, or cancel_above(key)

    `cancel_above(key)` drops queued units with a larger key (units already running finish and
    are still reported). Iteration ends when nothing is queued or running. Leaving the `with`
    block by an error (a lost connection in one lane) drops the queue and lets running units
    finish, unread: killing a worker in the middle of an RPC call can leave the server's session
    hanging, so that server is never free again. Ctrl-C kills the workers of running units, as a
    single executor does, so no late reply can answer a later request. One lane runs
    everything in the calling thread.
    """

    def __init__(self, pool: ExecutorPool, timeout_s: float | None, done: "queue.Queue | _Stage | None" = None,
                 lanes: int | None = None):
        self.pool = pool
        self.timeout_s = timeout_s
        self.lane_count = min(pool.size, lanes or pool.size)  # the pool's first lanes do the work
        self._threaded = done is not None or self.lane_count > 1  # a pipeline's stages always run in lane threads
        self._heap: list[tuple[Any, int, Any, Request]] = []
        self._count = 0
        self._limit = None
        self._cv = threading.Condition()
        self._running = 0
        self._busy: set[int] = set()
        self._closed = False
        self._done = done if done is not None else queue.Queue()
        self._threads: list[threading.Thread] = []

    # -- queue -------------------------------------------------------------------------------
    def submit(self, key, tag, request: Request) -> None:
        with self._cv:
            if self._limit is not None and key > self._limit:
                return
            heapq.heappush(self._heap, (key, self._count, tag, request))
            self._count += 1
            self._cv.notify()
        if self._threaded and not self._threads:  # lanes start on the first unit, while more are built
            self._start()

    def cancel_above(self, key) -> None:
        with self._cv:
            self._limit = key if self._limit is None else min(self._limit, key)
            self._heap = [item for item in self._heap if item[0] <= self._limit]
            heapq.heapify(self._heap)

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._heap) + self._running

    # -- results -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[Any, AnyResult]]:
        if not self._threaded:
            yield from self._inline()
            return
        if not self._threads:
            self._start()
        while True:
            try:
                tag, result = self._done.get(timeout=RESULT_POLL_S)
            except queue.Empty:
                with self._cv:
                    if not self._heap and self._running == 0 and self._done.empty():
                        return
                continue
            if isinstance(result, BaseException):  # an internal bug in a lane: surface it here
                raise result
            yield tag, result

    def _inline(self) -> Iterator[tuple[Any, AnyResult]]:
        lane = self.pool.lanes[0]
        while True:
            with self._cv:
                if not self._heap:
                    return
                _key, _n, tag, request = heapq.heappop(self._heap)
            lane.interrupted = False
            result = lane.run(request, self.timeout_s)
            self.pool.units[0] += 1
            yield tag, result

    def _start(self) -> None:
        for number in range(self.lane_count):
            thread = threading.Thread(target=self._lane_loop, args=(number,), daemon=True,
                                      name=f"tapml-lane-{number}")
            thread.start()
            self._threads.append(thread)

    def _lane_loop(self, number: int) -> None:
        lane = self.pool.lanes[number]
        while True:
            with self._cv:
                while not self._closed and not self._heap:
                    self._cv.wait()
                if self._closed:
                    return
                _key, _n, tag, request = heapq.heappop(self._heap)
                self._running += 1
                self._busy.add(number)
                lane.interrupted = False
            try:
                result: Any = lane.run(request, self.timeout_s)
                self.pool.units[number] += 1
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                result = exc
            with self._cv:
                self._busy.discard(number)
                if self._closed:  # interrupted: nobody reads it, and the worker was killed
                    self._running -= 1
                    return
            self._done.put((tag, result))
            with self._cv:
                self._running -= 1

    # -- lifetime ----------------------------------------------------------------------------
    def __enter__(self) -> "Dispatch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None and not issubclass(exc_type, Exception))

    def close(self, kill: bool = False) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            busy = sorted(self._busy)
            self._cv.notify_all()
        if kill:
            for number in busy:
                self.pool.lanes[number].interrupt()
        for thread in self._threads:
            thread.join(LANE_JOIN_TIMEOUT_S if kill else None)
        self._threads = []


COMPILE, RUN = "compile", "run"  # the stages of a pipeline


class _Stage:
    """A stage's view of the pipeline's one result queue: it tags what it puts there with its name."""

    def __init__(self, results: queue.Queue, stage: str):
        self.results = results
        self.stage = stage

    def put(self, item: tuple) -> None:
        self.results.put((self.stage, *item))

    def empty(self) -> bool:
        return self.results.empty()


class Pipeline:
    """A `Dispatch` in two stages: compile lanes build each unit into the compile cache (on this
    host, side by side), run lanes load and run what is built, lowest key first, as it comes.

    So the device never waits for the compiler, and over RPC only running happens remotely. The
    interface is `Dispatch`'s (`submit`, `cancel_above`, iterate, `with`); a result that comes back
    says whether its library was compiled for it or found in the cache, as one lane's would. A
    unit that fails to compile (or crashes the compiler) is reported from the compile stage; a
    `CompileRequest` is done there.
    """

    def __init__(self, compile_pool: ExecutorPool, run_pool: ExecutorPool, timeout_s: float | None,
                 compile_lanes: int | None = None):
        self._results: queue.Queue = queue.Queue()
        self.compiles = Dispatch(compile_pool, timeout_s, _Stage(self._results, COMPILE), compile_lanes)
        self.runs = Dispatch(run_pool, timeout_s, _Stage(self._results, RUN))

    def submit(self, key, tag, request: UnitRequest | CompileRequest) -> None:
        if isinstance(request, CompileRequest):  # done once compiled
            self.compiles.submit(key, (key, tag, None), request)
        else:
            self.compiles.submit(key, (key, tag, request), CompileRequest.of(request))

    def cancel_above(self, key) -> None:
        self.compiles.cancel_above(key)
        self.runs.cancel_above(key)

    @property
    def pending(self) -> int:
        return self.compiles.pending + self.runs.pending + self._results.qsize()

    def __iter__(self) -> Iterator[tuple[Any, AnyResult]]:
        while True:
            try:
                stage, tag, result = self._results.get(timeout=RESULT_POLL_S)
            except queue.Empty:
                if self.compiles.pending == 0 and self.runs.pending == 0 and self._results.empty():
                    return
                continue
            if isinstance(result, BaseException):  # an internal bug in a lane: surface it here
                raise result
            if stage == RUN:
                user_tag, built = tag
                yield user_tag, replace(result, cached=built.cached, key=built.key,
                                        seconds=result.seconds + built.seconds)
                continue
            key, user_tag, request = tag
            if request is None or not result.ok:
                yield user_tag, result
            else:
                self.runs.submit(key, (user_tag, result), replace(request, library=result.library))

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None and not issubclass(exc_type, Exception))

    def close(self, kill: bool = False) -> None:
        self.compiles.close(kill)
        self.runs.close(kill)


class Deferred:
    """A dispatch whose kind is chosen once its units are known: `choose(count)` gets how many
    were submitted before the first result was asked for, and returns the `Dispatch` or
    `Pipeline` to run them (a few units are not worth starting compile workers for)."""

    def __init__(self, choose):
        self.choose = choose
        self.work: Dispatch | Pipeline | None = None
        self._queued: list[tuple] = []
        self._limit = None

    def submit(self, key, tag, request: Request) -> None:
        if self.work is not None:
            self.work.submit(key, tag, request)
        elif self._limit is None or key <= self._limit:
            self._queued.append((key, tag, request))

    def cancel_above(self, key) -> None:
        if self.work is not None:
            self.work.cancel_above(key)
            return
        self._limit = key if self._limit is None else min(self._limit, key)
        self._queued = [item for item in self._queued if item[0] <= self._limit]

    @property
    def pending(self) -> int:
        return self.work.pending if self.work is not None else len(self._queued)

    def __iter__(self) -> Iterator[tuple[Any, AnyResult]]:
        if self.work is None:
            self.work = self.choose(len(self._queued))
            for item in self._queued:
                self.work.submit(*item)
            self._queued = []
        yield from self.work

    def __enter__(self) -> "Deferred":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.work is not None:
            self.work.__exit__(exc_type, exc, tb)
