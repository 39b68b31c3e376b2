"""A session's live source reference: what each op's verdict is measured against beyond the recording.

From the trace's source graph (absent: every reference is empty and the fixed rule judges):
- `isolated(i)`: op i re-executed in float64 by the source runner on its recorded inputs (a
  helper binding: evaluated in float64 on the host, `host/helper_values.py`);
- `propagated(i)`: op i's value in one float64 run of the whole source graph from the model's
  inputs and params (computed once, on first use, for every op): every propagated reference;
- which elements are undefined (uninitialised memory in the source) and which ops are nothing else;
- the type changes (declared vs source dtype / shape) of every op, and the casts replay makes; the
  stock importer's where an import fix hides them (frontend/stock_import.py) are type changes too;
- `low_precision(i)`: op i recomputed summing in its output dtype, the `precision` evidence.
"""

from __future__ import annotations

import time

import numpy as np

from tapml_dbg.judge.classify import Evidence
from tapml_dbg.judge.noise_floor import Reference
from tapml_dbg.model.graph import OpInfo, TensorSpec
from tapml_dbg.model.units import bindings_by_name
from tapml_dbg.host.helper_values import helper_value
from tapml_dbg.host.low_precision import LOW_PRECISION_DTYPES, recompute_aten
from tapml_dbg.host.source_runner import SourceRunError, SourceRunner, source_outputs
from tapml_dbg.host.torch_values import to_numpy
from tapml_dbg.trace import TraceReader
from tapml_dbg.trace.recent import RecentOpOutputs
from tapml_dbg.trace.schema import CAST_NOTE_PREFIX, META_STOCK_IMPORT
from tapml_dbg.trace.source_graph import SourceGraph, TypeChange, parse_source_graph, stock_type_changes

RECORDED_CACHE_BYTES = 256 * 2**20  # recorded op outputs kept for the source runner's inputs
NO_GRAPH_NOTE = ("the trace has no source graph (recorded with --source tvm:TARGET, or by a tapml-dbg "
                 "before trace format v1.2)")
HELPER_NOTE = "a helper binding the recorder had tvm:llvm compute: no float64 reference on the host"
TVM_WIDE_NOTE = ("the reference target itself differs from the source here (TVM-wide): judged against the "
                 "reference target's value by the fixed rule, not against the float64 truth")
META_REFERENCE = "reference"  # a reference target's derived trace (engine/reference.py): its "tvm_wide" ops


def tvm_wide_indices(meta: dict) -> set[int]:
    """The ops a reference target's derived trace lists as TVM-wide (none in a recorded trace)."""
    listed = (meta.get(META_REFERENCE) or {}).get("tvm_wide") or []
    return {int(op["index"]) for op in listed if isinstance(op, dict) and isinstance(op.get("index"), int)}


def load_source_graph(reader: TraceReader) -> SourceGraph | None:
    """The trace's validated source graph, or None when it has none (a TraceError when it is bad)."""
    text = reader.outline.source_graph_json
    return None if text is None else parse_source_graph(text, str(reader.path))


class SourceReference:
    """The float64 references, undefined values and type changes of one trace (see the module docstring)."""

    def __init__(self, reader: TraceReader, ops: list[OpInfo], main, graph: SourceGraph | None):
        self.reader = reader
        self.ops = ops
        self.by_name = {op.name: op for op in ops}
        self.main = main
        self.graph = graph
        self.recorded = set(reader.recorded.finished_ops())
        self.runner = SourceRunner(graph, self._fetch_op, self._fetch_placeholder) if graph is not None else None
        self._bindings = None
        self._recorded = RecentOpOutputs(reader, RECORDED_CACHE_BYTES)
        self._full: dict[int, list[np.ndarray]] | None = None
        self._full_error = ""
        self._low_precision: dict[int, list | None] = {}  # op index -> its low-precision value (low_precision)
        self._masks: dict[int, list] | None = None
        self.full_run_seconds = 0.0
        self.stock_meta = reader.meta.get(META_STOCK_IMPORT) or {}  # what the stock import does (or {})
        self.stock_widened: list[TypeChange] = []
        self.all_type_changes = self._type_changes()  # what replay casts recorded values by
        # a reference target's trace: its values differ from the source's float64 truth at these ops (and,
        # propagated, after the first), where that truth would be the reference's noise, not the target's
        self.tvm_wide = tvm_wide_indices(reader.meta)
        self.first_wide = min(self.tvm_wide, default=len(ops))
        # the type changes judged: none against a reference target, which computes the imported types too
        # (every import type change is TVM-wide there, listed by engine/reference.py)
        self.type_changes = {} if META_REFERENCE in reader.meta else self.all_type_changes

    @property
    def available(self) -> bool:
        """Whether the trace can be re-executed (it has a source graph)."""
        return self.runner is not None

    # -- type changes ----------------------------------------------------------------------------
    def _type_changes(self) -> dict[int, list[TypeChange]]:
        """Op index -> its outputs whose declared type differs from the source's: the recorded import's
        own changes, then the stock importer's where an import fix hides them (a type verdict each, the
        same way; a stock change that only widens a float, fp16 -> fp32, is listed in `stock_widened`)."""
        changes: dict[int, list[TypeChange]] = {}
        if self.graph is not None:
            stock = stock_type_changes(self.ops, self.graph.type_changes, self.stock_meta.get("fixes") or [])
            self.stock_widened = [change for change in stock if change.widens]
            for change in self.graph.type_changes + [c for c in stock if not c.widens]:
                op = self.by_name.get(change.op)
                if op is not None:
                    changes.setdefault(op.index, []).append(change)
            return changes
        for op in self.ops:  # an older trace: the recorder cast the value and said so in the note
            if op.index in self.recorded and len(op.outputs) == 1:
                note = self.reader.recorded.op_note(op.index)
                if note.startswith(CAST_NOTE_PREFIX):
                    declared = op.outputs[0]
                    source = TensorSpec(declared.shape, note[len(CAST_NOTE_PREFIX):])
                    if source != declared:
                        changes[op.index] = [TypeChange(op.name, 0, declared, source)]
        return changes

    def stock_import_note(self) -> str:
        """One line on a stock import that fails outright (the import-error finding), "" otherwise."""
        error = self.stock_meta.get("error")
        if not error:
            return ""
        op = self.by_name.get(self.stock_meta.get("error_op") or "")
        where = f" at #{op.index} {op.name} ({op.op})" if op is not None else ""
        fixes = ", ".join(self.stock_meta.get("fixes") or []) or "import"
        why = first_sentence(self.stock_meta.get("reason") or error)  # `info` holds the whole message
        return f"TVM's stock import fails{where}: {why} (tapml-dbg's {fixes} workaround imports it)"

    def replay_casts(self, retyped: dict[str, str] | None = None) -> dict[tuple[str, int], TensorSpec]:
        """(op name, output) -> the declared spec a recorded value must be cast to before it feeds the target.

        Only for traces that store the source's own value (a source graph); older traces stored it cast.
        `retyped`: ops whose output the transform gives in another dtype (`transform_retyped`): their
        consumers take that dtype, so the value is cast to it (not at all when it is the source's).
        """
        if self.graph is None:
            return {}
        retyped = retyped or {}
        casts = {}
        for changes in self.all_type_changes.values():
            for change in changes:
                if change.stock:  # a stock type is not what the target runs
                    continue
                spec = change.declared
                if change.op in retyped and change.output == 0:
                    spec = TensorSpec(spec.shape, retyped[change.op])
                if spec != change.source:
                    casts[(change.op, change.output)] = spec
        return casts

    # -- references -------------------------------------------------------------------------------
    def isolated(self, index: int) -> Reference:
        """Op `index` in float64 from its recorded inputs (and its undefined elements)."""
        op = self.ops[index]
        reference = self._undefined_reference(index)
        if reference.undefined_op or self.runner is None or index in self.tvm_wide:
            reference.note = reference.note or (TVM_WIDE_NOTE if index in self.tvm_wide else NO_GRAPH_NOTE)
            return reference
        try:
            if self.runner.holds(op.name):
                reference.values = self.runner.op_value(op, promote=True)
            else:
                values = helper_value(self._binding(op.name), self._recorded_inputs(op))
                if values is None:
                    reference.note = HELPER_NOTE
                else:
                    reference.values = values
        except SourceRunError as exc:
            reference.note = f"the source runner cannot re-execute it ({exc})"
        except _NoValue as exc:
            reference.note = str(exc)
        return self._checked(index, reference)

    def propagated(self, index: int) -> Reference:
        """Op `index`'s value in the float64 run of the whole model (computed once for every op)."""
        reference = self._undefined_reference(index)
        if reference.undefined_op or self.runner is None or index >= self.first_wide:
            reference.note = reference.note or (NO_GRAPH_NOTE if self.runner is None else TVM_WIDE_NOTE)
            return reference
        full = self.full_run()
        if index in full:
            reference.values = full[index]
        else:
            reference.note = self._full_error or HELPER_NOTE
        return self._checked(index, reference)

    def _checked(self, index: int, reference: Reference) -> Reference:
        """Drop reference values whose shape is not the recorded one (the reference would mislead)."""
        if not reference.values or index not in self.recorded:
            return reference
        stats = self.reader.tensors.op_stats(index)
        if len(reference.values) != len(stats) or any(
                int(np.size(value)) != int(stat.get("numel", -1)) for value, stat in zip(reference.values, stats)):
            reference.values, reference.note = [], "the float64 reference does not line up with the recorded value"
        return reference

    def full_run(self) -> dict[int, list[np.ndarray]]:
        """Every op's float64 value in one run of the source graph from the model's inputs and params."""
        if self._full is not None:
            return self._full
        started = time.perf_counter()
        full: dict[int, list[np.ndarray]] = {}
        ops_of_node: dict[str, list[OpInfo]] = {}
        for op in self.ops:
            held = self.graph.op_values.get(op.name)
            if held is not None:
                ops_of_node.setdefault(held.node, []).append(op)
        try:
            for node, value in self.runner.full_run(promote=True):
                for op in ops_of_node.get(node, []):
                    try:
                        full[op.index] = self.runner.outputs_of(op, value)
                    except SourceRunError:
                        continue
        except SourceRunError as exc:
            self._full_error = f"the float64 run of the model stopped ({exc})"
        values = {name: [_promoted(self.reader.tensors.input(name))] for name in self.reader.outline.input_names}
        values.update({name: [_promoted(self.reader.tensors.param(name))] for name in self.reader.outline.param_names})
        for op in self.ops:  # helper bindings, in order, from the float64 values before them
            if op.index in full:
                values[op.name] = full[op.index]
                continue
            if all(name in values for name in op.inputs):
                computed = helper_value(self._binding(op.name), values)
                if computed is not None:
                    full[op.index] = values[op.name] = computed
        self._full = full
        self.full_run_seconds = time.perf_counter() - started
        return full

    # -- undefined values -------------------------------------------------------------------------
    def _undefined_reference(self, index: int) -> Reference:
        masks = self.undefined_masks().get(index)
        if masks is None:
            return Reference()
        op = self.ops[index]
        undefined_op = all(m is not None and bool(np.all(m)) for m in masks) and len(masks) == len(op.outputs)
        return Reference(undefined=masks, undefined_op=undefined_op)

    def undefined_masks(self) -> dict[int, list]:
        """Op index -> per output a bool mask of its uninitialised elements (ops absent: all defined)."""
        if self._masks is not None:
            return self._masks
        self._masks = {}
        if self.runner is None:
            return self._masks
        try:
            by_node = self.runner.undefined_masks()
        except (SourceRunError, RuntimeError, TypeError, ValueError) as exc:
            by_node, self._full_error = {}, f"undefined values unknown ({exc})"
        for op in self.ops:
            held = self.graph.op_values.get(op.name)
            if held is None or held.node not in by_node:
                continue
            masks = source_outputs(by_node[held.node], held, op)
            if masks is not None:
                self._masks[op.index] = [to_numpy(m) for m in masks]
        return self._masks

    # -- evidence ---------------------------------------------------------------------------------
    def low_precision(self, index: int) -> Evidence:
        """Op `index` recomputed from its recorded inputs summing in its output dtype (None per output
        where no recipe exists). Computed once per op: a culprit is judged by the search, then
        explained (a big matmul's term-by-term sum is slow; figures: docs/perf.md)."""
        if index not in self._low_precision:
            self._low_precision[index] = self._recompute_low_precision(index)
        return Evidence(low_precision=self._low_precision[index])

    def _recompute_low_precision(self, index: int) -> list | None:
        op = self.ops[index]
        if self.runner is None or not op.outputs or op.outputs[0].dtype not in LOW_PRECISION_DTYPES:
            return None
        try:
            if self.runner.holds(op.name):
                held = self.graph.op_values[op.name]
                node = self.graph.by_name[held.node]
                args, kwargs = self.runner.arguments(held.node)
                value = recompute_aten(node.aten_name, args, kwargs)
                return self.runner.outputs_of(op, value) if value is not None else None
            return helper_value(self._binding(op.name), self._recorded_inputs(op), low_precision=True)
        except (SourceRunError, _NoValue):
            return None

    # -- plumbing ---------------------------------------------------------------------------------
    def _binding(self, name: str):
        if self._bindings is None:
            self._bindings = bindings_by_name(self.main)
        return self._bindings[name]

    def _recorded_inputs(self, op: OpInfo) -> dict[str, list[np.ndarray]]:
        values = {}
        for name in op.inputs:
            if name in self.by_name:
                recorded = self._fetch_op(name)
                if recorded is None:
                    raise _NoValue(f"input {name} has no recorded value")
                values[name] = recorded
            elif name in self.reader.outline.input_names:
                values[name] = [self.reader.tensors.input(name)]
            else:
                values[name] = [self.reader.tensors.param(name)]
        return values

    def _fetch_op(self, name: str) -> list[np.ndarray] | None:
        op = self.by_name.get(name)
        if op is None or op.index not in self.recorded:
            return None
        return self._recorded.get(op.index)

    def _fetch_placeholder(self, kind: str, name: str) -> np.ndarray:
        return self.reader.tensors.input(name) if kind == "input" else self.reader.tensors.param(name)


class _NoValue(Exception):
    """A value the reference needs is not in the trace (a capture window, an incomplete recording)."""


def _promoted(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    return array.astype(np.float64) if array.dtype.kind == "f" or array.dtype.name == "bfloat16" else array


def first_sentence(text: str) -> str:
    """`TypeError: Binary operators must have the same datatype.  However, ...` -> up to its first period."""
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text
