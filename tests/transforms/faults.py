"""Fault-planting transforms for tests: each rewrites one named op wherever it appears.

A transform sees every module the tool compiles for the target; an op keeps its name
(the binding name) in every unit, so the op name pins the fault to one op of the model.
Configure with the environment variables TAPML_FAULT_OP, TAPML_FAULT_SCALE, TAPML_FAULT_LIMIT,
or (better: the compile cache keys on the transform file's text, not on the environment) with
a copy of this file that sets the `SETTINGS` below (see `tests/conftest.py: fault_transform`).
"""

import os

import tvm
from tvm import relax


SETTINGS: dict = {}


def _setting(name: str, default=None):
    return SETTINGS.get(name, os.environ.get(f"TAPML_FAULT_{name.upper()}", default))


def _rewrite(mod, make_value):
    target = _setting("op")

    @relax.expr_functor.mutator
    class Planter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if binding.var.name == target:
                value = make_value(self, value)
            new_var = self.builder_.emit(value, binding.var.name)
            self.set_var_remap(binding.var, new_var)

    return _mutated(Planter, mod)


def _mutated(mutator_class, mod):
    """`mod` with every Relax function rewritten by a `relax.PyExprMutator` subclass."""
    mutator = mutator_class(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def scale(mod):
    """Multiply the op's result by TAPML_FAULT_SCALE (default 1.01); of an op that returns a tuple (a
    paged-KV attention call: out, keys, values), its first field."""
    factor = float(_setting("scale", "1.01"))

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        if isinstance(inner.ty, relax.TupleType):
            fields = [mutator.builder_.emit(relax.TupleGetItem(inner, k)) for k in range(len(inner.ty.fields))]
            first = relax.op.multiply(fields[0], relax.const(factor, fields[0].ty.dtype))
            return relax.Tuple([mutator.builder_.emit(first), *fields[1:]])
        return relax.op.multiply(inner, relax.const(factor, inner.ty.dtype))

    return _rewrite(mod, make)


def nan(mod):
    """Replace one element's worth of the op's output by NaN (multiplies by NaN at index 0)."""

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        return relax.op.multiply(inner, relax.const(float("nan"), inner.ty.dtype))

    return _rewrite(mod, make)


def clip(mod):
    """Clamp the op's result to [-TAPML_FAULT_LIMIT, LIMIT]: harmless on small activations,
    wrong on realistic large ones (an overflow-style bug)."""
    limit = float(_setting("limit", "8"))

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        return relax.op.clip(inner, -limit, limit)

    return _rewrite(mod, make)


def scale_negative(mod):
    """Scale only the negative part of the result: a fault that a following ReLU erases."""

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        dtype = inner.ty.dtype
        negative = mutator.builder_.emit(relax.op.less(inner, relax.const(0.0, dtype)))
        scaled = mutator.builder_.emit(relax.op.multiply(inner, relax.const(1.5, dtype)))
        return relax.op.where(negative, scaled, inner)

    return _rewrite(mod, make)


def out_of_bounds(mod):
    """Replace the op by a gather far outside its input: a kernel that segfaults when run."""
    import numpy as np

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        shape = [int(d) for d in inner.ty.shape.values]
        flat = mutator.builder_.emit(relax.op.reshape(inner, [-1]))
        indices = relax.const(np.full(shape, (1 << 31) - 1, dtype="int64"))
        return relax.op.take(flat, indices, axis=0, mode="fast")

    return _rewrite(mod, make)


def hang(mod):
    """Never finish compiling a module that holds the op (a stand-in for a hanging compile)."""
    import time

    target = _setting("op")
    main = mod["main"]
    names = {b.var.name for block in main.body.blocks for b in block.bindings}
    if target in names:
        time.sleep(3600)
    return mod
