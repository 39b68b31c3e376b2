"""Isolated verdicts (each op alone on recorded inputs), cached, many per unit, over every lane.

A batch of ops compiles and runs as one unit, so one compile gives many verdicts; a batch that
fails to compile or crashes is redone op by op, so a crash is that op's verdict only.
"""

from __future__ import annotations

import math
from typing import Callable

from tapml_dbg.engine.requests import RequestBuilder
from tapml_dbg.engine.search import chunks
from tapml_dbg.judge.verdict import ISOLATED, Status, Verdict
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.runtime.lanes import Lanes
from tapml_dbg.runtime.messages import UnitRequest, UnitResult

DEFAULT_SWEEP_CHUNK = 64  # ops per isolated-sweep unit: one compile covers this many verdicts

Judge = Callable[[int, str, UnitResult, list], Verdict]  # (index, mode, result, outputs) -> verdict
Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


class IsolatedVerdicts:
    """The isolated-verdict cache of one session, and the ways to fill it."""

    def __init__(self, ops: list[OpInfo], requests: RequestBuilder, lanes: Lanes, judge: Judge):
        self.ops = ops
        self.requests = requests
        self.lanes = lanes
        self.judge = judge
        self.chunk = DEFAULT_SWEEP_CHUNK
        self.cache: dict[int, Verdict] = {}

    def clear(self) -> None:
        self.cache.clear()

    def get(self, index: int) -> Verdict:
        """One op's isolated verdict (a `missing` one, not cached, when the trace lacks its values)."""
        if index in self.cache:
            return self.cache[index]
        request = self.request(index)
        if isinstance(request, Verdict):
            return request
        return self.done(index, self.lanes.run(request))

    def request(self, index: int) -> UnitRequest | Verdict:
        request = self.requests.isolated(index)
        if isinstance(request, str):  # nothing to feed it or to compare with: say so without compiling
            return Verdict(index, self.ops[index].name, ISOLATED, Status.MISSING, message=request)
        return request

    def done(self, index: int, result: UnitResult) -> Verdict:
        verdict = self.judge(index, ISOLATED, result, result.outputs[0] if result.ok else None)
        self.cache[index] = verdict
        return verdict

    def lowest_failing(self, indices: list[int], progress: Progress = _noop, also: list[int] = ()) -> Verdict | None:
        """The sweep: verdicts for `indices` until the lowest failing one is known; that verdict, if any.

        `also`: ops whose verdict is wanted anyway (the bisect candidate); their units go first and
        are never cancelled.
        """
        self.fill(indices, progress, stop_at_failure=True, also=also)
        for index in indices:
            verdict = self.cache.get(index)
            if verdict is not None and verdict.failed:
                return verdict
        return None

    def fill(self, indices: list[int], progress: Progress = _noop, stop_at_failure: bool = False,
             also: list[int] = ()) -> None:
        """Fill the cache for `indices`: batches of ops, lowest first, over all lanes.

        With `stop_at_failure`, units above the first failing op are not started: the lowest
        failing op is then the one a sequential sweep finds, whatever the lane count.
        """
        todo = [i for i in indices if i not in self.cache and self.ops[i].outputs]
        size = self.chunk
        if self.lanes.size > 1 and todo:  # at least one batch per lane
            size = max(1, min(size, math.ceil(len(todo) / self.lanes.size)))
        batches = chunks(todo, size)
        finished = 0
        with self.lanes.dispatch() as work:
            for index in also:
                if index not in self.cache:
                    request = self.request(index)
                    if isinstance(request, UnitRequest):
                        work.submit(-1, ("op", index), request)
            for batch in batches:
                request = self.requests.batch(batch)
                if request is None:
                    self._submit_singles(work, batch)
                else:
                    work.submit(batch[0], ("batch", batch), request)
            for (kind, what), result in work:
                result = self.lanes.counted(result)
                if kind == "op":
                    failed = [what] if self.done(what, result).failed else []
                elif not result.ok:  # a batch that fails to compile or crashes: find the op(s) one by one
                    self._submit_singles(work, what)
                    failed = []
                else:
                    for index, outputs in zip(what, result.outputs):
                        self.cache[index] = self.judge(index, ISOLATED, result, outputs)
                    failed = [i for i in what if self.cache[i].failed]
                if kind == "batch":
                    finished += 1
                    progress(finished, len(batches), f"isolated sweep {what[0]}..{what[-1]}")
                if stop_at_failure and failed and (kind == "batch" or what in indices):
                    work.cancel_above(failed[0])

    def fill_window(self, indices: list[int]) -> None:
        """Verdicts of a few ops side by side, one unit each (the neighbourhood of a culprit)."""
        if self.lanes.size == 1:
            return  # `get` computes them one by one anyway
        with self.lanes.dispatch() as work:
            for i in indices:
                if i not in self.cache:
                    request = self.request(i)
                    if isinstance(request, UnitRequest):
                        work.submit(i, i, request)
            for i, result in work:
                self.done(i, self.lanes.counted(result))

    def _submit_singles(self, work, batch: list[int]) -> None:
        for index in batch:
            request = self.request(index)
            if isinstance(request, UnitRequest):
                work.submit(index, ("op", index), request)
