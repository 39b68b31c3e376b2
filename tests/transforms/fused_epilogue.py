"""A fusion-only planted fault: a wrong matmul epilogue.

`epilogue` scales the result of `add(matmul(x, w), b)` (either operand of the add; reshapes between
the matmul and the add are looked through) by SETTINGS["scale"] (default 1.01), but only when the
matmul is computed in the same Relax function as the add: like a backend whose fused matmul+bias
kernel is wrong while both ops are right alone. Compiled alone, the add reads the matmul's value as a
parameter and is left untouched, so every isolated verdict passes.
SETTINGS["op"], when set, limits the fault to the add binding of that name.
"""

import tvm
from tvm import relax

SETTINGS: dict = {}

LOOKED_THROUGH = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims")


def _op_name(value) -> str:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else ""


def _fed_by_matmul(var, bound: dict) -> bool:
    """Whether `var` is a matmul's result (possibly reshaped) computed in this function."""
    while isinstance(var, relax.Var) and var in bound:
        name = _op_name(bound[var])
        if name == "relax.matmul":
            return True
        if name not in LOOKED_THROUGH:
            return False
        var = bound[var].args[0]
    return False


def epilogue(mod):
    factor = float(SETTINGS.get("scale", "1.01"))
    only = SETTINGS.get("op")

    @relax.expr_functor.mutator
    class Planter(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.bound = {}

        def visit_var_binding_(self, binding):
            self.bound[binding.var] = binding.value
            value = self.visit_expr(binding.value)
            if _op_name(binding.value) == "relax.add" and (only is None or binding.var.name == only) \
                    and any(_fed_by_matmul(arg, self.bound) for arg in binding.value.args):
                inner = self.builder_.emit(value)
                value = relax.op.multiply(inner, relax.const(factor, inner.ty.dtype))
            new_var = self.builder_.emit(value, binding.var.name)
            self.set_var_remap(binding.var, new_var)

    planter = Planter(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            planter.bound = {}
            planter.builder_.update_func(gvar, planter.visit_expr(func))
    return planter.builder_.get()
