"""Replace free variables in a Relax expression (TVM 0.27 has no public `bind` helper)."""

from __future__ import annotations


def substitute(expr, mapping: dict):
    from tvm import relax

    @relax.expr_functor.mutator
    class Substituter(relax.PyExprMutator):
        def visit_var_(self, var):
            return mapping.get(var, var)

    return Substituter().visit_expr(expr)
