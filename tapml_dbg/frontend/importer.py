"""torch.export → Relax, keeping for every binding the FX node (aten op), layer and user source line behind it.

We decompose the exported program ourselves and import that same graph, so that FX nodes seen
here are the ones the recorder runs. Each converter call is wrapped to note the current FX
node, and `BlockBuilder.emit` (and `match_cast`) is wrapped to attribute every emitted binding to it.

Where TVM's own pipeline imports and runs a model, so does this one, or it says in one line why not:
a program holding sparse params or buffers is imported without decomposition, as TVM imports it
(the trace stores them dense, as TVM binds them); `torch.cond` branches and data-dependent sizes are
fixed to the recorded run (`specialize`); None outputs, runtime checks and size guards are
rewritten away (`static_graph`). Each such rewrite is listed in the trace's import fixes.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from dataclasses import dataclass

from tapml_dbg.errors import ModelError
from tapml_dbg.frontend.fixes import apply_import_fixes
from tapml_dbg.frontend.host_only import add_placeholders, host_only_ops, note_failed_converter
from tapml_dbg.frontend.source_location import source_location_of
from tapml_dbg.frontend.specialize import specialization_of, specialize
from tapml_dbg.frontend.static_graph import make_static
from tapml_dbg.model.graph import Graph, OpInfo, TensorSpec
from tapml_dbg.model.units import flatten_ty

OUTPUT_OP_NAME = "output"
SPARSE_FIX = "sparse-as-dense"  # "sparse-as-dense: w (sparse_coo)": stored dense, graph not decomposed
EXPORT_HINT = "make forward() exportable: no data-dependent control flow"  # ends a torch.export error
# where torch's message names the user's line that raised (torch 2.13)
_OUTPUT_TYPE_RE = re.compile(r"Found <class '(?P<cls>[^']+)'> in output, which is not a known type")
_RAISED_AT_RE = re.compile(r'The following call raised this error:\s*File "(?P<file>[^"]+)", line (?P<line>\d+)'
                           r'[^\n]*\n(?P<code>[^\n]+)')


@dataclass
class Provenance:
    """Where one binding came from: FX node name and, for a multi-output node, the path in it."""

    node: str
    index: tuple[int, ...] | None  # None: the node's whole value


def export_program(module, inputs):
    """torch.export + core-ATen decomposition, fixed to these inputs, with one-line errors.

    A program holding sparse tensors is not decomposed: TVM's importer skips that step for them
    too (decomposing them fails in torch for csr/csc/bsr layouts).
    """
    import torch

    sparse_inputs = [k for k, t in enumerate(inputs) if _is_sparse(t)]
    if sparse_inputs:
        raise ModelError(f"input {sparse_inputs[0]} is a sparse tensor; give dense inputs (x.to_dense()): "
                         "a trace stores and replays dense arrays")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):  # on a failure torch prints the partial graph, twice
            program = torch.export.export(module, tuple(inputs))
    except Exception as exc:
        error = ModelError(_output_type_failure(exc) or
                           f"torch.export failed: {type(exc).__name__}: {_first_line(exc)}{_raised_at(exc)} "
                           f"({EXPORT_HINT})")
        partial = getattr(exc, "partial_fx_graph", None)
        error.detail = str(exc).strip() + (f"\n\nthe graph exported up to the failure:\n{partial}" if partial else "")
        raise error from exc
    sys.stderr.write(printed.getvalue())  # what torch said on a success (warnings) is not ours to hide
    sparse = _sparse_tensors(program)
    if not sparse:
        try:
            program = program.run_decompositions()
        except Exception as exc:
            raise ModelError(f"decomposing the exported program failed: {_first_line(exc)}") from exc
    fixed = specialize(program, inputs)
    fixed.fixes[:0] = [f"{SPARSE_FIX}: {name}" for name in sparse]
    return program


def _is_sparse(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.layout != torch.strided


def _sparse_tensors(program) -> list[str]:
    """`name (layout)` of each sparse param, buffer and constant of the program. torch runs them as
    they are; the trace stores them dense (as TVM binds them), and the graph, not decomposed, keeps
    its sparse ops (`aten._sparse_mm`), which TVM imports as dense ones."""
    found = []
    for table in (program.state_dict, getattr(program, "constants", None) or {}):
        for name, value in table.items():
            if _is_sparse(value):
                found.append(f"{name} ({str(value.layout).replace('torch.', '')})")
    return found


def _output_type_failure(exc: BaseException) -> str | None:
    """The message for an export that failed on what forward returns (torch: "Found <class X> in
    output, which is not a known type"): a KV cache object says to return logits; else None."""
    match = _OUTPUT_TYPE_RE.search(str(exc))
    if match is None:
        return None
    kind = match["cls"]
    if "cache" in kind.lower():
        return (f"torch.export failed: the model's output holds a {kind} (a KV cache object), which cannot be "
                "exported: call the model with use_cache=False and return its .logits, or return the unwrapped "
                "transformers causal LM and its input ids from build() (tapml-dbg then drives it itself: "
                "attention mask, positions, use_cache=False, logits; see docs/causal-lm.md)")
    return (f"torch.export failed: the model's output holds a {kind}, which is not a tensor: make forward() "
            "return tensors (or tuples, lists or dicts of them)")


def _raised_at(exc: BaseException) -> str:
    """` at FILE:LINE: code`, the user's line torch names in its message (`The following call raised
    this error:`), else nothing."""
    match = _RAISED_AT_RE.search(str(exc))
    return f" at {match['file']}:{match['line']}: {match['code'].strip()}" if match else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def layer_of(node) -> str:
    """The innermost nn.Module path of an FX node ("" at the top level)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return _clean_module_path(path)


def _clean_module_path(path: str) -> str:
    # torch.export spells paths like "transformer.h.0.attn"; older forms use L['self'] wrappers
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"getattr\(([^,]+), '([^']+)'\)", r"\1.\2", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return path.strip(".")


def import_program(program) -> tuple[Graph, dict[str, Provenance]]:
    """Import a decomposed ExportedProgram; return the graph and each op's FX provenance.

    `graph.emitted` keeps which ops each FX node's converter emitted, in order: what
    `frontend/stock_import.py` lines the stock importer's bindings up with. A node TVM cannot import
    (no converter, or one that raises on it) becomes a host-only placeholder when the host can run it
    (`frontend/host_only.py`), listed in `graph.host_only`."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    nodes = {node.name: node for node in program.graph.nodes}
    reasons: dict[str, str] = {}  # FX nodes TVM cannot import, placeholders the host runs: why
    while True:
        importer = ExportedProgramImporter()
        fixes = apply_import_fixes(importer)
        add_placeholders(importer, program, reasons, tvm.__version__)
        run = instrumented_import(importer, program)
        if run.failure is None or not note_failed_converter(run.failure, reasons, tvm.__version__):
            break
    if run.failure is not None:
        raise ModelError(run.failure.message) from run.failure.cause

    fixed = specialization_of(program)
    mod = relax.transform.ToNonDataflow()(run.mod)
    main, static_fixes = make_static(mod["main"], fixed.symbols)
    if not main.same_as(mod["main"]):
        mod = _replace_main(mod, main)
    final_of_node = _final_bindings(run.returned)
    graph, provenance, names = _build_graph(mod, nodes, run.emitted, final_of_node)
    graph.import_fixes = fixes + fixed.fixes + static_fixes
    graph.emitted = {node: [names.get(old) for old in olds] for node, olds in run.order.items()}
    graph.host_only = host_only_ops(graph, reasons)
    return graph, provenance


@dataclass
class ImportFailure:
    """Where an import stopped: the FX node whose converter raised (None: outside any), and why."""

    node: object
    cause: BaseException
    message: str  # one line: "TVM import of aten.addmm.default (FX node addmm, layer fc) failed: ..."

    @property
    def reason(self) -> str:
        """The converter's own error, one line: "TypeError: Binary operators must ..."."""
        return f"{type(self.cause).__name__}: {_first_line(self.cause)}"


@dataclass
class InstrumentedImport:
    """One `from_exported_program` run with every binding attributed to the FX node it came from."""

    mod: object  # None when the import failed
    emitted: dict[str, str]  # relax var name -> fx node name
    returned: dict[str, object]  # fx node name -> its value as its converter returned it
    order: dict[str, list[str]]  # fx node name -> the vars its converter emitted, in order
    types: dict[str, object]  # relax var name -> its type (struct info) when emitted
    failure: ImportFailure | None = None


def instrumented_import(importer, program) -> InstrumentedImport:
    """Run `importer` on `program`, wrapping its converters and `BlockBuilder.emit` (and
    `match_cast`) so that each binding is attributed to the FX node whose converter emitted it; the
    patched import and the stock one (`frontend/stock_import.py`) are attributed the same way."""
    from tvm import relax

    current: dict[str, object] = {"node": None}
    emitted: dict[str, str] = {}  # relax var name -> fx node name
    order: dict[str, list[str]] = {}
    types: dict[str, object] = {}
    # Each node's value as its converter returned it. Not `importer.env`: in-place converters
    # (copy_, fill_, index_put_) overwrite the env entry of the node they write into.
    returned: dict[str, object] = {}

    own_nodes = set(program.graph.nodes)

    def wrap(convert):
        def converter(node, *rest):
            if node not in own_nodes:  # a node of a subgraph: its bindings belong to the outer node
                return convert(node, *rest)
            current["node"] = node
            try:
                value = convert(node, *rest)
            except Exception as exc:
                raise _ImportFailure(node, exc) from exc
            returned[node.name] = value
            return value
        return converter

    importer.convert_map = {key: wrap(fn) for key, fn in importer.convert_map.items()}
    original_emit, original_match_cast = relax.BlockBuilder.emit, relax.BlockBuilder.match_cast
    run = InstrumentedImport(None, emitted, returned, order, types)
    relax.BlockBuilder.emit = _attributed(original_emit, current, run)
    relax.BlockBuilder.match_cast = _attributed(original_match_cast, current, run)
    try:
        run.mod = importer.from_exported_program(program, True, False, False, None)
    except _ImportFailure as failure:
        run.failure = ImportFailure(failure.node, failure.cause, (
            f"TVM import of {failure.node.target} (FX node {failure.node.name}, layer "
            f"{layer_of(failure.node) or '<top>'}) failed: {type(failure.cause).__name__}: "
            f"{_first_line(failure.cause)}"))
    except Exception as exc:
        run.failure = ImportFailure(None, exc, f"TVM import failed: {type(exc).__name__}: {_first_line(exc)}")
    finally:
        relax.BlockBuilder.emit, relax.BlockBuilder.match_cast = original_emit, original_match_cast
    if run.failure is not None:
        _close_blocks(getattr(importer, "block_builder", None))
    return run


def _attributed(original, current: dict, run: InstrumentedImport):
    """`BlockBuilder.emit` (or `match_cast`) that also attributes each new var to the FX node whose
    converter runs (`current["node"]`): into `run.emitted`, `run.order` and `run.types`."""
    def emit(builder, *args, **kwargs):  # whatever the builder takes (name_hint=, ...)
        var = original(builder, *args, **kwargs)
        if current["node"] is not None:
            node = current["node"].name
            if var.name not in run.emitted:
                run.order.setdefault(node, []).append(var.name)
            run.emitted.setdefault(var.name, node)
            run.types.setdefault(var.name, var.ty)
        return var
    return emit


MAX_OPEN_BLOCKS = 8  # blocks a failed import can leave open (a function's dataflow block, nested scopes)


def _close_blocks(builder) -> None:
    """End the blocks a failed import left open, so that TVM does not warn "BlockBuilder destroyed with
    remaining blocks!" on stderr when the builder is freed."""
    for _ in range(MAX_OPEN_BLOCKS if builder is not None else 0):
        try:
            builder._end_block()
        except Exception:  # noqa: BLE001 - TVM says "no block is being built": all closed
            return


class _ImportFailure(Exception):
    def __init__(self, node, cause):
        super().__init__(str(cause))
        self.node, self.cause = node, cause


def _final_bindings(returned: dict[str, object]) -> dict[str, Provenance]:
    """Relax var name → (FX node, tuple path) for vars that hold an FX node's own value."""
    from tvm import relax

    result: dict[str, Provenance] = {}

    def visit(value, node_name, path):
        if isinstance(value, relax.Var):
            result.setdefault(value.name, Provenance(node_name, path))
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                visit(item, node_name, (path or ()) + (i,))
        elif isinstance(value, relax.Tuple):
            for i, item in enumerate(value.fields):
                visit(item, node_name, (path or ()) + (i,))

    for node_name, value in returned.items():
        visit(value, node_name, None)
    return result


def relax_op_name(value) -> str:
    from tvm import relax

    if isinstance(value, relax.Call):
        op = value.op
        return getattr(op, "name", None) or getattr(op, "name", None) or str(op)
    if type(value).__name__.endswith("Const"):
        return "constant"
    kinds = {relax.TupleGetItem: "get_item", relax.Tuple: "tuple", relax.Var: "alias",
             relax.ShapeExpr: "shape"}
    for kind, name in kinds.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _build_graph(mod, nodes, emitted, final_of_node) -> tuple[Graph, dict[str, Provenance], dict[str, str]]:
    """The graph, each op's provenance, and the new name of every binding (old var name -> op name)."""
    main = mod["main"]
    _check_single_function(mod)
    num_input = int(main.attrs["num_input"])
    bindings = [b for block in main.body.blocks for b in block.bindings]
    _attribute_normalization_helpers(bindings, emitted, final_of_node)
    names = _op_names(main, bindings, emitted, final_of_node)

    main = _rename_bindings(main, names)
    main = main.without_attr("params") if "params" in main.attrs else main
    mod = mod.__class__({"main": main}) if len(mod.functions) == 1 else _replace_main(mod, main)

    bindings = [b for block in main.body.blocks for b in block.bindings]
    inputs = [(p.name, (flatten_ty(p.ty) or [None])[0]) for p in main.params[:num_input]]
    params = [(p.name, (flatten_ty(p.ty) or [None])[0]) for p in main.params[num_input:]]
    for name, spec in inputs + params:
        if spec is None:
            raise ModelError(f"input {name} has a dynamic shape; tapml-dbg records static shapes only")
    ops, provenance = _graph_ops(bindings, names, nodes, emitted, final_of_node)
    outputs = output_names(main)
    return Graph(mod=mod, ops=ops, inputs=inputs, params=params, outputs=outputs), provenance, names


def _attribute_normalization_helpers(bindings, emitted: dict[str, str], final_of_node) -> None:
    """Bindings no converter emitted through BlockBuilder.emit (normalization helpers) belong to the
    next node that has one: added to `emitted` (the last binding, the output, stays unattributed)."""
    next_node = None
    for binding in reversed(bindings):
        old = binding.var.name
        prov = final_of_node.get(old)
        node = prov.node if prov else emitted.get(old)
        if node is None and next_node is not None and binding is not bindings[-1]:
            emitted[old] = next_node
        elif node is not None:
            next_node = node


def _op_names(main, bindings, emitted: dict[str, str], final_of_node) -> dict[str, str]:
    """Op names (old var name -> op name): the FX node name for a node's own value, "<node>_p<k>" for
    its helper bindings, unique among themselves and `main`'s parameters."""
    names: dict[str, str] = {}
    taken: set[str] = {p.name for p in main.params}
    helper_counts: dict[str, int] = {}
    for binding in bindings:
        old = binding.var.name
        prov = final_of_node.get(old)
        node = prov.node if prov else emitted.get(old)
        if prov is not None and prov.index is None:
            base = node
        elif prov is not None:
            base = f"{node}_{'_'.join(str(i) for i in prov.index)}"
        elif node is not None:
            helper_counts[node] = helper_counts.get(node, -1) + 1
            base = f"{node}_p{helper_counts[node]}"
        else:
            base = OUTPUT_OP_NAME if binding is bindings[-1] else old
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        taken.add(name)
        names[old] = name
    return names


def _graph_ops(bindings, names: dict[str, str], nodes, emitted: dict[str, str],
               final_of_node) -> tuple[list[OpInfo], dict[str, Provenance]]:
    """The op table of the renamed bindings, and the provenance of each op that holds an FX node's value."""
    from tvm import relax

    reverse = {new: old for old, new in names.items()}
    ops: list[OpInfo] = []
    provenance: dict[str, Provenance] = {}
    for index, binding in enumerate(bindings):
        name = binding.var.name
        old = reverse[name]
        prov = final_of_node.get(old)
        node_name = prov.node if prov else emitted.get(old, "")
        node = nodes.get(node_name)
        specs = flatten_ty(binding.var.ty)
        inputs_of = ordered_free_vars(binding.value)
        ops.append(OpInfo(
            index=index,
            name=name,
            op=str(node.target) if node is not None else relax_op_name(binding.value),
            relax_op=relax_op_name(binding.value),
            layer=layer_of(node) if node is not None else "",
            fx_node=node_name,
            inputs=inputs_of,
            outputs=specs or [],
            is_tuple=isinstance(binding.var.ty, relax.TupleType),
            source_location=source_location_of(node),  # a helper binding shares its FX node's
        ))
        if prov is not None:
            provenance[name] = prov
    return ops, provenance


def _check_single_function(mod) -> None:
    """A trace holds `main` alone: a call into another Relax function (a subgraph) has no place in it."""
    from tvm import relax

    others = [gv.name_hint for gv, func in mod.functions_items()
              if gv.name_hint != "main" and isinstance(func, relax.Function)]
    if others:
        raise ModelError(f"the imported model calls Relax function(s) {', '.join(sorted(others))}; "
                         "tapml-dbg records single-function graphs only (is a torch.cond left un-inlined?)")


def _replace_main(mod, main):
    mod = mod.__class__(dict(mod.functions_items()))
    mod["main"] = main
    return mod


def ordered_free_vars(expr) -> list[str]:
    from tvm import relax

    seen: list[str] = []
    for var in relax.analysis.free_vars(expr):
        if var.name not in seen:
            seen.append(var.name)
    return seen


def output_names(main) -> list[str]:
    from tvm import relax

    body = main.body.body
    if isinstance(body, relax.Var):
        return [body.name]
    if isinstance(body, relax.Tuple):
        return [f.name for f in body.fields if isinstance(f, relax.Var)]
    return []


def _rename_bindings(func, names: dict[str, str]):
    """Rebuild `func` with every binding var renamed (names must be unique)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Renamer(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            new_var = relax.Var(names[binding.var.name], binding.var.ty)
            self.set_var_remap(binding.var, new_var)
            self.builder_.emit_normalized(relax.VarBinding(new_var, value))

        def visit_match_cast_(self, binding):
            value = self.visit_expr(binding.value)
            new_var = relax.Var(names[binding.var.name], binding.var.ty)
            self.set_var_remap(binding.var, new_var)
            self.builder_.emit_normalized(relax.MatchCast(new_var, value, binding.ty))

    return Renamer().visit_expr(func)
