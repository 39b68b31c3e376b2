"""A kernel that is wrong only past a context length (a stand-in for a schedule bug above some size).

`softmax_from` scales by 1.01 the rows of every softmax that attend to at least FROM positions (the
row's entries above MASKED: the others are the attention mask's large negative fill, whether the
row is a dynamic cache's or a static cache's): in a generation, the prefill (row i attends to i + 1
positions) and the decode steps before the context reaches FROM are right, every later step is
wrong. FROM is `SETTINGS["from"]`, else the environment variable TAPML_FAULT_FROM, else 20.
"""

import os

import tvm
from tvm import relax

SETTINGS: dict = {}
MASKED = -1.0e4  # a masked attention score (torch.finfo(dtype).min) is below this; a real one above


def _from() -> int:
    return int(SETTINGS.get("from", os.environ.get("TAPML_FAULT_FROM", "20")))


def softmax_from(mod):
    threshold = _from()
    softmax = tvm.ir.Op.get("relax.nn.softmax")

    @relax.expr_functor.mutator
    class Planter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if isinstance(value, relax.Call) and value.op.same_as(softmax):
                scores = value.args[0]
                dtype = binding.var.ty.dtype
                inner = self.builder_.emit(value)
                attended = self.builder_.emit(relax.op.astype(relax.op.greater(scores, relax.const(MASKED, dtype)), "int32"))
                count = self.builder_.emit(relax.op.sum(attended, axis=[-1], keepdims=True))
                long = self.builder_.emit(relax.op.greater_equal(count, relax.const(threshold, "int32")))
                scale = self.builder_.emit(relax.op.where(long, relax.const(1.01, dtype), relax.const(1.0, dtype)))
                value = relax.op.multiply(inner, scale)
            new_var = self.builder_.emit(value, binding.var.name)
            self.set_var_remap(binding.var, new_var)

    mutator = Planter(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()
