"""A kernel that is wrong only past a context length (a stand-in for a schedule bug above some size).

`softmax_from` scales by 1.01 the result of every softmax whose last axis (the attention's key
positions) holds at least FROM positions: in a generation, the prefill and the decode steps before
the context reaches FROM are right, every later step is wrong. FROM is `SETTINGS["from"]`, else the
environment variable TAPML_FAULT_FROM, else 20.
"""

import os

import tvm
from tvm import relax

SETTINGS: dict = {}


def _from() -> int:
    return int(SETTINGS.get("from", os.environ.get("TAPML_FAULT_FROM", "20")))


def softmax_from(mod):
    threshold = _from()
    softmax = tvm.ir.Op.get("relax.nn.softmax")

    @relax.expr_functor.mutator
    class Planter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if (isinstance(value, relax.Call) and value.op.same_as(softmax)
                    and int(binding.var.ty.shape.values[-1]) >= threshold):
                inner = self.builder_.emit(value)
                value = relax.op.multiply(inner, relax.const(1.01, inner.ty.dtype))
            new_var = self.builder_.emit(value, binding.var.name)
            self.set_var_remap(binding.var, new_var)

    mutator = Planter(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()
