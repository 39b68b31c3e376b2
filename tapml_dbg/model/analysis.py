"""Facts about the graph the engine needs: who reads what, and which outputs nobody reads."""

from __future__ import annotations

from tapml_dbg.model.graph import OpInfo


def consumers_of(ops: list[OpInfo]) -> dict[str, list[int]]:
    """Value name -> indices of the ops that read it, in order."""
    consumers: dict[str, list[int]] = {}
    for op in ops:
        for name in op.inputs:
            consumers.setdefault(name, []).append(op.index)
    return consumers


def frontier(ops: list[OpInfo], consumers: dict[str, list[int]], first: int, k: int) -> list[str]:
    """Ops in [first, k] whose value is read after k, plus op k itself: what a prefix hands on."""
    names = []
    for op in ops[first:k + 1]:
        if op.index == k or any(c > k for c in consumers.get(op.name, [])):
            if op.outputs:
                names.append(op.name)
    return names


def dead_tuple_fields(main) -> dict[str, set[int]]:
    """For tuple-valued ops read only through get_item: the fields nobody reads.

    TVM imports `max_pool2d_with_indices` with zeros for indices; when the model ignores the
    indices, that difference cannot matter and must not be reported as a divergence.
    """
    from tvm import relax

    bindings = [b for block in main.body.blocks for b in block.bindings]
    tuple_ops = {b.var.name: len(b.var.ty.fields) for b in bindings if isinstance(b.var.ty, relax.TupleType)}
    used: dict[str, set[int]] = {name: set() for name in tuple_ops}
    values = [b.value for b in bindings] + [main.body.body]
    for value in values:
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            if value.tuple_value.name in used:
                used[value.tuple_value.name].add(int(value.index))
            continue
        for var in relax.analysis.free_vars(value):
            if var.name in used:
                used[var.name].update(range(tuple_ops[var.name]))
    return {name: set(range(tuple_ops[name])) - fields for name, fields in used.items()
            if set(range(tuple_ops[name])) - fields}
