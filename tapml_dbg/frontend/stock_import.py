"""What TVM's stock importer does to the model, beside the import tapml-dbg records.

tapml-dbg patches converters of `from_exported_program` (`frontend/fixes.py`) so that a model imports
with torch's types; a user's own TVM pipeline runs the stock ones. Where a fix changes how some FX
node imports (`fixes.fixes_changing`: the matmul-dtype fix, on a matmul that is not float32), the
recorder imports the same decomposed program a second time with the stock converters, its bindings
attributed to FX nodes exactly as in the recorded import (`importer.instrumented_import`), and
compares, for the nodes the fixes touch only, what each binding declares: binding k that node N's
converter emitted in one import against binding k of N in the other (every binding of N when both
converters emitted as many; the bindings emitted before the failure at the node a stock import fails
at). Nodes downstream are not compared: what they declare in a stock import follows from these.

The differences are stored per op (op table `stock_outputs`), the run itself in the trace's meta
(`stock_import`: the fixes, the nodes compared, and when the stock import fails outright its one-line
error and the FX node and op it fails at). The engine judges a stock type change as a type verdict
(`engine/references.py`, the one implementation of type verdicts). A float32 model is not imported
twice (no fix changes any of its nodes): the comparison costs nothing there.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from tapml_dbg.frontend.fixes import fixes_changing
from tapml_dbg.frontend.importer import instrumented_import
from tapml_dbg.model.graph import Graph
from tapml_dbg.model.units import flatten_ty
from tapml_dbg.trace.schema import SOURCE_UNPRINTABLE, STOCK_ERROR_MAX_CHARS

_UNPRINTABLE = re.compile(SOURCE_UNPRINTABLE)


@dataclass
class StockImport:
    """One comparison of the recorded import with the stock one."""

    fixes: list[str]  # the import fixes that change some node of this model
    nodes: list[str]  # the FX nodes compared (those the fixes change)
    error: str = ""  # one line: why the stock import fails outright ("": it imports)
    error_node: str = ""  # the FX node it fails at ("": not at a node, or it imports)
    error_op: str = ""  # the op of the recorded import holding that node's value
    reason: str = ""  # the converter's own error in it ("TypeError: Binary operators must ...")
    changed_ops: list[str] = field(default_factory=list)  # ops whose stock-declared type differs
    seconds: float = 0.0

    def to_meta(self) -> dict:
        return {"fixes": self.fixes, "nodes": len(self.nodes), "changed_ops": self.changed_ops,
                "error": self.error or None, "error_node": self.error_node or None,
                "error_op": self.error_op or None, "reason": self.reason or None, "seconds": round(self.seconds, 4)}


def compare_stock_import(program, graph: Graph) -> StockImport | None:
    """Import `program` (as `importer.import_program` imported it into `graph`) with the stock converters
    and set `stock_outputs` on the ops of `graph` whose stock-declared type differs; None (and nothing
    imported) when no fix changes any node."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    emitted, fixes = graph.emitted, graph.import_fixes
    touched: dict[str, list[str]] = {}
    for node in program.graph.nodes:
        changing = fixes_changing(node)
        if changing:
            touched[node.name] = changing
    if not touched:
        return None
    started = time.perf_counter()
    stock = instrumented_import(ExportedProgramImporter(), program)
    by_name = {op.name: op for op in graph.ops}
    result = StockImport(sorted({fix for names in touched.values() for fix in names if fix in fixes}),
                         list(touched))
    failed_at = stock.failure.node.name if stock.failure is not None and stock.failure.node is not None else ""
    if stock.failure is not None:
        result.error = _UNPRINTABLE.sub(" ", stock.failure.message)[:STOCK_ERROR_MAX_CHARS]
        result.reason = _UNPRINTABLE.sub(" ", stock.failure.reason)[:STOCK_ERROR_MAX_CHARS]
        result.error_node = failed_at
        result.error_op = _op_of_node(graph, failed_at)
    for node in touched:
        ours, theirs = emitted.get(node, []), stock.order.get(node, [])
        if len(ours) != len(theirs) and not (node == failed_at and len(theirs) < len(ours)):
            continue  # the converters emit different bindings: nothing lines up
        for name, var in zip(ours, theirs):
            op = by_name.get(name) if name is not None else None
            specs = flatten_ty(stock.types.get(var))
            if op is None or specs is None or len(specs) != len(op.outputs):
                continue
            op.stock_outputs = [(k, spec) for k, (spec, own) in enumerate(zip(specs, op.outputs)) if spec != own]
            if op.stock_outputs:
                result.changed_ops.append(op.name)
    result.changed_ops.sort(key=lambda name: by_name[name].index)
    result.seconds = time.perf_counter() - started
    return result


def _op_of_node(graph: Graph, node: str) -> str:
    """The op holding FX node `node`'s value (the last op attributed to it), "" when none."""
    names = [op.name for op in graph.ops if op.fx_node == node and node]
    return node if node in names else (names[-1] if names else "")
