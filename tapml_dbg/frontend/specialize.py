"""Fix to the recorded run what torch.export leaves to run time, so the trace's graph is static.

A trace records one run on one set of inputs, and replay feeds exactly those inputs again. Two
things in an exported program depend on the input values, and a trace fixes them to the values
the recorded inputs give:

- `torch.cond`: the branch the source takes is inlined into the FX graph (the predicate stays an
  op of its own, so a target that computes it differently is caught there). TVM's importer does
  the same when the predicate is known at export time; here it is known from a run on the inputs.
  Every op of the branch is then an FX node of its own, with its own torch value in the trace.
- data-dependent sizes (`masked_select`, `nonzero`: torch.export's unbacked symbols `u0`, `u1`):
  the size the recorded inputs give. The nodes' export meta is made concrete (so TVM's importer
  and the source graph see static shapes), and `import_program` binds any symbolic var of the
  same name TVM still makes (see `static_graph`), so every op has a static shape.

Both need one eager run of the exported program on the inputs; a model that has neither costs
nothing. `specialize` notes what it fixed in the program's graph module meta (`SPECIALIZATION_KEY`),
where `import_program` finds it, and the trace lists it among its import fixes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from tapml_dbg.errors import ModelError

SPECIALIZATION_KEY = "tapml_dbg.specialization"  # in ExportedProgram.graph_module.meta
COND_BRANCH_FIX = "cond-branch"  # "cond-branch: NODE took the true branch on the recorded inputs"
STATIC_SIZE_FIX = "static-size"  # "static-size: u0=17 (masked_select) on the recorded inputs"
MAX_COND_NESTING = 16  # conds inside branches are inlined level by level, at most this deep


@dataclass
class Specialization:
    """What `specialize` fixed: torch's unbacked size symbols by name, and one note per fix."""

    symbols: dict[str, int] = field(default_factory=dict)
    fixes: list[str] = field(default_factory=list)


def specialization_of(program) -> Specialization:
    """What `specialize` fixed in `program` (nothing when it was not run on it)."""
    return program.graph_module.meta.get(SPECIALIZATION_KEY) or Specialization()


def specialize(program, inputs) -> Specialization:
    """Inline every `torch.cond` branch the inputs take and find every unbacked size; in place."""
    result = Specialization()
    for level in range(MAX_COND_NESTING + 1):
        conds = [node for node in program.graph.nodes if _is_cond(node)]
        if not conds:
            break
        if level == MAX_COND_NESTING:
            raise ModelError(f"torch.cond nested deeper than {MAX_COND_NESTING} levels: tapml-dbg cannot fix "
                             "its branches (flatten the conditions)")
        predicates = {node.args[0].name for node in conds if hasattr(node.args[0], "name")}
        values = _run(program, inputs, predicates) if predicates else {}
        for node in conds:
            predicate = node.args[0]
            taken = bool(values[predicate.name]) if hasattr(predicate, "name") else bool(predicate)
            result.fixes.append(_inline_cond(program, node, taken))
        program.graph_module.graph.lint()
        program.graph_module.recompile()
    sized = {node.name: node for node in program.graph.nodes if _unbacked(node.meta.get("val"))}
    if sized:
        values = _run(program, inputs, set(sized))
        for name, node in sized.items():
            _bind_sizes(node.meta["val"], values[name], name, result)
            _make_meta_concrete(node, values[name])
        _drop_size_guards(program)
    program.graph_module.meta[SPECIALIZATION_KEY] = result
    return result


# ---- one eager run ---------------------------------------------------------------------------

def _run(program, inputs, wanted: set[str]) -> dict[str, object]:
    """The values of the FX nodes named in `wanted`, from one eager run of the program's graph."""
    import torch

    class Capture(torch.fx.Interpreter):
        def __init__(self, module):
            super().__init__(module)
            self.values: dict[str, object] = {}

        def run_node(self, node):
            value = super().run_node(node)
            if node.name in wanted:
                self.values[node.name] = value
            return value

    capture = Capture(program.graph_module)
    try:
        with torch.no_grad():
            capture.run(*_placeholder_values(program, inputs))
    except Exception as exc:
        raise ModelError(f"running the exported program on the example inputs failed: {type(exc).__name__}: "
                         f"{_first_line(exc)} (torch.cond and data-dependent sizes are fixed from this run)") from exc
    return capture.values


def _placeholder_values(program, inputs) -> list:
    """The graph's placeholders in order: params, buffers and constants from the program, then inputs."""
    state = dict(program.state_dict)
    state.update(getattr(program, "constants", {}) or {})
    user_inputs = iter(inputs)
    values = []
    for spec in program.graph_signature.input_specs:
        values.append(next(user_inputs) if spec.kind.name == "USER_INPUT" else state[spec.target])
    return values


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ---- torch.cond ------------------------------------------------------------------------------

def _is_cond(node) -> bool:
    import torch

    return node.op == "call_function" and node.target is torch.ops.higher_order.cond


def _inline_cond(program, node, taken: bool) -> str:
    """Replace `node` (a torch.cond) by a copy of the branch `taken` picks; return the note."""
    module, graph = program.graph_module, program.graph_module.graph
    _pred, true_node, false_node, operands = node.args[:4]
    branch = getattr(module, (true_node if taken else false_node).target)
    mapping = {}
    placeholders = [n for n in branch.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise ModelError(f"torch.cond {node.name}: its branch takes {len(placeholders)} operands, "
                         f"the call passes {len(operands)}")
    with graph.inserting_before(node):
        for placeholder, operand in zip(placeholders, operands):
            mapping[placeholder] = operand
        for inner in branch.graph.nodes:  # a cond inside the branch: its branches move up with it
            if inner.op == "get_attr":
                name = _free_attribute(module, f"{node.name}_{inner.target}")
                setattr(module, name, getattr(branch, inner.target))
                mapping[inner] = graph.get_attr(name)
        outputs = graph.graph_copy(branch.graph, mapping)
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    _replace_results(program, node, outputs)
    for attr_node in (true_node, false_node):
        if not attr_node.users:
            graph.erase_node(attr_node)
            if not any(n.op == "get_attr" and n.target == attr_node.target for n in graph.nodes):
                delattr(module, attr_node.target)
    return f"{COND_BRANCH_FIX}: {node.name} took the {'true' if taken else 'false'} branch on the recorded inputs"


def _replace_results(program, node, outputs: list) -> None:
    """Point every reader of the cond's results at the inlined branch's; drop the cond."""
    graph = program.graph_module.graph
    renamed: dict[str, str] = {}
    for user in list(node.users):
        if not (user.op == "call_function" and user.target is operator.getitem):
            raise ModelError(f"torch.cond {node.name} is read by {user.name} other than by index; "
                             "tapml-dbg cannot inline its branch")
        result = outputs[user.args[1]]
        user.replace_all_uses_with(result)
        renamed[user.name] = getattr(result, "name", str(result))
        graph.erase_node(user)
    graph.erase_node(node)
    for spec in program.graph_signature.output_specs:  # keep the signature naming live nodes
        arg = getattr(spec, "arg", None)
        if getattr(arg, "name", None) in renamed:
            arg.name = renamed[arg.name]


def _free_attribute(module, base: str) -> str:
    name, suffix = base, 1
    while hasattr(module, name):
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name


# ---- data-dependent sizes --------------------------------------------------------------------

def _symbolic_types() -> tuple:
    import torch

    return (torch.SymInt, torch.SymBool, torch.SymFloat)


def _unbacked(value) -> bool:
    """Whether a node's meta value is symbolic or has a symbolic size (u0, ...)."""
    import torch

    if isinstance(value, (tuple, list)):
        return any(_unbacked(v) for v in value)
    if isinstance(value, _symbolic_types()):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in value.shape)
    return False


def _drop_size_guards(program) -> None:
    """Erase torch.export's run-time checks of the sizes (`_assert_scalar(u0 >= 0)`) and the scalar
    arithmetic only they read: with static sizes they are constants (and TVM 0.27's importer fails
    on a comparison of a static size)."""
    import torch

    graph = program.graph_module.graph
    for node in reversed(list(graph.nodes)):
        guard = node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default
        scalar = node.op == "call_function" and isinstance(node.meta.get("val"), (bool, int, float))
        if (guard or scalar) and not node.users:
            graph.erase_node(node)
    graph.lint()
    program.graph_module.recompile()


def _make_meta_concrete(node, value) -> None:
    """The node's export meta (`val`, `tensor_meta`) as the recorded run has it: static sizes, so
    everything reading the program (TVM's importer, the source graph) sees the trace's shapes."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    node.meta["val"] = _concrete(node.meta["val"], value)
    if "tensor_meta" in node.meta:
        node.meta["tensor_meta"] = _map_tensors(node.meta["val"], _extract_tensor_metadata)


def _concrete(meta_value, value):
    import torch

    if isinstance(meta_value, (tuple, list)) and isinstance(value, (tuple, list)):
        return type(meta_value)(_concrete(m, v) for m, v in zip(meta_value, value))
    if isinstance(meta_value, _symbolic_types()) and isinstance(value, (bool, int, float)):
        return value
    if isinstance(meta_value, torch.Tensor) and isinstance(value, torch.Tensor):
        fake_mode = getattr(meta_value, "fake_mode", None)
        return fake_mode.from_tensor(value, static_shapes=True) if fake_mode is not None else value
    return meta_value


def _map_tensors(value, function):
    import torch

    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, function) for v in value)
    return function(value) if isinstance(value, torch.Tensor) else None


def _bind_sizes(meta_value, value, node_name: str, result: Specialization) -> None:
    """Read each symbolic size of `meta_value` off the concrete `value` of the same node."""
    import torch

    if isinstance(meta_value, (tuple, list)) and isinstance(value, (tuple, list)):
        for meta_item, item in zip(meta_value, value):
            _bind_sizes(meta_item, item, node_name, result)
        return
    if isinstance(meta_value, torch.SymInt):
        pairs = [(meta_value, value)]
    elif isinstance(meta_value, torch.Tensor) and isinstance(value, torch.Tensor):
        pairs = list(zip(meta_value.shape, value.shape))
    else:
        return
    for symbolic, concrete in pairs:
        expr = getattr(getattr(symbolic, "node", None), "expr", None)
        if expr is None or not getattr(expr, "is_Symbol", False):
            continue  # a plain int, or an expression of symbols (bound through its symbols)
        name = str(expr)
        if name not in result.symbols:
            result.symbols[name] = int(concrete)
            result.fixes.append(f"{STATIC_SIZE_FIX}: {name}={int(concrete)} ({node_name}) on the recorded inputs")
