"""Slices of `main` that compile on their own: one op, or a contiguous range fused as one function.

A unit's parameters are all plain tensors: a tuple-typed input (the result of a `split`,
say) is passed field by field and re-packed inside the unit, so every value the engine moves
is one array.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from dataclasses import dataclass, field

from tapml_dbg.model.graph import TensorSpec
from tapml_dbg.model.serialize import BUILDING, type_to_json


@dataclass
class UnitSpec:
    """What a unit computes: the ops it contains and the values it hands back."""

    ops: list[str]
    outputs: list[str]  # op names whose (flattened) values the unit returns
    inputs: list[tuple[str, int]] = field(default_factory=list)  # (value name, field index)


def bindings_by_name(main) -> dict:
    """Binding name -> binding of `main`; the last function's table is kept (walking a big `main`
    through TVM's containers is not free, and a sweep builds one unit per op; docs/perf.md)."""
    return _tables(main)[0]


def _tables(main) -> tuple[dict, dict, dict]:
    """`main`'s bindings and parameters by name, and the JSON of each tensor-typed variable's type
    (None: not a tensor), filled as asked (a search slices one unit per op: each looks its inputs up)."""
    if not (_last_table and _last_table[0] is main):
        bindings = {b.var.name: b for block in main.body.blocks for b in block.bindings}
        _last_table[:] = [main, (bindings, {param.name: param for param in main.params}, {})]
    return _last_table[1]


def _tensor_type_json(main, var: str) -> dict | None:
    """The JSON of variable `var`'s type when it is a tensor, else None (remembered with `_tables`)."""
    table, params, types = _tables(main)
    if var not in types:
        from tvm import relax

        ty = table[var].var.ty if var in table else params[var].ty if var in params else None
        types[var] = type_to_json(ty) if isinstance(ty, relax.TensorType) else None
    return types[var]


_last_table: list = []  # [main, its tables]: IR is immutable, so the same object has the same tables


def build_unit(main, op_names: list[str], outputs: list[str], input_per_use: bool = False):
    """Return `(unit_function, UnitSpec)`; parameters are flattened tensor inputs.

    `input_per_use`: every op's use of an outside value is a parameter of its own (the same value
    may then be fed to several). Two slices that compute the same thing from values produced
    elsewhere are then one structure even where one of them reads a single value in two roles
    (a generation's first decode step reads the prefill's position where later steps read two
    values of the step before), so they compile once.
    """
    from tvm import relax

    table = bindings_by_name(main)
    chosen = [table[name] for name in op_names]
    defined = {name for name in op_names}
    params: list = []
    spec_inputs: list[tuple[str, int]] = []
    prologue: list = []
    remap: dict = {}  # outside var -> the var the unit reads it through (per use: per binding)
    seen: set[str] = set()
    bindings = []
    for position, binding in enumerate(chosen):
        if input_per_use:
            remap = {}
        for var in relax.analysis.free_vars(binding.value):
            if var.name in defined or var in remap or (var.name in seen and not input_per_use):
                continue
            # a name of its own for every further use: a unit's names are its JSON's references
            name = var.name if var.name not in seen else f"{var.name}__use{position}"
            seen.add(var.name)
            if isinstance(var.ty, relax.TupleType):
                remap[var] = _tuple_input(var, name, f"{name}__", params, spec_inputs, prologue)
            elif input_per_use and name != var.name:
                remap[var] = relax.Var(name, var.ty)
                params.append(remap[var])
                spec_inputs.append((var.name, -1))
            else:
                params.append(var)
                spec_inputs.append((var.name, -1))
        if input_per_use:
            bindings.append(_rebind(binding, remap))
    if not input_per_use:
        bindings = [_rebind(b, remap) for b in chosen] if remap else list(chosen)
    bindings = prologue + bindings
    result_vars = [table[name].var for name in outputs]
    with BUILDING:  # (a search's threads build units side by side)
        builder = relax.BlockBuilder()
        with builder.function("main", params, attrs={"num_input": len(params)}, pure=True):
            for binding in bindings:
                builder.emit_normalized(binding)
            builder.emit_func_output(relax.Tuple(result_vars))
        func = builder.get()["main"]
    return func, UnitSpec(ops=list(op_names), outputs=list(outputs), inputs=spec_inputs)


def one_op_json(main, graph: dict, name: str) -> tuple[dict, UnitSpec] | None:
    """Op `name` alone as a unit, in model/serialize's JSON: what `build_unit` + `function_to_json` make
    of it, sliced from the stored graph's own JSON instead (a search builds one per op, and the slice
    costs a tenth). None where a slice is not that simple (a tuple-typed input, a match_cast)."""
    stored = _stored_bindings(graph).get(name)
    if stored is None or "match_cast" in stored:
        return None
    inputs = [var for var in _referenced(stored["value"]) if var != name]
    types = [_tensor_type_json(main, var) for var in inputs]
    if any(ty is None for ty in types):
        return None
    unit = {"schema": graph["schema"], "num_input": len(inputs),
            "params": [{"name": var, "shape": list(ty["shape"]), "dtype": ty["dtype"]}
                       for var, ty in zip(inputs, types)],
            "bindings": [{"name": name, "value": stored["value"]}], "output": {"tuple": [{"var": name}]}}
    return unit, UnitSpec(ops=[name], outputs=[name], inputs=[(var, -1) for var in inputs])


def _stored_bindings(graph: dict) -> dict:
    """Binding name -> its stored JSON (the last graph's table is kept, as `bindings_by_name` does)."""
    if not (_last_stored and _last_stored[0] is graph):
        _last_stored[:] = [graph, {binding["name"]: binding for binding in graph["bindings"]}]
    return _last_stored[1]


_last_stored: list = []


def _referenced(value) -> list[str]:
    """The variables an expression's JSON reads, in the order of their first appearance."""
    found: dict[str, None] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("var"), str) and len(item) == 1:
                found.setdefault(item["var"], None)
            else:
                stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return list(found)


def _tuple_input(var, packed_name: str, field_prefix: str, params: list, spec_inputs: list, prologue: list):
    """Pass a tuple-typed input field by field; return the var that re-packs it inside the unit."""
    from tvm import relax

    fields = []
    for index, field_ty in enumerate(var.ty.fields):
        field_var = relax.Var(f"{field_prefix}{index}", field_ty)
        params.append(field_var)
        spec_inputs.append((var.name, index))
        fields.append(field_var)
    packed = relax.Var(packed_name, var.ty)
    prologue.append(relax.VarBinding(packed, relax.Tuple(fields)))
    return packed


def _rebind(binding, remap):
    from tvm import relax

    if not remap:
        return binding
    if isinstance(binding, relax.MatchCast):
        return relax.MatchCast(binding.var, substitute(binding.value, remap), binding.ty)
    return relax.VarBinding(binding.var, substitute(binding.value, remap))


def substitute(expr, mapping: dict):
    """Replace free variables in a Relax expression (TVM 0.27 has no public `bind` helper)."""
    with _interrupts_held():
        return _substituter_class()(mapping).visit_expr(expr)


@contextlib.contextmanager
def _interrupts_held():
    """Ctrl-C raised inside TVM's call back into the mutator comes back as a bare RuntimeError,
    which the session would report as an error and go on: hold SIGINT meanwhile, raise it after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, None)  # Python's own handler: KeyboardInterrupt


@functools.cache
def _substituter_class():
    """The mutator class, made once: TVM keeps every class `@mutator` makes (~7 KiB each), and a
    session substitutes for every op of every unit it builds."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Substituter(relax.PyExprMutator):
        def __init__(self, mapping: dict):
            super().__init__()
            self.mapping = mapping

        def visit_var_(self, var):
            return self.mapping.get(var, var)

    return Substituter


def flatten_ty(sinfo) -> list[TensorSpec] | None:
    """Tensor specs of a (possibly nested tuple) struct info; None when not all static tensors."""
    from tvm import relax

    if isinstance(sinfo, relax.TensorType):
        shape = sinfo.shape
        if shape is None or not isinstance(shape, relax.ShapeExpr):
            return None
        try:
            dims = tuple(int(d) for d in shape.values)
        except TypeError:
            return None
        return [TensorSpec(dims, str(sinfo.dtype))]
    if isinstance(sinfo, relax.TupleType):
        specs: list[TensorSpec] = []
        for field in sinfo.fields:
            sub = flatten_ty(field)
            if sub is None:
                return None
            specs.extend(sub)
        return specs
    return None


def tuple_item_values(value, values: dict) -> list | None:
    """The flat values of field `value.index` of a tuple var (a `TupleGetItem`), given `values`: every
    var's flat list of tensors by name. None when the tuple is not a plain var of a tuple type."""
    from tvm import relax

    tup = value.tuple_value
    if not isinstance(tup, relax.Var) or not isinstance(tup.ty, relax.TupleType):
        return None
    offset = 0
    for index, field_ty in enumerate(tup.ty.fields):
        size = len(flatten_ty(field_ty) or [])
        if index == int(value.index):
            return list(values[tup.name][offset:offset + size])
        offset += size
    return None
