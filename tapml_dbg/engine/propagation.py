"""Propagated values, the target fed its own values: one implementation for the REPL's `step`,
`plot`/`report`'s series, bisect's chain and mixed runs (`run --offload all`).

Ops run on the target as a chain of per-op kernels (`RequestBuilder.chain`, run by the worker's
chain loop): each op is its own one-op unit, the unit the compile cache shares between layers,
fed the target values of the chain's earlier ops; any other input comes from `fed` (values the
caller already holds: a step's earlier target values, a report's earlier segments, a mixed run's
boundary values) or else from the recording. An op fed the same values is therefore the same
kernel run on the same bytes wherever it is asked for, and gives the same bits
(tests/test_propagated_values.py). Bisect's chain (engine/chain.py) is this chain with a screen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator, Protocol

import numpy as np

from tapml_dbg.engine.kept import KeptOps, segments as kept_segments
from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.trace_ops import TraceOps
from tapml_dbg.errors import TraceError, UsageError
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.runtime.messages import ChainResult, Result, UnitResult, UnitStatus
from tapml_dbg.runtime.scheduler import Runtime

SERIES_SEGMENT_OPS = 256  # ops per chained run of a series: their values come back at once
Progress = Callable[..., None]
OpValue = tuple[int, "Result | None", "list[np.ndarray] | None"]  # (op, its run or None: no values to feed it, values)
Run = Callable[..., ChainResult]  # (request, timeout_s) -> its result


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass
class TargetRun:
    """What a chain of per-op kernels gave: the kept ops' target values (those computed before a
    failure too) and the run itself (ok, or the op that failed, `failed_op`, and why)."""

    values: dict[str, list[np.ndarray]]
    result: ChainResult

    @property
    def failed_op(self) -> str | None:
        """The op whose unit failed; None when the run is ok or died without saying where (a crash)."""
        return None if self.result.ok else (self.result.failed_op or None)


class ChainParts(Protocol):
    """What a chain of per-op kernels is made from: the ops, their requests, the runtime that runs it."""

    ops: list[OpInfo]
    requests: RequestBuilder
    lanes: Runtime


def run_on_target(parts: ChainParts, indices: list[int], keep: list[int] | None = None,
                  fed: dict[str, list[np.ndarray]] | None = None, run: Run | None = None) -> TargetRun:
    """Ops `indices` (in order) on the target, each fed the chain's own earlier values, else `fed`'s,
    else the recording; the values of `keep` (default: all) come back. `run`: what runs the chain
    (default: lane 0). Raises TraceError when the trace cannot feed an input."""
    ops = parts.ops
    chain = [i for i in indices if ops[i].outputs]  # an op without a value is no unit
    wanted = None if keep is None else set(keep)
    kept = chain if wanted is None else [i for i in chain if i in wanted]
    request = parts.requests.chain(chain, keep=kept, fed=fed)
    result = (run or parts.lanes.run)(request, parts.lanes.chain_timeout(len(chain)))
    names = [ops[i].name for i in kept]
    if not result.ok:  # what ran before the failed op came back: the kept ops before it
        names = names[:len(result.outputs)]
    return TargetRun(dict(zip(names, result.outputs)), result)


def own_failure(result: ChainResult, name: str) -> ChainResult:
    """A chain's failed run as op `name`'s own verdict: its message without the chain's "op NAME: "
    (the verdict names the op; an op upstream that failed keeps its name in the message)."""
    prefix = f"op {name}: "
    if result.ok or result.failed_op != name or not (result.message or "").startswith(prefix):
        return result
    return replace(result, message=result.message[len(prefix):])


class TargetChains:
    """Chains of per-op kernels on the target (`run`), and every op's propagated value in order
    (`series`), for the REPL's replay, the report, a reference target's values and mixed runs: made
    of the trace's ops, their requests, the runtime and the kept ops (cut out of every chain)."""

    def __init__(self, trace_ops: TraceOps, requests: RequestBuilder, lanes: Runtime, kept: KeptOps):
        self.trace_ops = trace_ops
        self.ops = trace_ops.ops
        self.requests = requests
        self.lanes = lanes
        self.kept = kept

    def run(self, indices: list[int], keep: list[int] | None = None, fed: dict[str, list[np.ndarray]] | None = None,
            run: Run | None = None) -> TargetRun:
        """`run_on_target` on these parts."""
        return run_on_target(self, indices, keep, fed, run)

    def series(self, progress: Progress = _noop, last: int | None = None, run: Run | None = None) -> Iterator[OpValue]:
        """Every op (up to `last`) on the target fed the target's own upstream values, in order, a
        segment of per-op kernels at a time: (op, its run, its values). A failed run (a compile error,
        a crash) is that op's only: the chain goes on after it, the op's value read from the trace.
        Segments are cut at kept ops (engine/kept.py), which yield nothing: the ops after one read its
        recorded value. Only the values a later op still reads are held. `run`: what runs each chain
        (default: lane 0; `series_beside`: the side worker)."""
        ops = self.ops[:None if last is None else last + 1]
        consumers = self.trace_ops.consumers
        held: dict[str, list[np.ndarray]] = {}
        segments = [piece[start:start + SERIES_SEGMENT_OPS]
                    for piece in kept_segments([op.index for op in ops], self.kept.all)
                    for start in range(0, len(piece), SERIES_SEGMENT_OPS)]
        for number, segment in enumerate(segments):
            progress(number, len(segments), f"propagated chain {segment[0]}..{segment[-1]}")
            yield from self._segment([i for i in segment if self.ops[i].outputs], held, run)
            for name in [name for name in held if max(consumers.get(name, [-1])) <= segment[-1]]:
                del held[name]  # nothing after this segment reads it
        progress(len(segments), len(segments), "propagated chain done")

    def series_beside(self, last: int | None = None):
        """`series` made on the side worker while the caller does other work (a report's isolated
        verdicts on the lanes), or None where there is none: iterate it for its items, and close it
        in every case. Each op's one-op unit is built here first: units are built with TVM's
        BlockBuilder, whose scope stack is one per process, so the thread that makes the series builds
        none (an op whose unit cannot be built: no series beside, the caller makes it itself)."""
        if not self.lanes.has_side:
            return None
        try:
            for op in self.ops[:None if last is None else last + 1]:
                if op.outputs:
                    self.requests.one_op_unit(op.name)
        except Exception:  # noqa: BLE001 - its error is the series' own to tell, made where it is taken
            return None
        return self.lanes.series_beside(lambda run: self.series(last=last, run=run), "tapml-series", _values_bytes)

    def _segment(self, indices: list[int], held: dict, run: Run | None = None) -> Iterator[OpValue]:
        """Ops `indices` chained on the target, each value a later op reads added to `held`; past a failed
        op the chain goes on without it. A chain the trace cannot feed, or that dies without naming its
        op, is run op by op."""
        by_name, consumers = self.trace_ops.by_name, self.trace_ops.consumers
        ran = UnitResult(UnitStatus.OK)  # the ops before a failed one ran
        while indices:
            try:
                target = self.run(indices, fed=held, run=run)
            except TraceError:
                target = None
            if target is None or (not target.result.ok and target.failed_op is None):
                if len(indices) == 1:
                    yield indices[0], None if target is None else target.result, None
                else:
                    for index in indices:
                        yield from self._segment([index], held, run)
                return
            for name, values in target.values.items():
                if consumers.get(name):
                    held[name] = values
                yield by_name[name].index, target.result if target.result.ok else ran, values
            if target.result.ok:
                return
            failed = by_name[target.failed_op].index
            yield failed, own_failure(target.result, target.failed_op), None
            indices = indices[indices.index(failed) + 1:]


def _values_bytes(value: OpValue) -> int:
    return sum(array.nbytes for array in value[2] or [])


class PropagatedReplay:
    """The REPL's propagated replay: which ops run on the target (the offload set, less the kept
    ops) and the target values computed so far; an op's value is computed from its offloaded
    ancestors' (those missing run first, in one chain), and an op left on the source feeds its
    consumers its recorded value. Its verdicts are `Verdicts.propagated`'s."""

    def __init__(self, trace_ops: TraceOps, chains: TargetChains, kept: KeptOps):
        self.ops = trace_ops.ops
        self.by_name = trace_ops.by_name
        self.chains = chains
        self.kept = kept
        self.offload: set[int] = set(range(len(self.ops)))
        self.values: dict[str, list[np.ndarray]] = {}  # target values of on-target ops computed so far

    def reset(self) -> None:
        """Every op offloaded, no target values."""
        self.offload = set(range(len(self.ops)))
        self.forget()

    def forget(self) -> None:
        """Drop the target values (what feeds them changed: the offload set, the kept ops, the pass)."""
        self.values = {}

    def set_boundary(self, k: int) -> None:
        """Offload ops [0, k): the classic gradual migration."""
        if not 0 <= k <= len(self.ops):
            raise UsageError(f"boundary must be between 0 and {len(self.ops)}")
        self.offload = set(range(k))
        self.forget()

    def add(self, indices: list[int]) -> None:
        self.offload.update(indices)
        self.forget()

    def remove(self, indices: list[int]) -> None:
        self.offload.difference_update(indices)
        self.forget()

    @property
    def on_target(self) -> set[int]:
        """The ops the replay runs on the target: the offload set without the kept ops."""
        return self.offload - self.kept.all

    def run(self, index: int) -> tuple[ChainResult, list[np.ndarray] | None]:
        """Op `index` on the target fed its offloaded ancestors' target values (computing the missing ones)."""
        on_target = self.on_target
        missing = [i for i in self._ancestors(index, on_target) if self.ops[i].name not in self.values]
        run = self.chains.run(sorted(set(missing) | {index}), fed=self.values)
        for name, values in run.values.items():  # only offloaded ops feed later ops with target values
            if self.by_name[name].index in on_target:
                self.values[name] = values
        name = self.ops[index].name
        return own_failure(run.result, name), run.values.get(name) if run.result.ok else None

    def _ancestors(self, index: int, on_target: set[int]) -> list[int]:
        """The on-target ops op `index` reads through on-target ops only."""
        seen: set[int] = set()
        stack = list(self.ops[index].inputs)
        while stack:
            op = self.by_name.get(stack.pop())
            if op is None or op.index in seen or op.index not in on_target:
                continue
            seen.add(op.index)
            stack.extend(op.inputs)
        return sorted(seen)
