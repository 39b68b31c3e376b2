"""Ops TVM cannot import stay on the source (docs/host-only-ops.md): a transformers mixture-of-experts
model records with `aten.histc` and transformers' `grouped_mm_fallback` custom op (no TVM 0.27
converter) and its int64 floor division (a TVM 0.27 converter that raises) as host-only placeholders;
every replay keeps them on the source, lists them as findings, and debugs everything else as usual."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tapml_dbg
from conftest import ROOT, fault_transform, rendered
from tapml_dbg.errors import TapmlError, TraceError
from tapml_dbg.model.serialize import function_from_json, function_to_json
from tapml_dbg.ui import cli

MOE = ROOT / "tests" / "models" / "moe.py"
HISTC = "TVM 0.27 has no converter for aten.histc"
GROUPED_MM = "TVM 0.27 has no converter for transformers.grouped_mm_fallback"
FLOOR_DIVIDE = "TVM 0.27's converter for aten.div.Tensor_mode fails: TypeError: Binary operators must have the same"


@pytest.fixture(scope="module")
def mixtral(traces) -> tuple[Path, str]:
    """The trace and what its record printed: recorded once per run (the module's tests may run on
    both xdist workers)."""
    return traces.record(f"{MOE}:build", name="moe_mixtral")


@pytest.fixture(scope="module")
def qwen2_moe(traces) -> tuple[Path, str]:
    return traces.record(f"{MOE}:build_qwen2_moe", name="moe_qwen2")


@pytest.fixture(scope="module")
def mixtral_on_llvm(mixtral):
    """The Mixtral opened on llvm once for the module's clean runs (bisect, run, dump, carve: the
    commands' API methods, what each command prints as its JSON)."""
    with tapml_dbg.open(mixtral[0]) as replay:
        yield replay


@pytest.fixture(scope="module")
def mixtral_planted(mixtral, tmp_path_factory):
    """The Mixtral with a x1.5 fault at `mul_14`, the op that reads `grouped_mm_fallback_1` (host-only):
    one session for bisect and triage (triage judges every op, bisect's verdicts among them)."""
    transform = fault_transform(tmp_path_factory.mktemp("mul_14"), "scale", "mul_14", scale=1.5)
    with tapml_dbg.open(mixtral[0], transform=transform) as replay:
        yield replay


def _host_only(entries: list[dict]) -> dict[str, str]:
    return {entry["name"]: entry["reason"] for entry in entries}


def _cli(capsys, *args) -> str:
    """`tapml-dbg ARGS` (its `main`, in this process): what it printed on stdout; exit status 0."""
    assert cli.main([str(arg) for arg in args]) == 0
    return capsys.readouterr().out


def test_a_mixtral_records_with_its_unimportable_ops_on_the_host(mixtral, capsys):
    path, printed = mixtral
    assert HISTC in printed and GROUPED_MM in printed
    info = json.loads(_cli(capsys, "info", path, "--json"))
    found = _host_only(info["host_only"])
    assert found["histc"] == HISTC
    assert found["grouped_mm_fallback"] == found["grouped_mm_fallback_1"] == GROUPED_MM
    assert found["div_1"].startswith(FLOOR_DIVIDE)
    ops = {op["name"]: op for op in info["ops"]}
    assert ops["histc"]["op"] == "aten.histc.default" and ops["histc"]["relax_op"] == "relax.call_dps_packed"
    assert ops["grouped_mm_fallback"]["op"] == "transformers.grouped_mm_fallback.default"
    assert "host only" in _cli(capsys, "info", path)


def test_a_mixtral_bisects_clean_and_names_its_host_only_ops(mixtral_on_llvm):
    found = mixtral_on_llvm.bisect().to_json()
    assert not found["diverged"], found["op"]
    assert _host_only(found["host_only"])["histc"] == HISTC
    assert found["kept"] == []  # kept by the tool, not by the user
    assert any(HISTC in note for note in found["notes"])


def test_a_fault_planted_after_the_host_only_ops_is_found_at_its_op(mixtral_planted):
    """`mul_14` reads `grouped_mm_fallback_1` (host-only): the chain goes past the host-only ops on
    their recorded values and names the planted op."""
    found = mixtral_planted.bisect().to_json()
    assert found["diverged"] and found["op"]["name"] == "mul_14" and found["op"]["verdict"] == "isolated"


def test_a_mixed_run_reexecutes_the_host_only_ops_on_the_host(mixtral, mixtral_on_llvm, tmp_path):
    """`run --offload all`: histc, the custom op and the division run on the host (torch, the custom op
    looked up by name), fed the target's values, and the output agrees; a fault planted before the
    custom op reaches the output through it."""
    clean = mixtral_on_llvm.run("all").to_json()
    assert clean["passed"] and not clean["failure"], clean
    assert any(GROUPED_MM in note for note in clean["notes"])
    transform = fault_transform(tmp_path, "scale", "mul_13", scale=3.0)
    with tapml_dbg.open(mixtral[0], transform=transform) as replay:
        planted = replay.run("all").to_json()
    assert not planted["passed"]


def test_triage_lists_the_host_only_ops_as_findings_not_causes(mixtral_planted):
    triaged = mixtral_planted.triage()
    found = triaged.to_json()
    assert _host_only(found["host_only"])["grouped_mm_fallback"] == GROUPED_MM
    assert [group["ops"][0]["name"] for group in found["groups"]] == ["mul_14"]
    text = rendered(triaged)
    assert "on the host only" in text and HISTC in text


def test_a_qwen2_moe_records_with_its_own_host_only_ops(qwen2_moe, capsys):
    """Qwen2-MoE (routed experts and a shared expert) records with the four host-only ops of transformers'
    MoE layers, its floor division named `div`. What a replay does with them (bisect past them, clean; a
    fault planted after them found at its op; triage, run, dump, carve) is the same code path whatever
    the family: the Mixtral's tests above."""
    path, printed = qwen2_moe
    assert HISTC in printed and GROUPED_MM in printed
    info = json.loads(_cli(capsys, "info", path, "--json"))
    found = _host_only(info["host_only"])
    assert set(found) == {"div", "histc", "grouped_mm_fallback", "grouped_mm_fallback_1"}
    assert found["div"].startswith(FLOOR_DIVIDE) and found["histc"] == HISTC and found["grouped_mm_fallback"] == GROUPED_MM
    assert "shared_expert" in {op["layer"].split(".")[-1] for op in info["ops"]}  # on the target, no host-only op


def test_the_placeholder_round_trips_and_names_no_function():
    """The stored graph holds the placeholder as its own kind (no function name in the file); a stored
    call of `relax.call_dps_packed` is refused as before."""
    from tvm import relax

    from tapml_dbg.model.host_only import host_only_names, placeholder

    x = relax.Var("x", relax.TensorType([4, 3], "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x], attrs={"num_input": 1}, pure=True):
        y = builder.emit(placeholder([x], [relax.TensorType([4], "float32")]), "histc")
        builder.emit_func_output(builder.emit(relax.op.add(y, y), "add"))
    data = function_to_json(builder.get()["main"])
    assert "tapml_dbg" not in json.dumps(data)
    assert host_only_names(function_from_json(data)) == ["histc"]
    data["bindings"][0]["value"] = {"call": "relax.call_dps_packed", "args": [], "attrs": None, "ty_args": []}
    with pytest.raises(TraceError, match="not an operator a trace may use"):
        function_from_json(data)


def test_an_op_with_no_converter_on_the_allowlist_runs_on_the_host(tmp_path, capsys):
    """`torch.logsumexp` decomposes to `aten.amax`, which TVM 0.27 has no converter for: it used to stop
    the recording (tests/test_bad_input.py now plants `aten.kthvalue`, which the host cannot run either)."""
    model = tmp_path / "logsumexp.py"
    model.write_text("import torch\n"
                     "class M(torch.nn.Module):\n"
                     "    def forward(self, x):\n"
                     "        return torch.logsumexp(x, dim=-1) * 2\n"
                     "def build():\n    return M(), (torch.randn(2, 8),)\n")
    path = tmp_path / "t.h5"
    assert "TVM 0.27 has no converter for aten.amax" in _cli(capsys, "record", model, "-o", path)
    with tapml_dbg.open(path) as replay:
        mixed = replay.run("all").to_json()
    assert mixed["passed"], mixed


def test_dump_refuses_a_host_only_op_and_carve_leaves_them_out(mixtral_on_llvm, tmp_path):
    with pytest.raises(TapmlError, match=re.escape("runs on the host only (TVM 0.27 has no converter for aten.histc)")):
        mixtral_on_llvm.dump("histc", tmp_path / "repro")
    assert not (tmp_path / "repro").exists()
    mixtral_on_llvm.carve(tmp_path / "suite")
    meta = json.loads((tmp_path / "suite" / "meta.json").read_text())
    assert "histc" not in {entry["name"] for entry in meta["ops"]}
    assert any(line.startswith("op 137 histc: runs on the host only") for line in meta["skipped"])
