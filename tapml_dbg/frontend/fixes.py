"""Workarounds for TVM 0.27 importer bugs that would otherwise stop a model from importing.

Each fix is named; the recorder lists the ones it applied in the trace's meta, so a reader
knows the Relax graph differs from what stock `from_exported_program` would give.

- `matmul-dtype`: the mm/bmm/matmul/addmm converters hard-code `out_dtype="float32"`, so an
  fp16 `addmm` fails to import (fp16 bias + fp32 product) and fp16 matmuls silently become
  fp32. The fix keeps torch's semantics: the product has its inputs' dtype.
"""

from __future__ import annotations

from functools import partial

MATMUL_DTYPE = "matmul-dtype"
# the stock converters each fix replaces (importer.convert_map keys): the only nodes whose declared
# types the stock import can differ at (frontend/stock_import.py compares them and nothing else)
FIXED_CONVERTERS = {MATMUL_DTYPE: ("mm.default", "bmm.default", "matmul.default", "addmm.default")}
STOCK_MATMUL_DTYPE = "float32"  # what the stock mm/bmm/matmul/addmm converters declare, whatever they are fed


def fixes_changing(node) -> list[str]:
    """The fixes whose converter imports FX `node` differently from the stock one: the matmul-dtype fix
    changes a matmul only when one of its tensors is not float32 (the dtype the stock one declares)."""
    key = getattr(node.target, "__name__", "")
    if node.op != "call_function" or key not in FIXED_CONVERTERS[MATMUL_DTYPE]:
        return []
    vals = [arg.meta.get("val") for arg in node.all_input_nodes]
    dtypes = {str(getattr(val, "dtype", "")).replace("torch.", "") for val in vals}
    return [MATMUL_DTYPE] if dtypes - {STOCK_MATMUL_DTYPE} else []


def apply_import_fixes(importer) -> list[str]:
    """Patch converters on this importer instance; return the names of fixes applied."""
    import operator

    from tvm import relax

    matmul = partial(relax.op.linear_algebra.matmul, out_dtype=None)
    for key in ("mm.default", "bmm.default", "matmul.default"):
        if key in importer.convert_map:
            importer.convert_map[key] = importer._binary_op(matmul, operator.matmul)

    def addmm(node):
        x, y, z = (importer.env[arg] for arg in node.args[:3])
        alpha = node.kwargs.get("alpha", 1)
        beta = node.kwargs.get("beta", 1)
        builder = importer.block_builder
        result = None
        if alpha != 0:
            result = builder.emit(relax.op.linear_algebra.matmul(y, z))
            if alpha != 1:
                result = builder.emit(relax.op.multiply(result, relax.const(alpha, result.ty.dtype)))
        if beta != 0:
            bias = x if beta == 1 else builder.emit(relax.op.multiply(x, relax.const(beta, x.ty.dtype)))
            result = bias if result is None else builder.emit(relax.op.add(bias, result))
        return result

    importer.convert_map["addmm.default"] = addmm
    return [MATMUL_DTYPE]
