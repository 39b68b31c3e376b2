"""A search's one-op units are sliced from the stored graph's JSON (model/units.py:one_op_json): the
slice must be exactly what building the unit from the IR gives (`build_unit` + `function_to_json`),
or the compile cache, the index and the ledger would key one op two ways."""

from __future__ import annotations

import pytest

from tapml_dbg.engine.session import Session
from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.model.units import build_unit, one_op_json


@pytest.mark.parametrize("example, extra", [("mlp", ()), ("tiny_gpt2", ()), ("plain_qwen2", ("--generate", "3"))])
def test_every_sliced_unit_is_the_unit_built_from_the_ir(traces, example, extra):
    with Session.open(traces.get(example, *extra)) as session:
        graph, sliced = session.requests.graph, 0
        for op in session.ops:
            found = one_op_json(session.main, graph, op.name)
            if found is None:
                continue
            unit, spec = found
            func, built_spec = build_unit(session.main, [op.name], [op.name])
            assert unit == function_to_json(func), op.name
            assert (spec.ops, spec.outputs, spec.inputs) == (built_spec.ops, built_spec.outputs, built_spec.inputs)
            sliced += 1
    assert sliced > len(session.ops) // 2  # most ops are sliced, not built
