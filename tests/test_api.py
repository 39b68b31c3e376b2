"""The Python API (docs/api.md): `tapml_dbg.open(...)` answers what the CLI answers, as objects.

One test per method at least, on the README's example (a real TVM 0.27 divergence at #9 `_softmax`)
and on a planted fault; the docs' worked example is run as written.
"""

from __future__ import annotations

import json
import os
import re

import pytest

import tapml_dbg
from tapml_dbg import api
from conftest import PLANTED_OP, ROOT, run_cli
from tapml_dbg.api import TABLE_COLUMNS, Replay
from tapml_dbg.engine.migrate import MigrateResult
from tapml_dbg.engine.mixed import MixedRun
from tapml_dbg.engine.results import BisectResult, StepResult
from tapml_dbg.engine.triage import TriageResult
from tapml_dbg.errors import TapmlError, UsageError
from tapml_dbg.judge.verdict import Status
from tapml_dbg.ui.cli import strict_json

CULPRIT = 9  # examples/fp16_memory_attention.py: the fp16 softmax TVM 0.27 sums in fp16 on llvm


@pytest.fixture(scope="module")
def demo(traces):
    with tapml_dbg.open(traces.get("fp16_memory_attention")) as replay:
        yield replay


def test_bisect_names_what_the_cli_names(demo, traces):
    found = demo.bisect()
    assert isinstance(found, BisectResult)
    assert found.culprit is not None and found.culprit.index == CULPRIT
    cli = json.loads(run_cli("bisect", str(traces.get("fp16_memory_attention")), "--json").stdout)
    api = json.loads(strict_json(found.to_json()))
    assert (api["diverged"], api["op"]["index"], api["op"]["name"], api["op"]["verdict"]) == \
        (cli["diverged"], cli["op"]["index"], cli["op"]["name"], cli["op"]["verdict"])


def test_compare_takes_an_index_a_name_or_a_selector(demo):
    by_index = demo.compare(CULPRIT)
    assert isinstance(by_index, StepResult)
    assert by_index.isolated.status == Status.FAIL and by_index.name == "_softmax"
    assert demo.compare("_softmax").index == CULPRIT
    assert demo.compare("#9").index == CULPRIT
    assert demo.compare(-1).index == len(demo.ops) - 1
    assert json.loads(strict_json(by_index.to_json()))["isolated"]["status"] == "fail"
    with pytest.raises(TapmlError):
        demo.compare("no_such_op")


def test_table_is_one_row_per_op_with_both_verdicts(demo):
    frame = demo.table()
    assert list(frame.columns) == list(TABLE_COLUMNS)
    assert len(frame) == len(demo.ops)
    culprit = frame.loc[CULPRIT]
    assert (culprit["name"], culprit["op"], culprit["isolated"]) == ("_softmax", "aten._softmax.default", "fail")
    assert culprit["class"] == "precision" and culprit["isolated_error"] > culprit["isolated_tolerance"]
    assert (culprit["file"], culprit["line"]) == ("examples/fp16_memory_attention.py", 21)
    assert culprit["code"] == "weights = torch.softmax(q @ self.keys.t(), dim=-1)"
    failing = frame[frame["isolated"] == "fail"]
    assert CULPRIT in failing.index and failing["index"].min() == CULPRIT, "nothing before the culprit fails alone"
    rows = demo.rows()  # the same table without pandas
    assert [(r["index"], r["name"], r["isolated"], r["propagated"]) for r in rows] == \
        list(frame[["index", "name", "isolated", "propagated"]].itertuples(index=False, name=None))


def test_migrate_and_run_return_what_the_cli_renders(demo):
    migrated = demo.migrate(by="op")
    assert isinstance(migrated, MigrateResult)
    assert migrated.culprit is not None and migrated.culprit.index == CULPRIT
    assert json.loads(strict_json(migrated.to_json()))["culprit"]["index"] == CULPRIT
    everything = demo.run("all")
    assert isinstance(everything, MixedRun) and not everything.passed
    assert demo.run("none").passed, "nothing offloaded: the source runner alone reproduces the recording"
    with pytest.raises(UsageError):
        demo.run("no_such_layer")


def test_triage_of_the_demo_names_its_softmax_first(demo):
    causes = demo.triage()
    assert isinstance(causes, TriageResult) and causes.diverged
    assert causes.groups[0].first.index == CULPRIT
    shape = json.loads(strict_json(causes.to_json()))
    assert {"cause", "class", "ops"} <= set(shape["groups"][0])


def test_dump_writes_a_repro_folder(demo, tmp_path):
    written = demo.dump(CULPRIT, tmp_path / "repro")
    assert (written.index, written.name, written.status) == (CULPRIT, "_softmax", "fail")
    assert (tmp_path / "repro" / "repro.py").exists() and written.bytes > 0


def test_a_planted_fault_is_the_only_failing_row(traces, planted_faults):
    """faults.py:scale on gelu_1 (x1.01), the REPL tests' planted fault: their units are compiled already."""
    trace = traces.get("mlp")
    with tapml_dbg.open(trace) as clean:
        assert PLANTED_OP in {op.name for op in clean.ops if op.op == "aten.gelu.default"}
        assert clean.bisect().culprit is None
    with tapml_dbg.open(trace, transform=f"{planted_faults}:scale") as replay:
        assert isinstance(replay, Replay)
        frame = replay.table()
        failing = frame[frame["isolated"] == "fail"]
        assert list(failing["name"]) == [PLANTED_OP]
        assert replay.bisect().culprit.name == PLANTED_OP
        assert replay.triage().groups[0].first.name == PLANTED_OP


def test_open_refuses_a_bad_path_with_a_tapml_error(tmp_path):
    with pytest.raises(TapmlError, match="trace"):
        tapml_dbg.open(tmp_path / "missing.h5")


def test_the_docs_worked_example_runs_as_written(traces, tmp_path, monkeypatch):
    """docs/api.md's example, on the trace it was written on."""
    text = (ROOT / "docs" / "api.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "demo.h5").symlink_to(traces.get("fp16_memory_attention"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(example, "docs/api.md", "exec"), scope)  # the reader's own code, from our docs
    assert scope["found"].culprit.index == CULPRIT
    assert len(scope["frame"]) == len(scope["replay"].ops)


def test_the_docs_record_info_and_report_example_runs_as_written(tmp_path, monkeypatch):
    """docs/api.md's second example: record, info and report from Python, what the CLI's commands do."""
    text = (ROOT / "docs" / "api.md").read_text()
    example = re.findall(r"```python\n(.*?)```", text, re.S)[1]
    (tmp_path / "traces").mkdir()
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    scope: dict = {}
    exec(compile(example, "docs/api.md", "exec"), scope)  # the reader's own code, from our docs
    assert scope["recorded"].ops == scope["summary"].to_json()["num_ops"] > 0
    assert scope["summary"].to_json()["complete"] and scope["written"].report.culprit is None
    assert (tmp_path / "report" / "index.html").stat().st_size == scope["written"].page.bytes
    assert scope["replay"].command_line("bisect") == "tapml-dbg bisect traces/mlp.h5"


def test_record_refuses_what_the_cli_refuses(tmp_path):
    with pytest.raises(UsageError, match="--entry names the entry function of a TVM-native model"):
        api.record(str(ROOT / "examples" / "mlp.py"), tmp_path / "mlp.h5", entry="main")
    assert not (tmp_path / "mlp.h5").exists()


def test_report_offers_the_culprits_command_lines_for_this_trace_and_target(demo, tmp_path):
    written = demo.report(tmp_path / "report")
    assert written.report.culprit.index == CULPRIT
    assert written.page.dump_command == demo.command_line("dump", "--op", str(CULPRIT), "-o", "repro/")
    assert f"tapml-dbg dump {demo.trace} --op 9 -o repro/" in (tmp_path / "report" / "index.html").read_text()
    spelled = Replay(demo.session, "t.h5", {"target": "cuda", "reference_target": "llvm", "keep": "3"})
    assert spelled.command_line("dump", "--op", "9") == "tapml-dbg dump t.h5 --op 9 --target cuda"  # no --keep
    assert spelled.command_line("bisect") == "tapml-dbg bisect t.h5 --target cuda --reference-target llvm --keep 3"
