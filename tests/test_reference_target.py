"""A trusted TVM target as the reference (`--reference-target`): a real TVM-wide bug (SELU's scale on
llvm) is listed, never the culprit; a planted fault is this platform's (`target`); the reference's values
are computed once and kept."""

from __future__ import annotations

import json

import pytest

import tapml_dbg
from conftest import fault_transform, run_cli
from tapml_dbg.errors import TargetError

SELU = "selu_mlp"  # examples/selu_mlp.py: TVM 0.27's SELU (aten.elu with SELU's constants) is wrong on llvm


@pytest.fixture(scope="module")
def selu_trace(traces):
    return traces.get(SELU)


def _bisect(*args) -> dict:
    result = run_cli("bisect", *map(str, args), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_tvm_wide_bug_is_listed_not_the_culprit(selu_trace):
    against_source = _bisect(selu_trace)
    assert against_source["op"]["name"] == "elu" and against_source["op"]["verdict"] == "isolated"
    assert against_source["reference"] == {"kind": "source", "target": None} and against_source["tvm_wide"] == []
    assert against_source["op"]["attribution"] is None
    against_llvm = _bisect(selu_trace, "--reference-target", "llvm")
    assert against_llvm["diverged"] is False
    assert against_llvm["reference"] == {"kind": "target", "target": "llvm"}
    assert against_llvm["tvm_wide"] == [{"index": against_source["op"]["index"], "name": "elu",
                                         "op": "aten.elu.default", "verdict": "isolated"}]
    text = run_cli("bisect", str(selu_trace), "--reference-target", "llvm").stdout
    assert "no divergence" in text and "TVM-wide" in text and "#8 elu (aten.elu.default, isolated)" in text


@pytest.mark.parametrize("op, attribution", [("addmm_2", "target"), ("elu", "tvm")])
def test_planted_fault_under_a_reference_target_is_attributed(selu_trace, tmp_path, op, attribution):
    found = _bisect(selu_trace, "--reference-target", "llvm", "--transform", fault_transform(tmp_path, "scale", op))
    assert found["op"]["name"] == op and found["op"]["verdict"] == "isolated"
    assert found["op"]["attribution"] == attribution  # elu: llvm itself differs from the source there too
    assert [wide["name"] for wide in found["tvm_wide"]] == ["elu"]


def test_reference_values_are_computed_once_and_kept(selu_trace, tmp_path):
    cache = tmp_path / "cache"
    with tapml_dbg.open(selu_trace, reference_target="llvm", cache_dir=cache) as replay:
        first = replay.reference
        assert first.kind == "target" and not first.cached and first.trace.exists()
        assert replay.bisect().to_json()["tvm_wide"][0]["name"] == "elu"
    with tapml_dbg.open(selu_trace, reference_target="llvm", cache_dir=cache) as replay:
        again = replay.reference
        assert again.cached and again.trace == first.trace and again.tvm_wide == first.tvm_wide
        assert replay.compare("elu").isolated.passed  # the target agrees with the reference target at elu


def test_bad_reference_options_get_one_line(selu_trace, tmp_path):
    with pytest.raises(TargetError, match="reference target"):
        tapml_dbg.open(selu_trace, reference_target="nonsense-target", cache_dir=tmp_path)
    result = run_cli("bisect", str(selu_trace), "--reference-rpc", "127.0.0.1:9")
    assert result.returncode == 1 and "--reference-target" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("bisect", str(tmp_path / "missing.h5"), "--reference-target", "llvm")
    assert result.returncode == 1 and "does not exist" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("bisect", str(selu_trace), "--reference-target", "nonsense-target")
    assert result.returncode == 1 and "reference target" in result.stderr and "Traceback" not in result.stderr


def test_reference_target_over_rpc_gives_the_local_answer(selu_trace, tmp_path):
    from rpc_helpers import Server

    server = Server()
    try:
        transform = fault_transform(tmp_path, "scale", "addmm_2")
        found = _bisect(selu_trace, "--reference-target", "llvm", "--reference-rpc", server.address,
                        "--transform", transform)
    finally:
        server.stop()
    assert found["reference"] == {"kind": "target", "target": f"llvm via rpc {server.address}"}
    assert found["op"]["name"] == "addmm_2" and found["op"]["attribution"] == "target"
    assert [wide["name"] for wide in found["tvm_wide"]] == ["elu"]


def test_the_report_tells_the_two_kinds_apart(selu_trace, tmp_path):
    transform = fault_transform(tmp_path, "scale", "addmm_2")
    folder = tmp_path / "report"
    result = run_cli("report", str(selu_trace), "-o", str(folder), "--reference-target", "llvm", "--transform",
                     transform)
    assert result.returncode == 0, result.stderr
    page = (folder / "index.html").read_text()
    assert 'id="reference"' in page and 'class="this-target">target</b>' in page
    assert '<tr class="tvm-wide"><td class="num">8</td><td><code>elu</code>' in page
    assert '<tr class="culprit"><td class="num">15</td>' in page


def test_triage_against_a_reference_target_lists_no_tvm_wide_cause(selu_trace):
    result = run_cli("triage", str(selu_trace), "--reference-target", "llvm", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["diverged"] is False and found["reference"] == {"kind": "target", "target": "llvm"}
    assert [wide["name"] for wide in found["tvm_wide"]] == ["elu"]


def test_an_op_the_reference_target_cannot_build_either_does_not_stop_the_search(tmp_path):
    """bf16 layer_norm does not build on TVM 0.27's llvm: against llvm it is TVM-wide, kept on the source."""
    from conftest import EXAMPLES

    trace = tmp_path / "gpt2_bf16.h5"
    assert run_cli("record", f"{EXAMPLES / 'bf16_lms.py'}:build_gpt2", "-o", str(trace)).returncode == 0
    against_source = _bisect(trace)
    assert against_source["op"]["name"] == "native_layer_norm" and against_source["op"]["verdict"] == "compile-error"
    against_llvm = _bisect(trace, "--reference-target", "llvm")
    assert against_llvm["diverged"] is False
    wide = {op["name"]: op["verdict"] for op in against_llvm["tvm_wide"]}
    assert wide["native_layer_norm"] == "compile-error" and wide["pow_1"] == "compile-error"


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
    assert run_cli("record", str(model), "-o", str(trace)).returncode == 0
    against_source = _bisect(trace)
    assert against_source["op"]["name"] == "cumsum"
    against_llvm = _bisect(trace, "--reference-target", "llvm")
    assert against_llvm["diverged"] is False
    assert [wide["name"] for wide in against_llvm["tvm_wide"]] == ["cumsum", "mul"]  # the int32 product too
