"""The rewrites of a `tapml-dbg fix` transform: this file's text, with `REWRITES` filled in, IS the
`fix.py` the tool writes (tvm only; nothing of tapml-dbg), so what the tool verified is what the
user runs.

`fix(mod)` rewrites the Relax bindings named in `REWRITES` (binding name -> (kind, options)) in
every Relax function of `mod`; an op keeps its binding name in every unit tapml-dbg compiles and in
the whole model's `main`, so the same file works on one op, a block, or the model as imported.
Apply it before the build: `mod = fix(mod); tvm.compile(mod, target)`, or in a pass list as
`tvm.ir.transform.module_pass(lambda mod, _ctx: fix(mod), opt_level=0, name="tapml_fix")`.

Kinds:
- "float32": the op computed in float32: its float16/bfloat16 operands cast to float32, its result
  cast back to the dtype it had (the consumers are unchanged);
- "cast": operands of dtype options["from"] cast to options["to"] (the dtype the source computed),
  the op's own dtype attribute too; the result keeps the source's dtype. Its consumers take that
  dtype too: in the whole model Relax infers it, and in a function that receives the op's value as a
  parameter (a unit tapml-dbg compiles per op) the parameter named in `RETYPED` is retyped, so the
  rewrites hold together wherever the model is cut;
- "bool-as": bool operands cast to options["to"] (an integer type the target compiles);
- "pow": `power(x, 2.0 | 3.0)` as `x * x` / `x * x * x`;
- "wrap-index": a `take` at a negative constant index read at the index plus the axis' extent;
- "default-schedule": the op legalized on its own and scheduled with
  `tvm.s_tir.transform.DefaultGPUSchedule` for options["target"], marked scheduled so that dlight
  leaves it alone.
"""

import tvm
from tvm import relax

LOW_PRECISION = ("float16", "bfloat16")
WIDE = "float32"

REWRITES: dict = {}  # binding name -> (kind, options): filled in by `tapml-dbg fix`
RETYPED: dict = {}  # binding name -> (declared dtype, the dtype its rewrite gives): filled in by `tapml-dbg fix`


def _dtype(expr):
    ty = getattr(expr, "ty", None)
    return getattr(ty, "dtype", None) if isinstance(ty, relax.TensorType) else None


def _cast_operands(builder, args, wanted):
    """`args` with each tensor operand for which `wanted(dtype)` names a dtype cast to it (tuples too)."""
    out = []
    for arg in args:
        if isinstance(arg, relax.Tuple):
            out.append(relax.Tuple(_cast_operands(builder, list(arg.fields), wanted)))
            continue
        dtype = _dtype(arg)
        to = wanted(dtype) if dtype else None
        out.append(builder.emit(relax.op.astype(arg, to)) if to and to != dtype else arg)
    return out


def _with_dtype_attr(call, old, new):
    """`call`'s attrs with a `dtype`/`out_dtype` field equal to `old` set to `new` (the others kept)."""
    attrs = call.attrs
    keys = [key for key in ("dtype", "out_dtype") if attrs is not None and hasattr(attrs, key)]
    if not any(getattr(attrs, key) is not None and str(getattr(attrs, key)) == old for key in keys):
        return attrs
    fields = {key: getattr(attrs, key) for key in dir(attrs)
              if not key.startswith("_") and not callable(getattr(attrs, key, None))}
    fields.update({key: new for key in keys if str(getattr(attrs, key)) == old})
    return tvm.ir.make_node(type(attrs).__tvm_ffi_type_info__.type_key, **fields)


def _recall(call, args, attrs=None):
    return relax.Call(call.op, args, call.attrs if attrs is None else attrs, call.ty_args)


def _cast_back(builder, value, dtype):
    """`value` (a tensor or a tuple of them) with its fields cast to `dtype` where they are wider."""
    ty = value.ty
    if isinstance(ty, relax.TensorType):
        return relax.op.astype(value, dtype) if ty.dtype != dtype else value
    if isinstance(ty, relax.TupleType):
        fields = [builder.emit(relax.TupleGetItem(value, i)) for i in range(len(ty.fields))]
        return relax.Tuple([_cast_back(builder, f, dtype) if _dtype(f) == WIDE else f for f in fields])
    return value


def _float32(builder, call, _options):
    args = _cast_operands(builder, list(call.args), lambda dt: WIDE if dt in LOW_PRECISION else None)
    declared = _dtype(call) or next((f.dtype for f in getattr(call.ty, "fields", [])
                                     if isinstance(f, relax.TensorType)), None)
    value = builder.emit(_recall(call, args))
    return _cast_back(builder, value, declared) if declared in LOW_PRECISION else value


def _cast(builder, call, options):
    old, new = options["from"], options["to"]
    args = _cast_operands(builder, list(call.args), lambda dt: new if dt == old else None)
    return _recall(call, args, _with_dtype_attr(call, old, new))


def _bool_as(builder, call, options):
    return _recall(call, _cast_operands(builder, list(call.args),
                                        lambda dt: options["to"] if dt == "bool" else None))


def _pow(builder, call, _options):
    base, exponent = call.args
    value = float(exponent.value.numpy())
    squared = builder.emit(relax.op.multiply(base, base))
    return relax.op.multiply(squared, base) if value == 3.0 else squared


def _wrap_index(builder, call, _options):
    data, indices = call.args
    axis = int(call.attrs.axis)
    extent = int(data.ty.shape[axis])
    array = indices.value.numpy()
    fixed = relax.const(array + (array < 0) * extent, str(array.dtype))
    return relax.op.take(data, fixed, axis=axis, mode=str(call.attrs.mode))


def _default_schedule(builder, call, options):
    """The op legalized alone; its PrimFunc scheduled by DefaultGPUSchedule after the rewrite (`fix`)."""
    legalize = tvm.ir.Op.get(call.op.name).get_attr("FLegalize")
    value = legalize(builder, call)
    if isinstance(value, relax.Call) and value.op.name == "relax.call_tir":
        _TO_SCHEDULE.append((value.args[0], options["target"]))
    return value


_KINDS = {"float32": _float32, "cast": _cast, "bool-as": _bool_as, "pow": _pow, "wrap-index": _wrap_index,
          "default-schedule": _default_schedule}
_TO_SCHEDULE: list = []


def _schedule(mod):
    """DefaultGPUSchedule on the PrimFuncs the "default-schedule" rewrites made, marked scheduled."""
    from tvm import s_tir

    for gvar, target in _TO_SCHEDULE:
        func = mod[gvar]
        try:
            with tvm.target.Target(target):
                scheduled = s_tir.transform.DefaultGPUSchedule()(tvm.IRModule({gvar: func}))
        except RuntimeError:  # tvm.error.InternalError: the pass cannot schedule it: left to the build's own schedules
            continue
        mod[gvar] = scheduled[gvar]  # marked scheduled by the pass: dlight leaves it alone
    _TO_SCHEDULE.clear()
    return mod


def _retyped_params(rewriter, func):
    """`func` with each parameter named in RETYPED (a value a retyping rewrite computes, received from
    outside) in the dtype that rewrite gives, so that the function takes what the rewritten op returns."""
    params = []
    for param in func.params:
        declared, new = RETYPED.get(param.name, (None, None))
        ty = param.ty
        if declared is not None and isinstance(ty, relax.TensorType) and ty.dtype == declared:
            retyped = relax.Var(param.name, relax.TensorType(ty.shape, new))
            rewriter.set_var_remap(param, retyped)
            param = retyped
        params.append(param)
    if all(new.same_as(old) for new, old in zip(params, func.params)):
        return func
    return relax.Function(params, func.body, None, func.is_pure, func.attrs, func.span)


def fix(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every binding named in REWRITES rewritten (a binding of another name is left as it is)."""
    if not REWRITES:
        return mod

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            rewrite = REWRITES.get(binding.var.name)
            if rewrite is not None and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                kind, options = rewrite
                value = _KINDS[kind](self.builder_, value, options)
            output = self.builder_.current_block_is_dataflow() and not isinstance(binding.var, relax.DataflowVar)
            emit = self.builder_.emit_output if output else self.builder_.emit
            self.set_var_remap(binding.var, emit(value, binding.var.name))

    rewriter = Rewriter(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(_retyped_params(rewriter, func)))
    result = rewriter.builder_.get()
    return _schedule(result) if _TO_SCHEDULE else result
