"""One op (or a unit of ops compiled as one function) as a standalone module: TVMScript, real inputs and outputs.

Tensor constants cannot be printed (`show_meta=True` crashes TVM 0.27, and without it the
script refers to metadata it does not hold), so they are lifted to extra parameters whose
values travel with the inputs. Finite scalar constants stay inline: they print exactly.
Every script is parsed back and compared structurally before it is written, so a dump never
holds a module that does not round-trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tapml_dbg.model.units import build_unit
from tapml_dbg.judge.compare import PolicyKind, dtype_name
from tapml_dbg.errors import TapmlError, TraceError
from tapml_dbg.portable import one_line
from tapml_dbg.model.graph import OpInfo

LIFTED_PREFIX = "lifted_const"


class RoundTripError(TapmlError):
    """An op's module does not survive TVMScript printing and parsing (a TVM limitation or bug)."""


@dataclass
class ValueRef:
    """Where one array of a repro comes from, and the key it is stored under in data.npz."""

    key: str
    kind: str  # input | param | op | constant
    name: str  # the model value (or the lifted parameter) it is
    field: int = -1
    array: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes) if self.array is not None else 0


@dataclass
class OpModule:
    """Everything a repro needs about one op, or about a unit of ops (`unit`, in order; `op` is its last)."""

    op: OpInfo
    script: str
    inputs: list[ValueRef] = field(default_factory=list)  # in parameter order, lifted constants last
    outputs: list[ValueRef] = field(default_factory=list)
    tolerances: list[tuple[float, float]] = field(default_factory=list)  # (rtol, atol) per output
    lifted: int = 0
    unread: list[int] = field(default_factory=list)  # outputs nothing in the model reads: not judged
    unit: list[OpInfo] = field(default_factory=list)  # every op of a multi-op unit, in order (empty: one op)
    func: object = None  # the unit's function as printed (constants lifted to parameters)
    # per output, the noise-floor rule the session judges it by (None: the fixed rule): its float64
    # reference (stored in data.npz), source_factor and relative_floor (repro_noise)
    noise: list = field(default_factory=list)

    @property
    def refs(self) -> list[ValueRef]:
        return self.inputs + self.outputs + [rule["reference"] for rule in self.noise if rule]

    def meta(self, module_path: str) -> dict:
        op = self.op
        entry = {
            "index": op.index, "name": op.name, "op": op.op, "relax_op": op.relax_op, "layer": op.layer,
            "fx_node": op.fx_node, "module": module_path, "lifted_constants": self.lifted,
            "source_location": op.source_location.to_json() if op.source_location else None,
            "inputs": [_entry(ref) for ref in self.inputs],
            "outputs": [dict(_entry(ref), rtol=rtol, atol=atol, judged=k not in self.unread)
                        for k, (ref, (rtol, atol)) in enumerate(zip(self.outputs, self.tolerances))],
        }
        for out, rule in zip(entry["outputs"], self.noise):
            if rule:  # portable/repro.py judges this output by the noise floor, as the session does
                out["noise"] = {"reference": _entry(rule["reference"]), "source_factor": rule["source_factor"],
                                "relative_floor": rule["relative_floor"]}
        if len(self.unit) > 1:  # portable/repro.py names such a repro by its unit
            entry["unit"] = [{"index": o.index, "name": o.name, "op": o.op, "relax_op": o.relax_op}
                             for o in self.unit]
        return entry


def _entry(ref: ValueRef) -> dict:
    entry = {"key": ref.key, "kind": ref.kind, "name": ref.name, "dtype": dtype_name(ref.array),
             "shape": list(ref.array.shape)}
    if ref.kind == "op":
        entry["field"] = ref.field
    return entry


def lift_constants(func):
    """`func` with each tensor constant (and each non-finite scalar) replaced by a new trailing parameter.

    Returns `(function, [(parameter name, numpy value)])`.
    """
    from tvm import relax

    lifted: list[tuple[object, np.ndarray]] = []
    taken = {param.name for param in func.params}

    @relax.expr_functor.mutator
    class Lifter(relax.PyExprMutator):
        def visit_generic_const_(self, const):
            value = const.value
            if not hasattr(value, "numpy"):
                return const
            array = value.numpy()
            if array.ndim == 0 and _prints_inline(array):
                return const
            name = f"{LIFTED_PREFIX}_{len(lifted)}"
            while name in taken:
                name += "_"
            taken.add(name)
            var = relax.Var(name, const.ty)
            lifted.append((var, array))
            return var

    body = Lifter().visit_expr(func)
    if not lifted:
        return func, []
    params = list(body.params) + [var for var, _ in lifted]
    new = relax.Function(params, body.body, None, body.is_pure, body.attrs)
    new = new.with_attr("num_input", len(params))
    return new, [(var.name, array) for var, array in lifted]


def _prints_inline(array: np.ndarray) -> bool:
    """Scalars TVMScript prints and parses back exactly (not inf/nan, which print as strings)."""
    kind = array.dtype.kind
    if kind in "biu":
        return True
    if kind == "f" and array.dtype.name in ("float16", "float32", "float64"):
        return math.isfinite(float(array))
    return False


def to_script(func, op_name: str | list[str]) -> str:
    """TVMScript of `func` as module `main`, verified to parse back to the same function."""
    import tvm
    import tvm.script

    mod = tvm.IRModule({"main": func})
    text = mod.script()
    if "metadata[" in text:
        raise RoundTripError(f"op {op_name}: its TVMScript still refers to metadata (an unlifted constant)")
    try:
        back = tvm.script.from_source(text)
        tvm.ir.assert_structural_equal(back, mod)
    except Exception as exc:
        raise RoundTripError(f"op {op_name}: TVMScript round trip failed: {one_line(exc)}") from exc
    names = {b.var.name for block in back["main"].body.blocks for b in block.bindings}
    for wanted in [op_name] if isinstance(op_name, str) else op_name:
        if wanted not in names:
            raise RoundTripError(f"op {wanted}: TVMScript round trip renamed the op's binding "
                                 "(a --transform that targets it by name would miss it)")
    return text


def op_module(session, op: OpInfo) -> OpModule:
    """The op's unit (as the session compiles it), lifted and printed, with its recorded values.

    Raises TraceError when a value it needs was not recorded, RoundTripError when TVMScript
    cannot carry the module.
    """
    return unit_module(session, [op])


def unit_outputs(session, ops: list[OpInfo]) -> list[OpInfo]:
    """The values a unit of `ops` hands on: those read by an op outside it, and its last op."""
    inside = {op.name for op in ops}
    read_outside = {name for other in session.ops if other.name not in inside for name in other.inputs}
    return [op for op in ops if op.outputs and (op.name in read_outside or op is ops[-1])]


def unit_module(session, ops: list[OpInfo], outputs: list[OpInfo] | None = None) -> OpModule:
    """Ops `ops` compiled as one function (the session's `build_unit`), fed their recorded inputs and
    compared at `outputs` (default: what the unit hands on). An output that reads a value computed
    inside the unit is held to the propagated tolerance, as the engine judges values that crossed
    target ops. Raises as `op_module`."""
    from tvm import relax

    outputs = outputs or unit_outputs(session, ops) or [ops[-1]]
    names = [op.name for op in ops]
    last = ops[-1]
    func, spec = build_unit(session.main, names, [op.name for op in outputs])
    for param in func.params:
        if not isinstance(param.ty, relax.TensorType):
            raise RoundTripError(f"op {last.name}: input {param.name} is not a tensor ({param.ty}); "
                                 "only tensor inputs can be dumped")
    lifted_func, constants = lift_constants(func)
    script = to_script(lifted_func, names if len(names) > 1 else last.name)
    inputs = [_input_ref(session, name, field_index) for name, field_index in spec.inputs]
    for ref, param in zip(inputs, func.params):
        ref.array = _declared_shape(ref.array, _static_shape(param.ty))
    for number, (name, array) in enumerate(constants):
        inputs.append(ValueRef(f"const/{last.name}/{number}", "constant", name, -1, array))
    refs, tolerances, unread, noise = [], [], [], []
    dead_fields = getattr(session, "dead_fields", {})
    for op in outputs:
        source = session.source_values(op.index)
        if len(source) == len(op.outputs):
            source = [_declared_shape(array, spec_.shape) for array, spec_ in zip(source, op.outputs)]
        # outputs nothing in the model reads (e.g. the indices of max_pool2d_with_indices) are not judged
        unread += [len(refs) + k for k in sorted(dead_fields.get(op.name, ()))]
        refs += [ValueRef(f"op/{op.name}/{k}", "op", op.name, k, array) for k, array in enumerate(source)]
        # the tolerance as the session picks it: by the source's own dtype when the recorder had to cast
        tolerance_dtype = session.verdicts.tolerance_dtype(op.index)
        crossed = any(name in names for name in op.inputs)
        for array in source:
            tol = session.verdicts.policy.for_value(tolerance_dtype or dtype_name(array), op.name, crossed)
            tolerances.append((float(tol.rtol), float(tol.atol)))
        noise += repro_noise(session, op, source, crossed)
    return OpModule(last, script, inputs, refs, tolerances, len(constants), unread,
                    list(ops) if len(ops) > 1 else [], lifted_func, noise)


def repro_noise(session, op: OpInfo, source: list[np.ndarray], crossed: bool) -> list[dict | None]:
    """Per output of `op`, the noise-floor rule the session judges it by, for the repro to judge the same
    way: the float64 reference (isolated, or the whole model's for a value that crossed ops of the unit),
    and the rule's two numbers. None where the session judges by the fixed rule: `tol fixed`, a per-op
    tolerance, an integer output, no float64 reference, or undefined elements in the source."""
    policy = session.verdicts.policy
    if policy.kind != PolicyKind.NOISE_FLOOR or op.name in policy.by_op:
        return [None] * len(source)
    try:
        reference = session.reference.propagated(op.index) if crossed else session.reference.isolated(op.index)
    except TraceError:
        return [None] * len(source)
    rules: list[dict | None] = []
    for k, array in enumerate(source):
        values = reference.value(k)
        dtype = dtype_name(array)
        if values is None or reference.mask(k) is not None or not dtype.startswith(("float", "bfloat")) \
                or tuple(np.shape(values)) != tuple(array.shape):
            rules.append(None)
            continue
        rules.append({"reference": ValueRef(f"reference/{op.name}/{k}", "reference", op.name, k,
                                            np.asarray(values, dtype=np.float64)),
                      "source_factor": float(policy.noise.source_factor),
                      "relative_floor": float(policy.noise.relative_floor(dtype, crossed))})
    return rules


def _input_ref(session, name: str, field_index: int) -> ValueRef:
    ref = session.requests.recorded_ref(name, field_index)
    reader = session.reader
    if ref[0] == "input":
        return ValueRef(f"input/{name}", "input", name, -1, reader.tensors.input(name))
    if ref[0] == "param":
        return ValueRef(f"param/{name}", "param", name, -1, reader.tensors.param(name))
    op = session.by_name[name]
    k = max(field_index, 0)
    if ref[0] == "value":  # the source's value cast to the type the import declares (engine/requests.py)
        return ValueRef(f"op/{name}/{k}/as_{dtype_name(ref[1])}", "op", name, k, ref[1])
    return ValueRef(f"op/{name}/{k}", "op", name, k, session.source_values(op.index)[k])


def _static_shape(ty) -> tuple | None:
    shape = getattr(ty, "shape", None)
    try:
        return tuple(int(d) for d in shape.values) if shape is not None else None
    except (TypeError, AttributeError):
        return None


def _declared_shape(array: np.ndarray, declared) -> np.ndarray:
    """Work around traces that store 0-d tensors as shape (1,): give them back their declared 0-d shape.

    (`np.ascontiguousarray`, used when the trace is written, turns 0-d arrays into 1-d ones.)
    Nothing else is reshaped: any other shape difference is a real finding.
    """
    if declared is not None and tuple(declared) == () and array.shape == (1,):
        return array.reshape(())
    return array
