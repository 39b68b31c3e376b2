"""Workarounds for TVM 0.27 importer bugs that would otherwise stop a model from importing.

Each fix is named; the recorder lists the ones it applied in the trace's meta, so a reader
knows the Relax graph differs from what stock `from_exported_program` would give.

- `matmul-dtype`: the mm/bmm/matmul/addmm converters hard-code `out_dtype="float32"`, so an
  fp16 `addmm` fails to import (fp16 bias + fp32 product) and fp16 matmuls silently become
  fp32. The fix keeps torch's semantics: the product has its inputs' dtype.
- `cat-empty`: torch's legacy rule skips a `cat` operand of shape (0,) whatever the others' ndim;
  TVM's concat rejects it ("Concat expects all input tensors to have same ndim"). transformers'
  `DynamicCache` starts every layer from such a placeholder, so a KV cache filled inside `forward`
  (a generation step, frontend/generation.py) cannot import. The fix drops those operands.
"""

from __future__ import annotations

from functools import partial

MATMUL_DTYPE = "matmul-dtype"
CAT_EMPTY = "cat-empty"
# the stock converters each fix replaces (importer.convert_map keys): the only nodes whose declared
# types the stock import can differ at (frontend/stock_import.py compares them and nothing else)
FIXED_CONVERTERS = {MATMUL_DTYPE: ("mm.default", "bmm.default", "matmul.default", "addmm.default"),
                    CAT_EMPTY: ("cat.default", "concat.default")}
STOCK_MATMUL_DTYPE = "float32"  # what the stock mm/bmm/matmul/addmm converters declare, whatever they are fed


def fixes_changing(node) -> list[str]:
    """The fixes whose converter imports FX `node` differently from the stock one: the matmul-dtype fix
    changes a matmul only when one of its tensors is not float32 (the dtype the stock one declares)."""
    key = getattr(node.target, "__name__", "")
    if node.op == "call_function" and key in FIXED_CONVERTERS[CAT_EMPTY]:
        return [CAT_EMPTY] if any(_legacy_empty(arg) for arg in _cat_operands(node)) else []
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

    def cat_without_empty(stock, node):
        operands = _cat_operands(node)
        kept = [arg for arg in operands if not _legacy_empty(arg)]
        if len(kept) == len(operands) or not kept:
            return stock(node)
        values = [importer.env[arg] for arg in kept]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        return importer.block_builder.emit(relax.op.concat(values, axis=dim))

    for key in FIXED_CONVERTERS[CAT_EMPTY]:
        if key in importer.convert_map:
            importer.convert_map[key] = partial(cat_without_empty, importer.convert_map[key])
    return [MATMUL_DTYPE, CAT_EMPTY]


def _cat_operands(node) -> list:
    operands = node.args[0] if node.args else node.kwargs.get("tensors", [])
    return list(operands) if isinstance(operands, (list, tuple)) else []


def _legacy_empty(arg) -> bool:
    """An operand torch's `cat` skips: a 1-D tensor of 0 elements (shape (0,))."""
    val = getattr(arg, "meta", {}).get("val") if hasattr(arg, "meta") else None
    shape = getattr(val, "shape", None)
    return shape is not None and tuple(shape) == (0,)
