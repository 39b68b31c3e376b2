"""The plan's records (runtime/messages.py): one result type per request kind, all frozen, none
pretending to be another (no ClassVar standing in for a field another kind has). Pure: no worker."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from tapml_dbg.portable.screen import ScreenRule
from tapml_dbg.runtime import messages
from tapml_dbg.runtime.messages import (BatchRequest, BatchResult, BuildRequest, BuildResult, ChainRequest, ChainResult,
                                       ChainScreen, CompileRequest, CompileResult, UnitRequest, UnitResult, UnitStatus,
                                       ended)

UNIT = UnitRequest({"unit": 1}, [])
RULE = ScreenRule()
REQUESTS = {UnitResult: UNIT, CompileResult: CompileRequest.of(UNIT), ChainResult: ChainRequest([UNIT], ["a"]),
            BatchResult: BatchRequest([UNIT], ["a"], RULE), BuildResult: BuildRequest([UNIT])}


@pytest.mark.parametrize("kind", list(REQUESTS), ids=lambda kind: kind.__name__)
def test_a_request_that_ends_without_its_workers_reply_gets_a_result_of_its_own_kind(kind):
    result = ended(REQUESTS[kind], UnitStatus.CRASH, "the target worker died", 1.5)
    assert type(result) is kind and not result.ok and result.seconds == 1.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.message = "changed"  # a new one is made with `replace`
    with pytest.raises(dataclasses.FrozenInstanceError):
        REQUESTS[kind].units = []


def test_no_record_fakes_another_kinds_fields():
    tree = ast.parse(Path(messages.__file__).read_text())
    faked = [f"{node.target.id} (line {node.lineno})" for node in ast.walk(tree)
             if isinstance(node, ast.AnnAssign) and "ClassVar" in ast.unparse(node.annotation)]
    assert not faked, f"ClassVar fields in runtime/messages.py: {faked}"
    assert not hasattr(BatchRequest([UNIT], ["a"], RULE), "keep") and not hasattr(BuildRequest([UNIT]), "prepare")


def test_a_chain_is_cached_only_when_it_ran_and_every_unit_came_from_the_cache():
    assert ChainResult(UnitStatus.OK, unit_keys=[("k1", True), ("k2", True)]).cached
    assert not ChainResult(UnitStatus.OK, unit_keys=[("k1", True), ("k2", False)]).cached
    assert not ChainResult(UnitStatus.ERROR, failed_op="b", unit_keys=[("k1", True)]).cached


def test_a_batch_run_again_from_its_failing_unit_keeps_what_ran_before_it():
    earlier = BatchResult(UnitStatus.CRASH, failed_op="c", outputs=[["a's"]], suspects=["a"], deferred=["b"],
                          unit_keys=[("ka", True)], remembered=2)
    rest = BatchResult(UnitStatus.OK, outputs=[["d's"]], suspects=["d"], unit_keys=[("kc", False), ("kd", True)])
    whole = rest.after(earlier)
    assert whole.ok and whole.suspects == ["a", "d"] and whole.outputs == [["a's"], ["d's"]]
    assert whole.deferred == ["b"] and whole.remembered == 2
    assert whole.units_built() == [("ka", True), ("kc", False), ("kd", True)]


def test_the_cache_report_reads_each_kind_the_same_way():
    assert UnitResult(UnitStatus.OK, key="k", cached=True).units_built() == [("k", True)]
    assert UnitResult(UnitStatus.COMPILE_ERROR).units_built() == []
    assert CompileResult(UnitStatus.OK, key="k").units_built() == [("k", False)]
    assert ChainResult(UnitStatus.OK, remembered=3).units_remembered() == 3
    assert UnitResult(UnitStatus.OK).units_remembered() == 0


def test_a_compile_lanes_request_sends_no_inputs_and_names_no_library():
    unit = UnitRequest({"unit": 1}, [("value", 1.0)], ["a"], library="/cache/K.so")
    prepared = CompileRequest.of(unit, ahead=True)
    assert prepared.unit.inputs == [] and prepared.unit.library == "" and prepared.ahead and not prepared.code_only
    assert ChainRequest([unit], ["a"], screen=ChainScreen(RULE, suspects=2)).screen.suspects == 2
