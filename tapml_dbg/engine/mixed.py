"""Mixed runs: the model executed once with the offload set on the target and every other op on the
source runner, values crossing the boundary both ways (TapML's gradual migration, docs/migrate.md).

Walks the ops in order. A maximal run of consecutive offloaded ops inside one *unit span* becomes
one target run fed the run's current values: a chain of per-op kernels (engine/propagation.py,
the propagated values every command computes, so `run --offload all` gives an op the bits `step`,
`report` and bisect give it). The spans are fixed per trace (cut at the end of every top-level
block, `top_level_blocks`), so a migration step that feeds a block what the step before fed it
reuses that block's values (`_UnitMemo`) whatever else is offloaded. An op
left on the source re-executes its FX node in the recorded dtype on torch CPU, fed the current
values of the nodes before it (the target's where their op was offloaded): with nothing
offloaded that is the recording, bit for bit.

Rules that decide the edge cases:
- a helper binding (no FX node of its own: the reshapes around an `embedding`, the matmul of an
  `addmm`) runs where the op holding its node runs, so a node is never split across the boundary;
- a target value enters the source as its node's value, cast back to the source's dtype and
  shape where the import changed them; a node the target computes only in part (one field of a
  tuple) keeps the source's recomputation of the other fields;
- a kept op (`Session.kept`, engine/kept.py) is never offloaded, whatever the offload spec says:
  it runs on the source, fed the run's values, and cuts the target unit it sat in; it gets no
  verdict in the run;
- a trace recorded on a TVM target (`--source tvm:T`, a TVM-native model among them) has no FX graph:
  its ops left on the source run on T itself, a chain of the same per-op units on a runtime of its
  own fed the run's values (the source's own computation), wherever something upstream is offloaded;
  else they take their recorded value (the same bits). An older trace without a source graph
  (format v1.0/1.1) refuses such a run (one line).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tapml_dbg.engine.kept import host_only_note, kept_note
from tapml_dbg.engine.propagation import TargetChains, TargetRun, own_failure
from tapml_dbg.engine.references import SourceReference
from tapml_dbg.engine.trace_ops import TraceOps
from tapml_dbg.engine.verdicts import Verdicts
from tapml_dbg.errors import TraceError, UsageError
from tapml_dbg.judge.compare import Metrics
from tapml_dbg.judge.verdict import PROPAGATED, Status, Verdict
from tapml_dbg.model.generation import LOGITS_FIELD, GenerationInfo, output_labels, step_ranges
from tapml_dbg.model.graph import OpInfo, TensorSpec
from tapml_dbg.model.select import LAYER_SEP, OpTable
from tapml_dbg.model.units import bindings_by_name
from tapml_dbg.host.helper_values import helper_value
from tapml_dbg.runtime.messages import ChainResult, UnitResult, UnitStatus
from tapml_dbg.runtime.scheduler import Runtime
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.host.source_runner import SourceRunError, with_layout
from tapml_dbg.host.torch_values import to_torch
from tapml_dbg.trace.schema import META_GENERATION, tvm_source_target

OFFLOAD_ALL, OFFLOAD_NONE = "all", "none"  # offload specs beside the op selectors of model/select.py
MIN_BLOCKS = 2  # a numbered container needs this many children to count as the model's blocks
TOP1_MIN_CLASSES = 2  # outputs whose last dimension has this many entries get a top-1 agreement
UNIT_MEMO_BYTES = 1 << 30  # target outputs kept for units fed the same values again (a migration's prefix)
NO_GRAPH_REFUSAL = ("op #{index} {name} would run on the source fed offloaded values, but the trace has no "
                    "source graph (recorded with --source tvm:TARGET or before trace format v1.2): offload it "
                    "too (`--offload all`), or record the model again with --source torch")

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


# ---------------------------------------------------------------------------- what is offloaded
def spans_text(indices: list[int], total: int) -> str:
    """`0..12, 15..25 (24 of 26 ops)`, or `none (0 of 26 ops)`."""
    indices = sorted(indices)
    if not indices:
        return f"none (0 of {total} ops)"
    spans, start, prev = [], indices[0], indices[0]
    for index in indices[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        spans.append(f"{start}" if start == prev else f"{start}..{prev}")
        if index is not None:
            start = prev = index
    return f"{', '.join(spans)} ({len(indices)} of {total} ops)"


def parse_offload(table: OpTable, spec: str) -> list[int]:
    """An offload spec: `all`, `none`, or op selectors as everywhere (`0:120`, `transformer.h.0,transformer.h.3`)."""
    text = str(spec).strip()
    if text == OFFLOAD_ALL:
        return list(range(len(table)))
    if text == OFFLOAD_NONE:
        return []
    if not text:
        raise UsageError(f"empty offload spec: give `{OFFLOAD_ALL}`, `{OFFLOAD_NONE}`, ops (`0:120`, `12`) or layers")
    return table.select_many(text)


@dataclass(frozen=True)
class Block:
    """One top-level block of the model (`transformer.h.3`): a migration's layer step."""

    label: str
    indices: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.indices[-1] + 1


def top_level_blocks(ops: list[OpInfo]) -> list[Block]:
    """The model's repeated blocks, in order: the children of the numbered container with the most of
    them (`transformer.h.N`, `model.layers.N`, `blocks.N`); a model without one, its top-level modules.

    Ops outside every block (embeddings, a final norm, the head) belong to no block.
    """
    containers: dict[str, dict[str, list[int]]] = {}
    for op in ops:
        parts = op.layer.split(LAYER_SEP) if op.layer else []
        for depth, part in enumerate(parts):
            if part.isdigit():
                container = LAYER_SEP.join(parts[:depth])
                containers.setdefault(container, {}).setdefault(LAYER_SEP.join(parts[:depth + 1]), []).append(op.index)
                break
    best = max(containers.items(), key=lambda item: (len(item[1]), -len(item[0])), default=None)
    if best is not None and len(best[1]) >= MIN_BLOCKS:
        groups = best[1]
    else:
        groups = {}
        for op in ops:
            if op.layer:
                groups.setdefault(op.layer.split(LAYER_SEP)[0], []).append(op.index)
    blocks = [Block(label, tuple(sorted(indices))) for label, indices in groups.items()]
    return sorted(blocks, key=lambda block: block.indices[0])


def blocks_in(blocks: list[Block], span: range) -> list[Block]:
    """The blocks restricted to the ops of `span` (one generation step), those with an op there."""
    restricted = [Block(block.label, tuple(i for i in block.indices if i in span)) for block in blocks]
    return [block for block in restricted if block.indices]


def unit_bounds(ops: list[OpInfo], blocks: list[Block]) -> list[int]:
    """Where target units are cut: after every block but the last (ops before the first block share
    block 0's unit span, ops after the last block share the last block's), in every generation step
    (a block recurs once per step: the steps' units are cut alike)."""
    bounds = {0, len(ops)}
    for span in step_ranges(ops):
        bounds |= {span.start} | {block.end for block in blocks_in(blocks, span)[:-1]}
    return sorted(bounds)


# ---------------------------------------------------------------------------- results
@dataclass
class OutputCheck:
    """One model output of a mixed run against the recording."""

    op: str  # the op (or model input) the model returns
    output: int  # which of its flattened outputs
    passed: bool
    metrics: Metrics | None
    top1: float | None = None  # share of positions whose argmax over the last dimension agrees
    message: str = ""
    label: str = ""  # what the output is, where the trace knows (a generation's logits, its cache)

    def to_json(self) -> dict:
        return {"op": self.op, "output": self.output, "label": self.label or None, "passed": self.passed,
                "metrics": self.metrics.to_json() if self.metrics else {}, "top1_agreement": self.top1,
                "message": self.message}


@dataclass
class MixedRun:
    """One execution of the model with `offload` on the target and the rest on the source."""

    offload: list[int]  # the ops that ran on the target
    ops: int
    target: str
    outputs: list[OutputCheck]
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # per op, when asked for
    seconds: float = 0.0
    units: int = 0  # target units run
    compiled: int = 0  # of which were compiled (not found in the compile cache)
    reused: int = 0  # units not run again: an earlier run fed them the same values (a migration's prefix)
    failure: str = ""  # a unit that did not run: the run stopped there
    notes: list[str] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # ops the spec offloads but that are kept on the source
    values: dict[str, list[np.ndarray]] | None = None  # every op's value in the run, when asked for
    source: str = "torch CPU, recorded dtype"  # where the ops left on the source ran

    @property
    def passed(self) -> bool:
        return not self.failure and all(check.passed for check in self.outputs)

    @property
    def worst(self) -> OutputCheck | None:
        """The output furthest from the recording (by err / absmax)."""
        judged = [check for check in self.outputs if check.metrics is not None]
        if not judged:
            return self.outputs[0] if self.outputs else None
        return max(judged, key=lambda check: (not check.passed, _error(check.metrics)))

    @property
    def error(self) -> float:
        """The end-to-end error: the worst output's max |mixed - recorded| / absmax(recorded); inf on failure."""
        worst = self.worst
        if self.failure or worst is None or worst.metrics is None:
            return float("inf")
        return _error(worst.metrics)

    @property
    def not_finite(self) -> bool:
        """The worst output has NaN or Inf where the recording has none (or the other way round)."""
        worst = self.worst
        return worst is not None and worst.metrics is not None and bool(
            worst.metrics.nan_mismatch or worst.metrics.inf_mismatch)

    @property
    def top1(self) -> float | None:
        shares = [check.top1 for check in self.outputs if check.top1 is not None]
        return min(shares) if shares else None

    def failing_ops(self) -> list[int]:
        return sorted(index for index, verdict in self.verdicts.items() if verdict.failed)

    def to_json(self) -> dict:
        return {"offload": list(self.offload), "passed": self.passed, "ops": self.ops, "target": self.target,
                "outputs": [check.to_json() for check in self.outputs], "top1_agreement": self.top1,
                "failure": self.failure or None,
                "failing": [{"index": index, "name": self.verdicts[index].name, **self.verdicts[index].to_json()}
                            for index in self.failing_ops()] if self.verdicts else None,
                "units": self.units, "compiled": self.compiled, "reused": self.reused,
                "seconds": round(self.seconds, 3), "kept": list(self.kept),
                "notes": self.notes}


def _error(metrics: Metrics) -> float:
    if metrics.nan_mismatch or metrics.inf_mismatch or metrics.shape_mismatch:
        return float("inf")
    return float(metrics.scale_rel_err)


def top1_agreement(mixed: np.ndarray, recorded: np.ndarray) -> float | None:
    """Share of positions where the argmax over the last dimension agrees ("logits argmax agrees on 97.3%")."""
    mixed, recorded = np.asarray(mixed), np.asarray(recorded)
    if (mixed.shape != recorded.shape or mixed.ndim < 1 or mixed.shape[-1] < TOP1_MIN_CLASSES
            or recorded.dtype.kind != "f" or mixed.size == 0):
        return None
    with np.errstate(all="ignore"):
        agree = np.argmax(mixed.astype(np.float64), axis=-1) == np.argmax(recorded.astype(np.float64), axis=-1)
    return float(np.mean(agree))


# ---------------------------------------------------------------------------- the run
class MixedRunner:
    """Runs a trace mixed: its chains of per-op kernels for the target, the source runner for the rest."""

    def __init__(self, trace_ops: TraceOps, reference: SourceReference, chains: TargetChains, verdicts: Verdicts,
                 where: str, bounds: list[int] | None = None):
        self.trace_ops = trace_ops
        self.ops: list[OpInfo] = trace_ops.ops
        self.by_name = trace_ops.by_name
        self.reader = trace_ops.reader
        self.reference = reference
        self.chains = chains
        self.kept = chains.kept
        self.verdicts = verdicts
        self.where = where
        self.graph = self.reference.graph
        self.runner = self.reference.runner
        self.blocks = top_level_blocks(self.ops)
        self.bounds = bounds or unit_bounds(self.ops, self.blocks)
        # what the model returns (an old trace without the list: its last op)
        self.outputs = list(self.reader.meta.get("outputs", [])) or ([self.ops[-1].name] if self.ops else [])
        self._owner = self._owners()
        self._bindings = None
        self._memo = _UnitMemo(UNIT_MEMO_BYTES)
        source = tvm_source_target(str(self.reader.meta.get("source", "")))
        self.source_target = source if self.graph is None else None
        self._source_lanes: Runtime | None = None  # the source target's runtime, opened on first use

    def with_bounds(self, bounds: list[int]) -> "MixedRunner":
        """A runner of the same trace whose target units are cut at `bounds` (e.g. one unit per op)."""
        return MixedRunner(self.trace_ops, self.reference, self.chains, self.verdicts, self.where, bounds)

    def close(self) -> None:
        if self._source_lanes is not None:
            self._source_lanes.close()
            self._source_lanes = None

    # -- placement ----------------------------------------------------------------------------
    def _owners(self) -> dict[int, int]:
        """Helper op -> the op holding its FX node (the next op of the same node that holds one)."""
        holds = self.graph.op_values if self.graph is not None else {}
        owner: dict[int, int] = {}
        holder_of: dict[str, int] = {}
        for op in reversed(self.ops):
            if op.name in holds:
                holder_of[op.fx_node] = op.index
            elif op.fx_node and op.fx_node in holder_of:
                owner[op.index] = holder_of[op.fx_node]
        return owner

    def placement(self, offload: set[int]) -> set[int]:
        """The ops that run on the target: `offload`, with every helper moved to where its node's op runs."""
        placed = set(offload)
        for helper, owner in self._owner.items():
            if owner in offload:
                placed.add(helper)
            else:
                placed.discard(helper)
        return placed

    # -- running ------------------------------------------------------------------------------
    def run(self, offload, verdicts: bool = False, keep_values: bool = False, progress: Progress = _noop) -> MixedRun:
        """One mixed run; `verdicts`: also judge every op of it (else only the model's outputs);
        `keep_values`: return every op's value too."""
        started = time.perf_counter()
        kept = self.kept.all  # whole source ops (engine/kept.py): the placement moves no helper of one back
        on_target = self.placement(set(offload) - kept)
        state = _State()
        result = MixedRun(sorted(on_target), len(self.ops), self.where, [])  # what ran there, helpers moved
        if self.source_target is not None:
            result.source = f"tvm:{self.source_target}, the source target"
        result.kept = sorted(self.kept.user & set(offload))
        if result.kept:
            result.notes.append(kept_note(self.ops, result.kept, mixed=True))
        if self.kept.host_only_ops & set(offload):  # ops TVM cannot import: on the host whatever the spec
            result.notes.append(host_only_note(self.kept.host_only, mixed=True))
        chunks = self._chunks(on_target)
        done = 0
        for placed, indices in chunks:
            if placed:
                self._run_target(indices, state, result)
                if result.failure:
                    break
            elif self.source_target is not None and self._reads_offloaded(indices, state):
                self._run_source_target(indices, state, result)
            else:
                for index in indices:
                    self._run_source(self.ops[index], state, result)
            done += len(indices)
            progress(done, len(self.ops), f"{'target' if placed else 'source'} #{indices[0]}..#{indices[-1]}")
        result.outputs = self._check_outputs(state, result)
        if verdicts:  # a kept op's is no verdict to name
            result.verdicts = {op.index: self._verdict(op, state, result) for op in self.ops if op.index not in kept}
        if keep_values:
            result.values = state.values
        result.seconds = time.perf_counter() - started
        return result

    def _chunks(self, on_target: set[int]) -> list[tuple[bool, list[int]]]:
        """Consecutive ops of one placement, cut at the unit bounds."""
        chunks: list[tuple[bool, list[int]]] = []
        cuts = set(self.bounds)
        for op in self.ops:
            placed = op.index in on_target
            if chunks and chunks[-1][0] == placed and op.index not in cuts:
                chunks[-1][1].append(op.index)
            else:
                chunks.append((placed, [op.index]))
        return chunks

    def _run_target(self, indices: list[int], state: "_State", result: MixedRun) -> None:
        names = [self.ops[i].name for i in indices]
        inside = set(names)
        for index in indices:  # a value the run lacks must not be read from the recording
            for name in self.ops[index].inputs:
                if name not in inside and name in state.tainted and name not in state.values:
                    raise TraceError(f"op #{index} {self.ops[index].name} reads {name}, which has no value in "
                                     f"this mixed run: offload {name} too")
        key = self._unit_key(indices, state)
        run = self._memo.get(key)
        if run is None:  # the propagated values of engine/propagation.py, fed this run's values
            run = self.chains.run(indices, fed=state.values)
            result.units += 1
            result.compiled += 0 if run.result.cached else 1
            if run.result.ok:
                self._memo.put(key, run)
        else:
            result.reused += 1
        unit = run.result
        if not unit.ok:  # the ops before the failed one ran: their values stand
            failed = self.by_name.get(unit.failed_op or "")
            unit = own_failure(unit, failed.name) if failed else unit
            first_line = "".join((unit.message or "").splitlines()[:1])
            where = f"op #{failed.index} {failed.name} of " if failed else ""
            result.failure = (f"{where}the target run of ops #{indices[0]}..#{indices[-1]} ended with "
                              f"{unit.status}: {first_line}")
        for index in indices:
            op = self.ops[index]
            if op.name not in run.values and not unit.ok:
                state.failed[index] = unit
                continue
            values = run.values.get(op.name, [])
            state.values[op.name] = values
            state.tainted.add(op.name)
            self._enter_source(op, values, state)

    def _reads_offloaded(self, indices: list[int], state: "_State") -> bool:
        return any(name in state.tainted for index in indices for name in self.ops[index].inputs)

    def _run_source_target(self, indices: list[int], state: "_State", result: MixedRun) -> None:
        """Source ops of a TVM-source trace fed offloaded values: chained on the source target itself."""
        if self._source_lanes is None:
            self._source_lanes = Runtime.open(self.reader.path, TargetSpec(target=self.source_target),
                                              self.chains.lanes.pool.config.cache_dir)
        run = self.chains.run(indices, fed=state.values, run=self._source_lanes.run)
        if not run.result.ok:
            raise TraceError(f"ops #{indices[0]}..#{indices[-1]} did not run on the source target "
                             f"{self.source_target}: {''.join((run.result.message or '').splitlines()[:1])}")
        for index in indices:
            name = self.ops[index].name
            state.tainted.add(name)
            state.values[name] = run.values.get(name, [])

    def _unit_key(self, indices: list[int], state: "_State") -> tuple:
        """The ops of a unit and what feeds them: a digest of each value the run holds, else the name
        (the worker reads it from the trace: a model input, a param, a recorded value)."""
        inside = {self.ops[i].name for i in indices}
        fed = []
        for index in indices:
            for name in self.ops[index].inputs:
                if name in inside:
                    continue
                held = state.values.get(name)
                fed.append((name, tuple(_digest(array) for array in held) if held is not None else None))
        return tuple(sorted(inside)), tuple(fed)

    def _run_source(self, op: OpInfo, state: "_State", result: MixedRun) -> None:
        tainted = any(name in state.tainted for name in op.inputs)
        if tainted:
            state.tainted.add(op.name)
        held = self.graph.op_values.get(op.name) if self.graph is not None else None
        if held is None:  # a helper binding or the output tuple: what the recorder computed, or moves
            if not tainted and op.index in self.trace_ops.recorded:
                state.values[op.name] = self.trace_ops.source_values(op.index)
                return
            values = self._helper(op, state)
            if values is not None:
                state.values[op.name] = values
            elif not tainted:
                raise TraceError(self.reader.recorded.missing_values_message(op.index))
            elif self.graph is None:
                raise TraceError(NO_GRAPH_REFUSAL.format(index=op.index, name=op.name))
            return
        try:
            if held.node not in state.env:
                state.env.update(self._execute(held.node, state))
            value = state.env[held.node]
            arrays = self.runner.outputs_of(op, value)
        except SourceRunError as exc:
            if tainted:
                raise TraceError(f"op #{op.index} {op.name} cannot run on the source fed offloaded values "
                                 f"({exc}): offload it too") from exc
            arrays = self.trace_ops.source_values(op.index)
            result.notes.append(f"#{op.index} {op.name}: its recorded value (the source runner cannot "
                                f"re-execute it: {exc})")
        state.values[op.name] = [self._declared(op, k, array) for k, array in enumerate(arrays)]

    def _execute(self, node: str, state: "_State") -> dict:
        """Node `node` run on torch fed the run's values; an undefined (empty, random) node keeps its recording."""
        source = self.graph.by_name[node]
        if source.undefined:
            recorded = self.runner.recorded_value(node, False)
            if recorded is not None:
                return {node: recorded}
        computed = self.runner.run([node], False, state.env)
        return {name: value for name, value in computed.items() if name not in state.env}

    def _helper(self, op: OpInfo, state: "_State") -> list[np.ndarray] | None:
        """A helper binding computed on the host from the run's values, in its declared dtype (exact for moves)."""
        if not all(name in state.values or name not in self.by_name for name in op.inputs):
            return None
        if self._bindings is None:
            self._bindings = bindings_by_name(self.trace_ops.main)
        values = dict(state.values)
        for name in op.inputs:
            if name not in values:
                values[name] = [self.reader.tensors.input(name) if name in self.trace_ops.input_names
                                else self.reader.tensors.param(name)]
        computed = helper_value(self._bindings[op.name], values)
        if computed is None or len(computed) != len(op.outputs):
            return None
        return [_as_spec(array, spec) for array, spec in zip(computed, op.outputs)]

    def _declared(self, op: OpInfo, output: int, array: np.ndarray) -> np.ndarray:
        """A source value as the target expects it (the import's dtype and shape where it changed them)."""
        spec = self.chains.requests.casts.get((op.name, output))
        if spec is not None:
            return _as_spec(array, spec)
        array = np.asarray(array)  # a view stays one (a weight's transpose: a copy of it every step cost seconds)
        declared = op.outputs[output].shape if output < len(op.outputs) else array.shape
        if tuple(array.shape) != tuple(declared) and array.size == int(np.prod(declared, dtype=np.int64)):
            return array.reshape(declared)  # a 0-d source value of a (1,) op, as the recorder stores it
        return array

    def _enter_source(self, op: OpInfo, values: list[np.ndarray], state: "_State") -> None:
        """A target value becomes its node's value on the source side (in the source's own types)."""
        held = self.graph.op_values.get(op.name) if self.graph is not None else None
        if held is None:
            return
        changes = {change.output: change.source for change in self.reference.type_changes.get(op.index, [])}
        tensors = [to_torch(_as_spec(value, changes[k]) if k in changes else value) for k, value in enumerate(values)]
        node = self.graph.by_name[held.node]
        if held.index is None and not isinstance(node.val, list) and len(tensors) == 1:
            state.env[held.node] = with_layout(tensors[0], node.val)
            return
        base = state.env.get(held.node)
        if base is None:  # the fields the target does not compute: the source's, fed the run's values
            try:
                base = self._execute(held.node, state)[held.node]
            except SourceRunError:
                return  # nothing on the source reads this node's other fields, or the run says so later
        state.env[held.node] = _substitute(base, held.index or (), op, tensors)

    # -- judging ------------------------------------------------------------------------------
    def _check_outputs(self, state: "_State", result: MixedRun) -> list[OutputCheck]:
        checks = []
        for name in self.outputs:
            op = self.by_name.get(name)
            if op is None:  # the model returns one of its inputs
                checks.append(OutputCheck(name, 0, True, None, message="a model input, returned unchanged"))
                continue
            values = state.values.get(name)
            if op.index not in self.trace_ops.recorded:  # a capture window or an incomplete trace: nothing to compare
                missing = self.reader.recorded.missing_values_message(op.index)
                checks.append(OutputCheck(name, 0, False, None, message=missing))
                continue
            if values is None:
                checks.append(OutputCheck(name, 0, False, None, message=result.failure or "no value in this run"))
                continue
            verdict = self.verdicts.judge(op.index, PROPAGATED, UnitResult(UnitStatus.OK), values,
                                          fed_by_target=state.tainted)
            recorded = self.trace_ops.source_values(op.index)
            labels = self._labels(op, len(values))
            for k, array in enumerate(values):
                metrics = verdict.metrics[k] if k < len(verdict.metrics) else None
                passed = metrics.passed if metrics is not None else verdict.passed
                label = labels[k] if k < len(labels) else ""
                logits = not label or label.startswith(LOGITS_FIELD)  # a cache's argmax means nothing
                top1 = top1_agreement(array, recorded[k]) if k < len(recorded) and logits else None
                checks.append(OutputCheck(name, k, passed, metrics, top1, verdict.message, label))
        return checks

    def _labels(self, op: OpInfo, fields: int) -> list[str]:
        """What each field of output `op` is, where the trace knows: a generation's logits and cache."""
        info = GenerationInfo.from_meta(self.reader.meta.get(META_GENERATION))
        if info is None or len(op.inputs) != fields:
            return []
        by_name = self.by_name
        return output_labels(info, [by_name[name].layer if name in by_name else "" for name in op.inputs])

    def _verdict(self, op: OpInfo, state: "_State", result: MixedRun) -> Verdict:
        if op.index in state.failed:
            unit = state.failed[op.index]
            return self.verdicts.judge(op.index, PROPAGATED, unit, None)
        values = state.values.get(op.name)
        if values is None:
            return Verdict(op.index, op.name, PROPAGATED, Status.MISSING,
                           message=result.failure or "no value in this run (a helper of a source op)")
        return self.verdicts.judge(op.index, PROPAGATED, UnitResult(UnitStatus.OK), values, fed_by_target=state.tainted)


class _UnitMemo:
    """Target results of units by what they were fed, least recently used dropped past a byte budget.

    A migration step reruns the prefix of the step before it on the same values: its units' results
    are those of that step (this assumes a deterministic target; `Verdicts.explain`, which bisect's culprit goes through,
    reruns a unit to tell a nondeterministic kernel)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: OrderedDict[tuple, TargetRun] = OrderedDict()
        self.bytes = 0

    def get(self, key: tuple) -> TargetRun | None:
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
        return found

    def put(self, key: tuple, run: TargetRun) -> None:
        size = _nbytes(run)
        if size > self.budget:
            return
        self.entries[key] = run
        self.bytes += size
        while self.bytes > self.budget:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= _nbytes(dropped)


def _nbytes(run: TargetRun) -> int:
    return sum(int(np.asarray(array).nbytes) for values in run.values.values() for array in values)


def _digest(array: np.ndarray) -> tuple:
    array = np.ascontiguousarray(array)
    return str(array.dtype), array.shape, hashlib.sha1(array.view(np.uint8)).hexdigest()


@dataclass
class _State:
    values: dict[str, list[np.ndarray]] = field(default_factory=dict)  # op name -> its value in this run
    env: dict[str, object] = field(default_factory=dict)  # FX node -> its torch value in this run
    tainted: set[str] = field(default_factory=set)  # ops whose value depends on the target
    failed: dict[int, ChainResult] = field(default_factory=dict)  # ops of a unit that did not run


def _as_spec(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """`array` in `spec`'s dtype and shape (the element count must agree)."""
    array = np.asarray(array)
    dtype = _numpy_dtype(spec.dtype)
    with np.errstate(all="ignore"):
        cast = array if array.dtype == dtype else array.astype(dtype)
    if tuple(cast.shape) != tuple(spec.shape) and cast.size == int(np.prod(spec.shape, dtype=np.int64)):
        cast = cast.reshape(spec.shape)
    return np.ascontiguousarray(cast)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _substitute(value, path: tuple, op: OpInfo, tensors: list):
    """`value` with the part at `path` replaced by `tensors` (the op's outputs), the rest kept."""
    import torch

    if path:
        items = list(value)
        items[path[0]] = _substitute(items[path[0]], tuple(path[1:]), op, tensors)
        return tuple(items)
    if isinstance(value, torch.Tensor):
        return tensors[0]
    if not op.is_tuple:  # one field of a tuple node: the one of the declared shape (source_outputs' rule)
        items = list(value)
        for k, item in enumerate(items):
            if isinstance(item, torch.Tensor) and tuple(item.shape) == tuple(tensors[0].shape):
                items[k] = tensors[0]
                break
        return tuple(items)
    remaining = list(tensors)

    def rebuild(item):
        if isinstance(item, (tuple, list)):
            return tuple(rebuild(inner) for inner in item)
        if isinstance(item, torch.Tensor) and remaining:
            return remaining.pop(0)
        return item

    return rebuild(value)
