"""[14]: one implementation of propagated values (engine/propagation.py). The same op's target value,
fed the target's own upstream values, is bit-identical whichever command asks for it: the REPL's
`step`, the report's series, bisect's chain and `run --offload all` (benchmarks/propagated_bits.py,
the very code the benchmark runs on a GPU)."""

import numpy as np
import pytest
from conftest import load_benchmark

from tapml_dbg.engine.session import Session

bits = load_benchmark("propagated_bits", "propagated_bits_bench")


@pytest.mark.parametrize("example", ["mlp", "tiny_llama"])
def test_an_op_has_one_propagated_value_whichever_command_asks(traces, example):
    with Session.open(traces.get(example)) as session:
        picks = bits.picked_ops(session)
        values, _seconds = bits.four_ways(session, picks)
        for index in picks:
            name = session.ops[index].name
            stepped = values["step"][name]
            assert stepped is not None
            for way in bits.WAYS[1:]:
                assert bits.same_bits(stepped, values[way][name]), f"{example} #{index} {name}: step vs {way}"
        # real target values of the op's type, not the recording handed back
        assert [np.shape(v) for v in stepped] == [np.shape(v) for v in session.source_values(picks[-1])]


def test_values_that_differ_in_one_bit_are_told_apart():
    value = np.linspace(0, 1, 8, dtype=np.float32)
    nudged = value.copy()
    nudged.view(np.uint32)[3] ^= 1
    assert bits.same_bits([value], [value.copy()])
    assert not bits.same_bits([value], [nudged])
    assert not bits.same_bits([value], [value.astype(np.float64)])
    assert not bits.same_bits([value], None)
