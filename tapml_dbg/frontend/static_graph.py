"""Make an imported `main` a graph the trace can hold: static tensor values only, one per binding.

TVM imports some models into bindings that are not static tensors, and runs them; a trace holds
tensors of known shape and the operators that compute them. Each rewrite here keeps what the
target computes and is listed among the trace's import fixes:

- `none-outputs`: a forward returning `None` among its outputs (TVM: an `R.null_value()` field of
  the output tuple) returns the other outputs; a `None` carries no value to record or compare.
- `runtime-checks`: `R.assert_op` bindings (e.g. one_hot's "class values must be non-negative")
  are dropped; the conditions they check stay ops of their own, recorded and compared, and the
  recorded inputs passed them on the source. A trace holds no assertion (model/serialize refuses it).
- `static-size`: torch's data-dependent sizes (see `specialize`) are bound to the recorded run's,
  and a value whose shape TVM only knows at run time (`R.nonzero`) is cast to that static shape
  where the graph casts it (`R.match_cast`), so every op has a static shape.
- unused scalar bindings (torch.export's `u0 >= 0` size guards) compute nothing and are dropped.

`make_static` returns the function unchanged (the same object) when none of this applies.
"""

from __future__ import annotations

from tapml_dbg.errors import ModelError
from tapml_dbg.model.units import flatten_ty, substitute

NONE_OUTPUTS_FIX = "none-outputs"
RUNTIME_CHECKS_FIX = "runtime-checks"
NULL_OP = "relax.null_value"
ASSERT_OP = "relax.assert_op"
SIZE_BOUND_ATTRS = ("tir_var_lower_bound", "tir_var_upper_bound")  # bounds of symbols bound away


def make_static(main, symbols: dict[str, int]) -> tuple[object, list[str]]:
    """`main` (after ToNonDataflow) with static tensor bindings only, and the fixes applied."""
    from tvm import relax

    present = {str(v) for v in relax.analysis.defined_symbolic_vars(main)}
    symbols = {name: value for name, value in symbols.items() if name in present}
    if symbols:
        main = main.bind_symbolic_vars(symbols)
    for key in SIZE_BOUND_ATTRS:  # bounds of symbols the graph no longer has (static sizes)
        if main.attrs is not None and key in main.attrs and not (set(map(str, main.attrs[key])) & present):
            main = main.without_attr(key)
    bindings = [b for block in main.body.blocks for b in block.bindings]
    uses = _uses(bindings, main.body.body)
    nulls = {b.var for b in bindings if _calls(b.value, NULL_OP)}
    checks = [b for b in bindings if _calls(b.value, ASSERT_OP)]
    folded = _folds(bindings, uses)
    unused = [b for b in bindings if b.var not in nulls and not uses.get(b.var) and flatten_ty(b.var.ty) is None
              and not _calls(b.value, ASSERT_OP)]
    if not (symbols or nulls or checks or folded or unused):
        return main, []
    dropped = {b.var for b in checks + unused} | nulls | set(folded)
    for var in nulls:
        if any(not isinstance(user, relax.Tuple) for user in uses.get(var, [])):
            raise ModelError(f"{var.name} is None and is read by an operator; tapml-dbg records tensor values only")
    fixes = []
    if nulls:
        fixes.append(NONE_OUTPUTS_FIX)
    if checks:
        fixes.append(f"{RUNTIME_CHECKS_FIX}: {len(checks)} dropped")
    return _rebuild(main, bindings, dropped, nulls, folded), fixes


def _calls(value, op_name: str) -> bool:
    from tvm import relax

    return isinstance(value, relax.Call) and getattr(value.op, "name", None) == op_name


def _uses(bindings, body) -> dict:
    """var → the expressions (binding values, or the body) that read it."""
    from tvm import relax

    uses: dict = {}
    for value in [b.value for b in bindings] + [body]:
        for var in relax.analysis.free_vars(value):
            uses.setdefault(var, []).append(value)
    return uses


def _folds(bindings, uses) -> dict:
    """Bindings whose shape TVM knows only at run time, read once, by the match_cast that fixes it:
    var → that match_cast (which then computes the value itself)."""
    from tvm import relax

    folds = {}
    for binding in bindings:
        if flatten_ty(binding.var.ty) is not None or not isinstance(binding.var.ty, relax.TensorType):
            continue
        readers = uses.get(binding.var, [])
        casts = [b for b in bindings if isinstance(b, relax.MatchCast) and b.value.same_as(binding.var)]
        if len(readers) == 1 and len(casts) == 1:
            folds[binding.var] = casts[0]
    return folds


def _rebuild(main, bindings, dropped: set, nulls: set, folded: dict):
    from tvm import relax

    computed_by = {cast.var: producer for producer, cast in folded.items()}
    remap: dict = {}
    builder = relax.BlockBuilder()
    attrs = {"num_input": main.attrs["num_input"]} if main.attrs is not None and "num_input" in main.attrs else None
    with builder.function("main", list(main.params), attrs=attrs, pure=True):
        for binding in bindings:
            if binding.var in dropped:
                continue
            if isinstance(binding, relax.MatchCast):
                producer = computed_by.get(binding.var)
                value = _value_of(producer, bindings) if producer is not None else binding.value
                var = builder.match_cast(_without_nulls(substitute(value, remap), nulls), binding.ty,
                                         binding.var.name)
            else:
                var = builder.emit(_without_nulls(substitute(binding.value, remap), nulls), binding.var.name)
            remap[binding.var] = var
        builder.emit_func_output(_without_nulls(substitute(main.body.body, remap), nulls))
    result = builder.get()["main"]
    _check_static(result)
    return result


def _value_of(var, bindings):
    return next(b.value for b in bindings if b.var.same_as(var))


def _without_nulls(expr, nulls: set):
    from tvm import relax

    if isinstance(expr, relax.Tuple) and any(isinstance(f, relax.Var) and f in nulls for f in expr.fields):
        return relax.Tuple([f for f in expr.fields if not (isinstance(f, relax.Var) and f in nulls)])
    return expr


def _check_static(main) -> None:
    for block in main.body.blocks:
        for binding in block.bindings:
            if flatten_ty(binding.var.ty) is None:
                raise ModelError(f"{binding.var.name} has no static tensor type ({binding.var.ty}) even with the "
                                 "recorded run's sizes; tapml-dbg records static tensor graphs only")
