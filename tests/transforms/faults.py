"""Fault-planting transforms for tests: each rewrites one named op wherever it appears.

A transform sees every module the tool compiles for the target; an op keeps its name
(the binding name) in every unit, so `FAULT_OP` pins the fault to one op of the model.
Set the op with the environment variable TAPML_FAULT_OP (and TAPML_FAULT_SCALE).
"""

import os

import tvm
from tvm import relax


def _rewrite(mod, make_value):
    target = os.environ["TAPML_FAULT_OP"]

    @relax.expr_functor.mutator
    class Planter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if binding.var.name == target:
                value = make_value(self, value)
            new_var = self.builder_.emit(value, binding.var.name)
            self.set_var_remap(binding.var, new_var)

    planter = Planter(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            planter.builder_.update_func(gvar, planter.visit_expr(func))
    return planter.builder_.get()


def scale(mod):
    """Multiply the op's result by TAPML_FAULT_SCALE (default 1.01)."""
    factor = float(os.environ.get("TAPML_FAULT_SCALE", "1.01"))

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        return relax.op.multiply(inner, relax.const(factor, inner.ty.dtype))

    return _rewrite(mod, make)


def nan(mod):
    """Replace one element's worth of the op's output by NaN (multiplies by NaN at index 0)."""

    def make(mutator, value):
        inner = mutator.builder_.emit(value)
        return relax.op.multiply(inner, relax.const(float("nan"), inner.ty.dtype))

    return _rewrite(mod, make)
