"""The replay engine: a trace, a target, an offload set, and verdicts per op.

Like `bdb`, it knows nothing of terminals: every method returns result objects and reports
progress through a callback. Target work goes through a worker process (see
`backends.executor`), so a crash inside TVM becomes a verdict, not the end of the session.
Independent units (sweep batches, per-op compiles, neighbourhood verdicts, speculative prefix
probes) go to a pool of such workers, one lane per device (see `backends.pool`).
"""

from __future__ import annotations

import difflib
import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR
from tapml_dbg.runtime.executor import DEFAULT_UNIT_TIMEOUT_S, UnitResult
from tapml_dbg.runtime.pool import ExecutorPool, plan_lanes
from tapml_dbg.runtime.target import parse_target
from tapml_dbg.model.units import build_isolated_batch, build_unit
from tapml_dbg.runtime.worker import UnitRequest, WorkerConfig
from tapml_dbg.engine.search import SearchTrace, chunks, first_failing, first_failing_speculative
from tapml_dbg.judge.compare import TolerancePolicy, compare_arrays, dtype_name
from tapml_dbg.errors import TargetError, TraceError, UsageError
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.serialize import function_from_json, function_to_json
from tapml_dbg.trace import TraceReader
from tapml_dbg.judge.verdict import (ISOLATED, PROPAGATED, BisectResult, CompileReport, Culprit, StepResult, Verdict)

Progress = Callable[..., None]

DEFAULT_SWEEP_CHUNK = 64  # ops per isolated-sweep unit: one compile covers this many verdicts
NEIGHBOURHOOD_RADIUS = 2  # ops shown on each side of a culprit


def _noop(*_args, **_kwargs) -> None:
    return None


class Session:
    """One replay of one trace on one target."""

    def __init__(self, reader: TraceReader, *, target: str = "llvm", rpc: str | None = None,
                 tracker: str | None = None, rpc_key: str | None = None, transform: str | None = None,
                 unit_timeout_s: float = DEFAULT_UNIT_TIMEOUT_S, cache_dir: str | Path = DEFAULT_CACHE_DIR,
                 policy: TolerancePolicy | None = None, parallel: int | None = None):
        self.reader = reader
        self.target = target
        parse_target(target)  # fail early on a bad target string
        self.transform = transform
        if transform:
            from tapml_dbg.frontend.model_loader import load_python_function

            load_python_function(transform, what="transform")  # fail early on a bad FILE.py:FUNC
        self.rpc, self.tracker, self.rpc_key = rpc, tracker, rpc_key
        self.main = function_from_json(_load_graph_json(reader))
        self.ops = [OpInfo.from_json(op) for op in reader.ops]
        self.by_name = {op.name: op for op in self.ops}
        self.input_names = set(reader.input_names)
        self.param_names = set(reader.param_names)
        self.policy = policy or TolerancePolicy()
        self.sweep_chunk = DEFAULT_SWEEP_CHUNK
        # one lane per free tracker server (or --parallel N); lane 0 also does the sequential work
        self.parallel = parallel
        self.lane_plan = plan_lanes(parallel, rpc, tracker, rpc_key)
        self._replan = False
        self.pool = ExecutorPool(
            WorkerConfig(trace_path=str(reader.path), target=target, transform=transform,
                         cache_dir=str(cache_dir), rpc=rpc, tracker=tracker, rpc_key=rpc_key),
            lanes=self.lane_plan.lanes, timeout_s=unit_timeout_s)
        self.executor = self.pool.lanes[0]
        self.consumers: dict[str, list[int]] = {}
        for op in self.ops:
            for name in op.inputs:
                self.consumers.setdefault(name, []).append(op.index)
        self.recorded = set(reader.finished_ops())
        self.dead_fields = _dead_tuple_fields(self.main)
        self.probes = 0
        self.reset()

    @classmethod
    def open(cls, path: str | Path, **options) -> "Session":
        return cls(TraceReader(path), **options)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def where(self) -> str:
        """The target and how it is reached, as reports name it ("cuda via rpc HOST:PORT")."""
        if self.rpc:
            return f"{self.target} via rpc {self.rpc}"
        if self.tracker:
            return f"{self.target} via tracker {self.tracker} key {self.rpc_key}"
        return self.target

    def close(self) -> None:
        self.pool.close()
        self.reader.close()

    # ---------------------------------------------------------------- state
    def reset(self) -> None:
        """Back to op 0 with every op offloaded and no target values."""
        self.position = 0
        self.offload: set[int] = set(range(len(self.ops)))
        self.target_values: dict[str, list[np.ndarray]] = {}
        self._isolated_cache: dict[int, Verdict] = {}

    def set_boundary(self, k: int) -> None:
        """Offload ops [0, k): the classic gradual migration."""
        if not 0 <= k <= len(self.ops):
            raise UsageError(f"boundary must be between 0 and {len(self.ops)}")
        self.offload = set(range(k))
        self.target_values = {}

    def offload_add(self, indices: list[int]) -> None:
        self.offload.update(indices)
        self.target_values = {}

    def offload_remove(self, indices: list[int]) -> None:
        self.offload.difference_update(indices)
        self.target_values = {}

    # ---------------------------------------------------------------- lookup
    def resolve(self, text: str | int) -> OpInfo:
        """An op by index (`12`, `#12`) or name; the error suggests close names."""
        if isinstance(text, int) or str(text).lstrip("#").lstrip("-").isdigit():
            index = int(str(text).lstrip("#"))
            if index < 0:
                index += len(self.ops)
            if not 0 <= index < len(self.ops):
                raise UsageError(f"op index {text} is out of range (0..{len(self.ops) - 1})")
            return self.ops[index]
        if text in self.by_name:
            return self.by_name[text]
        close = difflib.get_close_matches(str(text), list(self.by_name), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `ops PATTERN` lists op names"
        raise UsageError(f"no op named {text!r}{hint}")

    def layers(self) -> list[str]:
        seen: dict[str, None] = {}
        for op in self.ops:
            parts = op.layer.split(".") if op.layer else []
            for end in range(1, len(parts) + 1):
                seen.setdefault(".".join(parts[:end]), None)
        return list(seen)

    def layer_ops(self, layer: str) -> list[int]:
        """Ops in `layer` or any layer nested in it."""
        ops = [op.index for op in self.ops if op.layer == layer or op.layer.startswith(layer + ".")]
        if not ops:
            close = difflib.get_close_matches(layer, self.layers(), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; `layers` lists them"
            raise UsageError(f"no layer named {layer!r}{hint}")
        return ops

    def resolve_ops(self, text: str) -> list[int]:
        """An op, a range `a:b`, or a layer."""
        if ":" in text and all(part.strip().lstrip("#").isdigit() or not part.strip()
                               for part in text.split(":", 1)):
            start, end = text.split(":", 1)
            first = max(0, int(start.lstrip("#") or 0))
            last = min(len(self.ops), int(end.lstrip("#") or len(self.ops)))
            return list(range(first, last))
        if text in self.by_name or text.lstrip("#").isdigit():
            return [self.resolve(text).index]
        if any(op.layer == text or op.layer.startswith(text + ".") for op in self.ops):
            return self.layer_ops(text)
        return [self.resolve(text).index]

    # ---------------------------------------------------------------- values
    def source_values(self, index: int) -> list[np.ndarray]:
        if index not in self.recorded:
            raise TraceError(self.reader.missing_values_message(index))
        return self.reader.op_outputs(index)

    def _missing_values(self, index: int) -> str | None:
        """Why op `index` has no isolated verdict in this trace (it or an input has no values), or None."""
        if index not in self.recorded:
            return self.reader.missing_values_message(index)
        for name in self.ops[index].inputs:
            op = self.by_name.get(name)
            if op is not None and op.index not in self.recorded:
                return self.reader.missing_values_message(op.index, needed_by=index)
        return None

    def _recorded_ref(self, name: str, field: int) -> tuple:
        if name in self.input_names:
            return ("input", name)
        if name in self.param_names:
            return ("param", name)
        op = self.by_name[name]
        if op.index not in self.recorded:
            raise TraceError(self.reader.missing_values_message(op.index))
        return ("op", name, field)

    def _input_refs(self, spec_inputs, use_target: bool) -> list[tuple]:
        refs = []
        for name, field in spec_inputs:
            if use_target and name in self.target_values:
                refs.append(("value", self.target_values[name][max(field, 0)]))
            else:
                refs.append(self._recorded_ref(name, field))
        return refs

    def _request(self, func, spec, use_target: bool) -> UnitRequest:
        return UnitRequest(unit_json=function_to_json(func), inputs=self._input_refs(spec.inputs, use_target),
                           outputs=spec.outputs)

    def _run(self, func, spec, use_target: bool, timeout_s: float | None = None) -> UnitResult:
        return self._run_request(self._request(func, spec, use_target), timeout_s)

    def _run_request(self, request: UnitRequest, timeout_s: float | None = None) -> UnitResult:
        """One unit on lane 0 (sequential work)."""
        self._lanes_ready()
        return self._counted(self.pool.run(request, timeout_s))

    def _dispatch(self):
        """Independent units for all lanes (see `ExecutorPool.dispatch`)."""
        self._lanes_ready()
        return self.pool.dispatch()

    def _counted(self, result: UnitResult) -> UnitResult:
        """Count a unit that ran; a lost connection is not the op's fault: an error, no verdict."""
        self.probes += 1
        if result.status == "target-lost":
            # a server may be gone for good: count the tracker's servers again before the next
            # command, so that no lane waits for a lease that never comes
            self._replan = bool(self.tracker)
            raise TargetError(result.message)
        return result

    def _lanes_ready(self) -> None:
        if not self._replan:
            return
        self._replan = False
        self.pool.stop_all()  # our own leases go back first, or the tracker would not count them
        self.lane_plan = plan_lanes(self.parallel, self.rpc, self.tracker, self.rpc_key)
        self.pool.resize(self.lane_plan.lanes)

    # ---------------------------------------------------------------- verdicts
    def _verdict(self, op: OpInfo, mode: str, result: UnitResult, outputs: list[np.ndarray] | None) -> Verdict:
        if not result.ok:
            return Verdict(op.index, op.name, mode, result.status, message=result.message)
        if op.index not in self.recorded:
            return Verdict(op.index, op.name, mode, "missing", message=self.reader.missing_values_message(op.index))
        source = self.source_values(op.index)
        if len(outputs) != len(source):
            return Verdict(op.index, op.name, mode, "fail",
                           message=f"{len(outputs)} outputs vs {len(source)} recorded")
        dtype_of = self.tolerance_dtype(op.index)
        metrics = [compare_arrays(t, s, self.policy.for_value(dtype_of or dtype_name(s), op.name,
                                                              mode == PROPAGATED))
                   for t, s in zip(outputs, source)]
        dead = self.dead_fields.get(op.name, set())
        live = [m for k, m in enumerate(metrics) if k not in dead]
        status = "pass" if all(m.passed for m in live) else "fail"
        message = ""
        ignored = [k for k in sorted(dead) if k < len(metrics) and not metrics[k].passed]
        if ignored:
            message = (f"output(s) {', '.join(map(str, ignored))} differ but nothing reads them "
                       "(ignored in the verdict)")
        return Verdict(op.index, op.name, mode, status, live or metrics, message)

    def invalidate_verdicts(self) -> None:
        """Forget cached verdicts, e.g. after the tolerance policy changed."""
        self._isolated_cache.clear()

    def tolerance_dtype(self, index: int) -> str | None:
        """The source's own dtype when the recorder had to cast its value (e.g. fp16 mm → fp32)."""
        from tapml_dbg.record.recorder import CAST_NOTE_PREFIX

        note = self.reader.op_note(index) if index in self.recorded else ""
        return note[len(CAST_NOTE_PREFIX):] if note.startswith(CAST_NOTE_PREFIX) else None

    def isolated(self, index: int) -> Verdict:
        """The op alone, fed recorded source inputs: is this kernel wrong?"""
        if index in self._isolated_cache:
            return self._isolated_cache[index]
        request = self._isolated_request(index)
        if isinstance(request, Verdict):
            return request
        return self._isolated_done(index, self._run_request(request))

    def _isolated_request(self, index: int) -> UnitRequest | Verdict:
        """The op's one-op unit, or its `missing` verdict (not cached) when an input was not recorded."""
        op = self.ops[index]
        missing = self._missing_values(index)
        if missing:  # nothing to feed it or to compare with: say so without compiling
            return Verdict(index, op.name, ISOLATED, "missing", message=missing)
        try:
            func, spec = build_unit(self.main, [op.name], [op.name])
            return self._request(func, spec, use_target=False)
        except TraceError as exc:
            return Verdict(index, op.name, ISOLATED, "missing", message=str(exc))

    def _isolated_done(self, index: int, result: UnitResult) -> Verdict:
        verdict = self._verdict(self.ops[index], ISOLATED, result, result.outputs[0] if result.ok else None)
        self._isolated_cache[index] = verdict
        return verdict

    def isolated_many(self, indices: list[int], progress: Progress = _noop) -> dict[int, Verdict]:
        """Isolated verdicts of many ops, batched and spread over the lanes (no early stop)."""
        self._isolated_verdicts(list(indices), progress, stop_at_failure=False)
        return {index: self.isolated(index) for index in indices}

    def propagated(self, index: int) -> Verdict:
        """The op fed the target's own upstream values (ops in the offload set run on the target)."""
        return self._propagated_run(index)[0]

    def _propagated_run(self, index: int) -> tuple[Verdict, list[np.ndarray] | None]:
        op = self.ops[index]
        needed = self._offloaded_ancestors(index)
        missing = [i for i in needed if self.ops[i].name not in self.target_values]
        try:
            chain = sorted(set(missing) | {index})
            names = [self.ops[i].name for i in chain]
            func, spec = build_unit(self.main, names, names)
            result = self._run(func, spec, use_target=True)
        except TraceError as exc:
            return Verdict(index, op.name, PROPAGATED, "missing", message=str(exc)), None
        outputs = result.outputs[-1] if result.ok else None
        if result.ok:  # only offloaded ops feed later ops with target values
            for i, values in zip(chain, result.outputs):
                if i in self.offload:
                    self.target_values[self.ops[i].name] = values
        return self._verdict(op, PROPAGATED, result, outputs), outputs

    def _offloaded_ancestors(self, index: int) -> list[int]:
        seen: set[int] = set()
        stack = list(self.ops[index].inputs)
        while stack:
            name = stack.pop()
            op = self.by_name.get(name)
            if op is None or op.index in seen or op.index not in self.offload:
                continue
            seen.add(op.index)
            stack.extend(op.inputs)
        return sorted(seen)

    def compare(self, index: int) -> StepResult:
        """Both verdicts of one op, side by side."""
        op = self.ops[index]
        return StepResult(op.index, op.name, op.op, op.layer, self.isolated(index), self.propagated(index))

    def target_output(self, index: int, mode: str) -> list[np.ndarray] | None:
        """The target's value of an op in a mode (computing it if needed); None on failure."""
        op = self.ops[index]
        if mode == PROPAGATED:
            return self._propagated_run(index)[1]
        func, spec = build_unit(self.main, [op.name], [op.name])
        result = self._run(func, spec, use_target=False)
        return result.outputs[0] if result.ok else None

    # ---------------------------------------------------------------- stepping
    def step(self, count: int = 1, progress: Progress = _noop) -> list[StepResult]:
        """Run the next `count` ops on the target, one by one, each with both verdicts."""
        results = []
        for _ in range(count):
            if self.position >= len(self.ops):
                break
            results.append(self.compare(self.position))
            self.position += 1
            progress(len(results), count)
        return results

    # ---------------------------------------------------------------- bisection
    def bisect(self, sweep: bool = True, progress: Progress = _noop) -> BisectResult:
        """Find the first divergent op (see docs: propagated search, isolated confirm and sweep)."""
        started = time.perf_counter()
        probes_before = self.probes
        first, last, notes = self._search_range()
        self._search_first = first  # prefix probes run ops [first, k]
        search = SearchTrace()
        statuses: dict[int, UnitResult] = {}
        total_steps = max(1, int(np.ceil(np.log2(max(last - first + 1, 2)))) + 1)

        def prefix_fails(k: int) -> bool:
            progress(len(search.probes), total_steps, f"probe ops {first}..{k}")
            failed, result = self._prefix_probe(k)
            statuses[k] = result
            return failed

        def prefixes_fail(ks: list[int]) -> list[bool]:  # one round of speculative probes, side by side
            progress(len(search.probes), total_steps, f"probe ops {first}.." + f", {first}..".join(map(str, ks)))
            outcomes = self._prefix_probes(ks)
            failed = []
            for k in ks:
                failed.append(outcomes[k][0])
                statuses[k] = outcomes[k][1]
            return failed

        parallel = self.pool.size > 1
        if last < first:
            candidate = None
        elif parallel:  # same answer and path as first_failing, ~1.5x fewer rounds with 2 lanes
            candidate = first_failing_speculative(first, last, prefixes_fail, self.pool.size, search)
        else:
            candidate = first_failing(first, last, prefix_fails, search)
        end = candidate if candidate is not None else last + 1
        earliest = None
        if sweep and parallel:  # the sweep's batches and the candidate's own unit go side by side
            earliest = self._isolated_sweep(list(range(first, end)), progress,
                                            also=[candidate] if candidate is not None else [])
        culprit: Culprit | None = None
        if candidate is not None:
            verdict = self.isolated(candidate)
            if verdict.failed:
                culprit = self._culprit(candidate, verdict, ISOLATED)
            else:
                probe = statuses.get(candidate)
                prop = self.propagated_from_probe(candidate, probe)
                culprit = self._culprit(candidate, prop, PROPAGATED)
        if sweep:
            if not parallel:
                earliest = self._isolated_sweep(list(range(first, end)), progress)
            if earliest is not None:
                if culprit is None:
                    notes.append("the divergence does not persist to the model's output (it washes out "
                                 "or is masked downstream)")
                culprit = self._culprit(earliest.index, earliest, ISOLATED)
        probes = self.probes - probes_before  # the search's own probes; the neighbourhood is display
        neighbourhood = self._neighbourhood(culprit.index) if culprit else []
        if self.lane_plan.note:
            notes.append(self.lane_plan.note)
        return BisectResult(diverged=culprit is not None, ops=len(self.ops), probes=probes,
                            seconds=time.perf_counter() - started, target=self.target, culprit=culprit,
                            neighbourhood=neighbourhood, search=search.probes, notes=notes)

    def _last_recorded_prefix(self, first: int = 0) -> int:
        last = first - 1
        while last + 1 < len(self.ops) and (last + 1) in self.recorded:
            last += 1
        return last

    _search_first = 0  # the first op bisection searches: 0, or a capture window's start

    def _search_range(self) -> tuple[int, int, list[str]]:
        """Ops [first, last] bisection searches, and notes on what it leaves out.

        A full trace: op 0 to the end of the recorded prefix. A trace recorded with a capture
        budget (--window / --max-bytes) holds tensors for its window only: search the window.
        """
        capture = self.reader.capture
        if capture is None:
            last = self._last_recorded_prefix()
            incomplete = last < len(self.ops) - 1
            return 0, last, [f"the trace is incomplete: searched ops 0..{last} only"] if incomplete else []
        first = int(capture.get("first", 0))
        end = min(int(capture.get("end", len(self.ops))), len(self.ops))
        last = min(self._last_recorded_prefix(first), end - 1)
        how = " ".join(f"--{key.replace('_', '-')} {capture[key]}" for key in ("window", "max_bytes")
                       if capture.get(key) is not None)
        return first, last, [f"the trace holds tensors for ops {first}..{end - 1} only (recorded with {how}): "
                             f"searched ops {first}..{last}; record another window to search elsewhere"]

    def _frontier(self, k: int) -> list[str]:
        """Ops in [first, k] whose value is read after k, plus op k itself (first: `_search_first`)."""
        names = []
        for op in self.ops[self._search_first:k + 1]:
            if op.index == k or any(c > k for c in self.consumers.get(op.name, [])):
                if op.outputs:
                    names.append(op.name)
        return names

    def _prefix_request(self, k: int) -> UnitRequest:
        names = [op.name for op in self.ops[self._search_first:k + 1]]
        func, spec = build_unit(self.main, names, self._frontier(k))
        return self._request(func, spec, use_target=False)

    def _prefix_probe(self, k: int) -> tuple[bool, UnitResult]:
        return self._prefix_outcome(k, self._run_request(self._prefix_request(k)))

    def _prefix_probes(self, ks: list[int]) -> dict[int, tuple[bool, UnitResult]]:
        """Several prefix probes side by side, one per lane."""
        outcomes = {}
        with self._dispatch() as work:
            for k in ks:
                work.submit(k, k, self._prefix_request(k))
            for k, result in work:
                outcomes[k] = self._prefix_outcome(k, self._counted(result))
        return outcomes

    def _prefix_outcome(self, k: int, result: UnitResult) -> tuple[bool, UnitResult]:
        frontier = self._frontier(k)
        if not result.ok:
            return True, result
        for name, outputs in zip(frontier, result.outputs):
            op = self.by_name[name]
            if not self._verdict(op, PROPAGATED, result, outputs).passed:
                result.message = f"op {op.index} ({name}) diverges"
                return True, result
        last_name = self.ops[k].name
        self._last_probe_outputs = {last_name: result.outputs[frontier.index(last_name)]} \
            if last_name in frontier else {}
        return False, result

    def propagated_from_probe(self, index: int, probe: UnitResult | None) -> Verdict:
        """The propagated verdict of `index` as seen by the prefix probe that ended at it."""
        op = self.ops[index]
        if probe is None or not probe.ok:
            return Verdict(index, op.name, PROPAGATED, probe.status if probe else "error",
                           message=probe.message if probe else "")
        frontier = self._frontier(index)
        outputs = probe.outputs[frontier.index(op.name)] if op.name in frontier else None
        if outputs is None:
            return Verdict(index, op.name, PROPAGATED, "error", message="no value for the op in the probe")
        return self._verdict(op, PROPAGATED, probe, outputs)

    def _isolated_sweep(self, indices: list[int], progress: Progress, also: list[int] = ()) -> Verdict | None:
        """Isolated verdicts for `indices`, many per unit; the lowest failing one, if any.

        `also`: ops whose isolated verdict is wanted anyway (the bisect candidate); their units
        go first and are never cancelled.
        """
        self._isolated_verdicts(indices, progress, stop_at_failure=True, also=also)
        for index in indices:
            verdict = self._isolated_cache.get(index)
            if verdict is not None and verdict.failed:
                return verdict
        return None

    def _isolated_verdicts(self, indices: list[int], progress: Progress, stop_at_failure: bool,
                           also: list[int] = ()) -> None:
        """Fill the isolated-verdict cache for `indices`: batches of ops, over all lanes.

        Units go out lowest op first. A batch that fails to compile or crashes is redone op by
        op (as units of their own, so a crash is that op's verdict only). With
        `stop_at_failure`, units above the first failing op are not started: the lowest failing
        op is then the same one a sequential sweep finds, whatever the lane count.
        """
        todo = [i for i in indices if i not in self._isolated_cache and self.ops[i].outputs]
        size = self.sweep_chunk
        if self.pool.size > 1 and todo:  # at least one batch per lane
            size = max(1, min(size, math.ceil(len(todo) / self.pool.size)))
        batches = chunks(todo, size)
        finished = 0
        with self._dispatch() as work:
            for index in also:
                if index not in self._isolated_cache:
                    request = self._isolated_request(index)
                    if isinstance(request, UnitRequest):
                        work.submit(-1, ("op", index), request)
            for batch in batches:
                request = self._batch_request(batch)
                if request is None:
                    self._submit_singles(work, batch)
                else:
                    work.submit(batch[0], ("batch", batch), request)
            for (kind, what), result in work:
                result = self._counted(result)
                if kind == "op":
                    failed = [what] if self._isolated_done(what, result).failed else []
                elif not result.ok:
                    # a batch that fails to compile or crashes: find the op(s) one by one
                    self._submit_singles(work, what)
                    failed = []
                else:
                    for index, outputs in zip(what, result.outputs):
                        self._isolated_cache[index] = self._verdict(self.ops[index], ISOLATED, result, outputs)
                    failed = [i for i in what if self._isolated_cache[i].failed]
                if kind == "batch":
                    finished += 1
                    progress(finished, len(batches), f"isolated sweep {what[0]}..{what[-1]}")
                if stop_at_failure and failed and (kind == "batch" or what in indices):
                    work.cancel_above(failed[0])

    def _batch_request(self, batch: list[int]) -> UnitRequest | None:
        try:
            func, spec = build_isolated_batch(self.main, [self.ops[i].name for i in batch])
            return self._request(func, spec, use_target=False)
        except TraceError:
            return None

    def _submit_singles(self, work, batch: list[int]) -> None:
        for index in batch:
            request = self._isolated_request(index)
            if isinstance(request, UnitRequest):
                work.submit(index, ("op", index), request)

    def _culprit(self, index: int, verdict: Verdict, mode: str) -> Culprit:
        op = self.ops[index]
        kind = mode if verdict.status in ("pass", "fail") else verdict.status
        return Culprit(op.index, op.name, op.op, op.layer, kind, verdict.worst, verdict.message)

    def _neighbourhood(self, index: int) -> list[StepResult]:
        window = range(max(0, index - NEIGHBOURHOOD_RADIUS), min(len(self.ops), index + NEIGHBOURHOOD_RADIUS + 1))
        if self.pool.size > 1:  # the missing verdicts side by side; the loop below then reads the cache
            with self._dispatch() as work:
                for i in window:
                    if i not in self._isolated_cache:
                        request = self._isolated_request(i)
                        if isinstance(request, UnitRequest):
                            work.submit(i, i, request)
                for i, result in work:
                    self._isolated_done(i, self._counted(result))
        rows = []
        for i in window:
            op = self.ops[i]
            rows.append(StepResult(i, op.name, op.op, op.layer, self.isolated(i), None))
        return rows

    # ---------------------------------------------------------------- compile only
    def compile_all(self, progress: Progress = _noop) -> CompileReport:
        """Compile every op for the target without running it; failures become verdicts."""
        report = CompileReport(self.target, len(self.ops))
        done = 0
        with self._dispatch() as work:  # each op is its own unit: all lanes compile side by side
            for op in self.ops:
                func, spec = build_unit(self.main, [op.name], [op.name])
                work.submit(op.index, op, UnitRequest(unit_json=function_to_json(func), inputs=[],
                                                      compile_only=True))
            for op, result in work:
                self.probes += 1
                progress(done, len(self.ops), op.name)
                done += 1
                if not result.ok or not result.device_code:
                    report.failures.append({"index": op.index, "name": op.name, "op": op.op, "layer": op.layer,
                                            "verdict": result.status if not result.ok else "compile-error",
                                            "message": result.message or "no device code generated"})
        report.failures.sort(key=lambda row: row["index"])
        return report


def _dead_tuple_fields(main) -> dict[str, set[int]]:
    """For tuple-valued ops read only through get_item: the fields nobody reads.

    TVM imports `max_pool2d_with_indices` with zeros for indices; when the model ignores the
    indices, that difference cannot matter and must not be reported as a divergence.
    """
    from tvm import relax

    bindings = [b for block in main.body.blocks for b in block.bindings]
    tuple_ops = {b.var.name: len(b.var.ty.fields) for b in bindings if isinstance(b.var.ty, relax.TupleType)}
    used: dict[str, set[int]] = {name: set() for name in tuple_ops}
    values = [b.value for b in bindings] + [main.body.body]
    for value in values:
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            if value.tuple_value.name in used:
                used[value.tuple_value.name].add(int(value.index))
            continue
        for var in relax.analysis.free_vars(value):
            if var.name in used:
                used[var.name].update(range(tuple_ops[var.name]))
    return {name: set(range(tuple_ops[name])) - fields for name, fields in used.items()
            if set(range(tuple_ops[name])) - fields}


def _load_graph_json(reader: TraceReader) -> dict:
    try:
        return json.loads(reader.graph_json)
    except (ValueError, TypeError) as exc:
        raise TraceError(f"{reader.path}: the stored graph is not valid JSON ({exc}); the trace is corrupt") from exc
