"""A trusted TVM target as the reference (`--reference-target`): a real TVM-wide bug (SELU's scale on
llvm) is listed, never the culprit; a planted fault is this platform's (`target`); the reference's values
are computed once and kept."""

from __future__ import annotations

import json
import shutil

import pytest

import tapml_dbg
from conftest import fault_transform, run_cli
from tapml_dbg.errors import TargetError
from tapml_dbg.record.recorder import record
from tapml_dbg.ui import cli

SELU = "selu_mlp"  # examples/selu_mlp.py: TVM 0.27's SELU (aten.elu with SELU's constants) is wrong on llvm


@pytest.fixture(scope="module")
def selu_trace(traces):
    return traces.get(SELU)


def _bisect(*args) -> dict:
    """`tapml-dbg bisect ARGS --json`, in a process of its own."""
    result = run_cli("bisect", *map(str, args), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _api_bisect(trace, **options) -> dict:
    """The same from Python (`Replay.bisect`, whose JSON the command prints), in this process."""
    with tapml_dbg.open(trace, **options) as replay:
        return replay.bisect().to_json()


def test_a_tvm_wide_bug_is_listed_not_the_culprit(selu_trace):
    """`bisect --json` against the source names elu; against llvm nothing diverges and elu is TVM-wide
    (the text of both runs is docs/reference-target.md's transcript, compared byte for byte)."""
    against_source = _bisect(selu_trace)
    assert against_source["op"]["name"] == "elu" and against_source["op"]["verdict"] == "isolated"
    assert against_source["reference"] == {"kind": "source", "target": None} and against_source["tvm_wide"] == []
    assert against_source["op"]["attribution"] is None
    against_llvm = _bisect(selu_trace, "--reference-target", "llvm")
    assert against_llvm["diverged"] is False
    assert against_llvm["reference"] == {"kind": "target", "target": "llvm"}
    assert against_llvm["tvm_wide"] == [{"index": against_source["op"]["index"], "name": "elu",
                                         "op": "aten.elu.default", "verdict": "isolated"}]


def test_a_planted_fault_at_the_tvm_wide_op_is_attributed_tvm(selu_trace, tmp_path):
    """llvm itself differs from the source at elu: a fault planted there is every TVM target's (`tvm`). A
    fault where llvm agrees with the source (`target`) is the RPC test's below and docs/reference-target.md's
    transcript."""
    found = _api_bisect(selu_trace, reference_target="llvm", transform=fault_transform(tmp_path, "scale", "elu"))
    assert found["op"]["name"] == "elu" and found["op"]["verdict"] == "isolated"
    assert found["op"]["attribution"] == "tvm"
    assert [wide["name"] for wide in found["tvm_wide"]] == ["elu"]


def test_reference_values_are_computed_once_and_kept(selu_trace, tmp_path):
    """The first open computes the reference target's values (of a copy of the trace: one the cache has
    not seen; the compiled units are the suite's), its bisect and triage read them (nothing diverges,
    triage lists no TVM-wide cause, elu is listed TVM-wide); a second open reads them from the cache."""
    trace = tmp_path / "selu.h5"
    shutil.copy(selu_trace, trace)
    with tapml_dbg.open(trace, reference_target="llvm") as replay:
        first = replay.reference
        assert first.kind == "target" and not first.cached and first.trace.exists()
        assert replay.bisect().to_json()["tvm_wide"][0]["name"] == "elu"
        triaged = replay.triage().to_json()
        assert triaged["diverged"] is False and triaged["reference"] == {"kind": "target", "target": "llvm"}
        assert triaged["groups"] == [] and [wide["name"] for wide in triaged["tvm_wide"]] == ["elu"]
    with tapml_dbg.open(trace, reference_target="llvm") as replay:
        again = replay.reference
        assert again.cached and again.trace == first.trace and again.tvm_wide == first.tvm_wide
        assert replay.compare("elu").isolated.passed  # the target agrees with the reference target at elu


def test_bad_reference_options_get_one_line(selu_trace, tmp_path, capsys):
    """The API refuses a bad reference target; the command line (its `main`, in this process: an error that
    is no TapmlError would fail the test as its traceback) says each in one line and exits 1."""
    with pytest.raises(TargetError, match="reference target"):
        tapml_dbg.open(selu_trace, reference_target="nonsense-target", cache_dir=tmp_path)
    for arguments, says in (((selu_trace, "--reference-rpc", "127.0.0.1:9"), "--reference-target"),
                            ((tmp_path / "missing.h5", "--reference-target", "llvm"), "does not exist"),
                            ((selu_trace, "--reference-target", "nonsense-target"), "reference target")):
        assert cli.main(["bisect", *map(str, arguments)]) == 1
        printed = capsys.readouterr()
        assert says in printed.err and "Traceback" not in printed.err and len(printed.err.strip().splitlines()) == 1


def test_reference_target_over_rpc_gives_the_local_answer_and_its_report_tells_the_two_kinds_apart(selu_trace,
                                                                                                   tmp_path):
    """`bisect --reference-rpc` with a fault planted where llvm agrees with the source: the culprit,
    attributed `target`, and elu TVM-wide, as locally; its `--report` page (`tapml-dbg report`'s) marks
    the culprit, the attribution and the TVM-wide row apart."""
    from rpc_helpers import Server

    server = Server()
    folder = tmp_path / "report"
    try:
        transform = fault_transform(tmp_path, "scale", "addmm_2")
        found = _bisect(selu_trace, "--reference-target", "llvm", "--reference-rpc", server.address,
                        "--transform", transform, "--report", folder)
    finally:
        server.stop()
    assert found["reference"] == {"kind": "target", "target": f"llvm via rpc {server.address}"}
    assert found["op"]["name"] == "addmm_2" and found["op"]["verdict"] == "isolated"
    assert found["op"]["attribution"] == "target"
    assert [wide["name"] for wide in found["tvm_wide"]] == ["elu"]
    page = (folder / "index.html").read_text()
    assert 'id="reference"' in page and 'class="this-target">target</b>' in page
    assert '<tr class="tvm-wide"><td class="num">8</td><td><code>elu</code>' in page
    assert '<tr class="culprit"><td class="num">15</td>' in page


BF16_MODEL = '''import torch


class Block(torch.nn.Module):
    """GPT-2's LayerNorm and gelu_new's `x ** 3` in bfloat16: TVM 0.27 builds neither on llvm."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(self.norm(x))
        return torch.tanh(h + 0.044715 * torch.pow(h, 3.0)) * 2


def build():
    torch.manual_seed(0)
    return Block().to(torch.bfloat16).eval(), (torch.randn(4, 16, dtype=torch.bfloat16),)
'''


def test_an_op_the_reference_target_cannot_build_either_does_not_stop_the_search(tmp_path):
    """bf16 layer_norm and power do not build on TVM 0.27's llvm (against the source, bisect stops at the
    layer_norm: a bf16 GPT-2's in tests/test_family_coverage.py): against llvm each is TVM-wide with that verdict, kept
    on the source, and the ops after them are judged as usual: nothing diverges."""
    model = tmp_path / "bf16_block.py"
    model.write_text(BF16_MODEL)
    trace = tmp_path / "bf16_block.h5"
    record(str(model), trace)
    against_llvm = _api_bisect(trace, reference_target="llvm")
    assert against_llvm["diverged"] is False
    wide = {op["name"]: op["verdict"] for op in against_llvm["tvm_wide"]}
    assert wide == {"native_layer_norm": "compile-error", "pow_1": "compile-error"}, wide


CUMSUM_MODEL = '''import torch


class Positions(torch.nn.Module):
    def forward(self, mask, x):
        positions = torch.cumsum(mask, dim=1) * mask  # int32 in: torch sums to int64, TVM 0.27 keeps int32
        return x * positions.to(x.dtype).unsqueeze(-1)


def build():
    torch.manual_seed(0)
    return Positions(), (torch.ones(1, 8, dtype=torch.int32), torch.randn(1, 8, 4))
'''


def test_a_type_every_tvm_target_imports_alike_is_tvm_wide(tmp_path):
    """TVM 0.27 imports an int32 cumsum as int32, torch sums it to int64 (a type verdict); llvm computes int32 too."""
    model = tmp_path / "positions.py"
    model.write_text(CUMSUM_MODEL)
    trace = tmp_path / "positions.h5"
    record(str(model), trace)
    against_source = _api_bisect(trace)
    assert against_source["op"]["name"] == "cumsum"
    against_llvm = _api_bisect(trace, reference_target="llvm")
    assert against_llvm["diverged"] is False
    assert [wide["name"] for wide in against_llvm["tvm_wide"]] == ["cumsum", "mul"]  # the int32 product too
