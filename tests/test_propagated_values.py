"""[14]: one implementation of propagated values (engine/propagation.py). The same op's target value,
fed the target's own upstream values, is bit-identical whichever command asks for it: the REPL's
`step`, the report's series, bisect's chain and `run --offload all`."""

import numpy as np
import pytest

from tapml_dbg.engine.chain import ChainSearch
from tapml_dbg.engine.propagation import propagated_series
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.stops import Debugger


def same_bits(left: list[np.ndarray], right: list[np.ndarray]) -> bool:
    if len(left) != len(right):
        return False
    for a, b in zip(left, right):
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            return False
    return True


@pytest.mark.parametrize("example", ["mlp", "tiny_llama"])
def test_an_op_has_one_propagated_value_whichever_command_asks(traces, example):
    with Session.open(traces.get(example)) as session:
        judged = [op.index for op in session.ops if op.outputs]
        picks = sorted({judged[len(judged) // 3], judged[2 * len(judged) // 3], judged[-1]})
        last = picks[-1]
        names = {session.ops[i].name for i in picks}

        Debugger(session).step(last + 1)  # the REPL's `step`: one op at a time, both verdicts each
        stepped = {name: session.replay.values[name] for name in names}

        series = {session.ops[i].name: values for i, _run, values in propagated_series(session, last=last)
                  if i in picks}

        finding = ChainSearch(session, 0, last, session.verdicts.unscreened(), also_keep=names).run()
        assert finding.index is None and not finding.lost, finding.message  # a clean model: runs to the end

        mixed = session.mixed_runner.run(range(len(session.ops)), keep_values=True)
        assert not mixed.failure, mixed.failure

        for name in names:
            assert series[name] is not None and finding.kept[name] is not None
            assert same_bits(stepped[name], series[name]), f"{example} {name}: step vs report"
            assert same_bits(stepped[name], finding.kept[name]), f"{example} {name}: step vs bisect's chain"
            assert same_bits(stepped[name], mixed.values[name]), f"{example} {name}: step vs run --offload all"
        # the values are the target's own: the last op's is not the recording bit for bit on every model,
        # but it is a real value of the right type
        recorded = session.source_values(last)
        assert [v.shape for v in stepped[session.ops[last].name]] == [np.shape(v) for v in recorded]
