"""Unit requests: a slice of the graph plus where each of its inputs comes from.

An input is a recorded value (a model input, a param, an op's recorded output) that the worker
reads from the trace itself, or a target value the engine already holds (propagated mode). The
trace may lack an op's values (an incomplete trace, a capture window): `missing` says why.

A trace keeps the source's own value of an op whose import changed its dtype or shape (a type
change). The target's units are compiled for the declared type, so such a value is cast here, at
replay time, before it feeds them (`casts`; `cast_inputs` says which inputs of an op were).
"""

from __future__ import annotations

import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.model.graph import OpInfo, TensorSpec
from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.model.units import UnitSpec, build_unit, one_op_json
from tapml_dbg.portable.screen import ScreenRule
from tapml_dbg.runtime.messages import BatchRequest, ChainRequest, CompileRequest, UnitRequest
from tapml_dbg.trace import TraceReader


class RequestBuilder:
    """Builds the requests of one trace's units."""

    def __init__(self, reader: TraceReader, main, ops: list[OpInfo],
                 casts: dict[tuple[str, int], TensorSpec] | None = None, graph: dict | None = None):
        self.reader = reader
        self.main = main
        self.graph = graph  # `main` as the trace stores it (model/serialize's JSON), when the caller has it
        self.ops = ops
        self.by_name = {op.name: op for op in ops}
        self.input_names = set(reader.outline.input_names)
        self.param_names = set(reader.outline.param_names)
        self.recorded = set(reader.recorded.finished_ops())
        self.casts = dict(casts or {})  # (op name, output) -> the declared type its recorded value is cast to
        self._cast_values: dict[tuple[str, int], np.ndarray] = {}
        self._one_op: dict[str, tuple[dict, UnitSpec]] = {}  # op name -> its one-op unit (json, spec)

    def set_casts(self, casts: dict[tuple[str, int], TensorSpec]) -> None:
        """New casts (an edited transform retypes other ops), the values cast before forgotten."""
        self.casts = dict(casts)
        self._cast_values.clear()

    # -- what the trace holds --------------------------------------------------------------
    def missing(self, index: int) -> str | None:
        """Why op `index` has no isolated verdict in this trace (it or an input has no values), or None."""
        if index not in self.recorded:
            return self.reader.recorded.missing_values_message(index)
        for name in self.ops[index].inputs:
            op = self.by_name.get(name)
            if op is not None and op.index not in self.recorded:
                return self.reader.recorded.missing_values_message(op.index, needed_by=index)
        return None

    def recorded_ref(self, name: str, field: int) -> tuple:
        """Where the worker finds a recorded value: ("input", name), ("param", name) or ("op", name, field)."""
        if name in self.input_names:
            return ("input", name)
        if name in self.param_names:
            return ("param", name)
        op = self.by_name[name]
        if op.index not in self.recorded:
            raise TraceError(self.reader.recorded.missing_values_message(op.index))
        if (name, max(field, 0)) in self.casts:
            return ("value", self.cast_value(name, max(field, 0)))
        return ("op", name, field)

    def cast_value(self, name: str, output: int) -> np.ndarray:
        """Op `name`'s recorded output cast to the type its import declares (what the target expects)."""
        key = (name, output)
        if key not in self._cast_values:
            spec = self.casts[key]
            value = self.reader.tensors.op_outputs(self.by_name[name].index)[output]
            if value.size != int(np.prod(spec.shape, dtype=np.int64)):
                raise TraceError(f"op {name}'s source value has shape {tuple(value.shape)} but its import declares "
                                 f"{tuple(spec.shape)}: nothing can feed its consumers on the target (the type "
                                 f"verdict of op {self.by_name[name].index} is the finding)")
            with np.errstate(all="ignore"):
                self._cast_values[key] = value.astype(_numpy_dtype(spec.dtype)).reshape(spec.shape)
        return self._cast_values[key]

    def cast_inputs(self, index: int, fed_by_target: set[str] = frozenset(),
                    unread: dict[str, set[int]] | None = None) -> list[str]:
        """The inputs of op `index` that replay casts ("mul (output 0 as int64 (2, 3))"), except those the
        target feeds and tuple fields nothing reads (`unread`: op name -> fields)."""
        casts = []
        for name in self.ops[index].inputs:
            if name in fed_by_target:
                continue
            casts += [f"{name} (output {output} as {spec.dtype} {tuple(spec.shape)})"
                      for (op, output), spec in self.casts.items()
                      if op == name and output not in (unread or {}).get(name, set())]
        return casts

    # -- requests ------------------------------------------------------------------------------
    def request(self, unit_json: dict, spec: UnitSpec,
                target_values: dict[str, list[np.ndarray]] | None = None) -> UnitRequest:
        """A unit fed recorded values, or the target's own values where `target_values` holds them."""
        refs = []
        for name, field in spec.inputs:
            if target_values is not None and name in target_values:
                refs.append(("value", target_values[name][max(field, 0)]))
            else:
                refs.append(self.recorded_ref(name, field))
        return UnitRequest(unit_json=unit_json, inputs=refs, outputs=spec.outputs)

    def ops_request(self, names: list[str], outputs: list[str],
                    target_values: dict[str, list[np.ndarray]] | None = None, input_per_use: bool = False) -> UnitRequest:
        """Ops `names` fused as one unit, returning the values of `outputs` (`input_per_use`:
        `model.units.build_unit`'s)."""
        if len(names) == 1 and outputs == names:
            unit_json, spec = self.one_op_unit(names[0])
        else:
            func, spec = build_unit(self.main, names, outputs, input_per_use)
            unit_json = function_to_json(func)
        return self.request(unit_json, spec, target_values)

    def one_op_unit(self, name: str) -> tuple[dict, UnitSpec]:
        """Op `name` alone as a unit (its json and spec), built once: a bisect asks for each op's
        unit three times (compile ahead, chain, sweep), for every op (figures: docs/perf.md)."""
        if name not in self._one_op:
            sliced = one_op_json(self.main, self.graph, name) if self.graph is not None else None
            if sliced is None:
                func, spec = build_unit(self.main, [name], [name])
                sliced = (function_to_json(func), spec)
            self._one_op[name] = sliced
        return self._one_op[name]

    def chain(self, indices: list[int], keep: list[int] | None = None,
              fed: dict[str, list[np.ndarray]] | None = None) -> ChainRequest:
        """Ops `indices` (in order) each as its own one-op unit, chained on the target: an input that
        an earlier op of the chain computes is that op's target value, one `fed` holds is that value
        (the caller's: earlier target values, a mixed run's source values), any other a recorded one.
        `keep`: the ops whose values come back (default: all). A screening chain is this one with its
        `ChainScreen` set (engine/chain.py)."""
        units, names, chained = [], [], set()
        fed = fed or {}
        for index in indices:
            name = self.ops[index].name
            unit_json, spec = self.one_op_unit(name)
            refs = [("chain", value, field) if value in chained
                    else ("value", fed[value][max(field, 0)]) if value in fed
                    else self.recorded_ref(value, field)
                    for value, field in spec.inputs]
            units.append(UnitRequest(unit_json=unit_json, inputs=refs, outputs=spec.outputs))
            names.append(name)
            chained.add(name)
        return ChainRequest(units, names, names if keep is None else [self.ops[i].name for i in keep])

    def isolated_batch(self, indices: list[int], screen: ScreenRule, unscreened: set[str] = frozenset(),
                       stop_at_suspect: bool = False, defer_unbuilt: bool = False) -> tuple[BatchRequest, list[int]]:
        """Isolated runs of `indices` as one request (screened in the worker: only values it cannot
        clear come back; `stop_at_suspect`: the worker stops at the first; `defer_unbuilt`: it skips
        the units not built yet, `BatchRequest`), and the ops it holds (an op the trace cannot feed
        is left out)."""
        units, names, held = [], [], []
        for index in indices:
            request = self.isolated(index)
            if isinstance(request, str):
                continue
            units.append(request)
            names.append(self.ops[index].name)
            held.append(index)
        return BatchRequest(units, names, screen, frozenset(unscreened), 1 if stop_at_suspect else len(units) + 1,
                            defer_unbuilt=defer_unbuilt), held

    def isolated(self, index: int) -> UnitRequest | str:
        """Op `index` alone on recorded inputs, or why it cannot have one (raises nothing)."""
        missing = self.missing(index)
        if missing:
            return missing
        name = self.ops[index].name
        try:
            return self.ops_request([name], [name])
        except TraceError as exc:
            return str(exc)

    def to_build(self, index: int) -> UnitRequest:
        """Op `index`'s one-op unit with no inputs: to compile into the cache ahead of its run
        (`CompileRequest.of`), or to generate code only (`compile_only`)."""
        unit_json, _spec = self.one_op_unit(self.ops[index].name)
        return UnitRequest(unit_json=unit_json, inputs=[])

    def compile_only(self, index: int) -> CompileRequest:
        return CompileRequest(self.to_build(index), code_only=True)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
