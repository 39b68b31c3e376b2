"""The model zoo: every entry has its file, and a fast subset passes every coverage column.

The full table (every architecture) is `python benchmarks/coverage.py` → docs/coverage.md; it
takes a while, so CI runs one small architecture (a text encoder; the examples cover the other
kinds) through the same harness (a subprocess per architecture: import / record / clean replay /
planted-fault bisect).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import fork_cli
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
ZOO_DIR = ROOT / "examples" / "zoo"
# the text encoder of the zoo cheapest to take through every column (bert's row: ~15% more CPU);
# vision and CNN models: examples/cnn.py here, the whole zoo in benchmarks/
CI_SUBSET = ("distilbert",)
CI_TIMEOUT_S = 300.0  # per architecture; each takes well under a minute on 2 cores


def _registry_names() -> list[str]:
    """Entry names read from registry.py without importing transformers."""
    tree = ast.parse((ZOO_DIR / "registry.py").read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "register":
                    names.append(decorator.args[0].value)
    return names


def test_every_zoo_entry_has_its_file_and_every_file_its_entry():
    names = _registry_names()
    assert len(names) >= 25 and len(set(names)) == len(names)
    files = {path.stem for path in ZOO_DIR.glob("*.py")} - {"registry"}
    assert files == set(names)
    for name in names:
        text = (ZOO_DIR / f"{name}.py").read_text()
        assert f'builder("{name}")' in text, name


def test_fast_subset_passes_every_column(tmp_path, monkeypatch):
    coverage = load_benchmark("coverage", "tapml_zoo_coverage")
    if fork_cli.SERVER.shims():  # its child forked from a process that imported torch, transformers and TVM
        monkeypatch.setattr(coverage, "PYTHON", os.path.join(fork_cli.SERVER.shims(), "python"))
    rows = coverage.run_all(list(CI_SUBSET), timeout_s=CI_TIMEOUT_S, work=tmp_path, jobs=len(CI_SUBSET))
    assert [row["name"] for row in rows] == list(CI_SUBSET)
    for row in rows:
        for stage in coverage.STAGES:
            cell = row[stage]
            assert cell["status"] == "pass", f"{row['name']} {stage}: {cell['status']}: {cell['reason']}"
        assert row["ops"] and row["ops"] > 10
        assert row["fault"]["reason"].startswith("found #")
    text = coverage.render(rows, seconds=1.0, timeout_s=CI_TIMEOUT_S, target="llvm", partial=True)
    assert f"**{len(CI_SUBSET)} of {len(CI_SUBSET)} architectures pass every column**" in text
    assert "## Known TVM 0.27 limitations" in text
    assert text.count("\n| `") == len(CI_SUBSET)


def test_a_crashing_architecture_costs_one_row_not_the_table(tmp_path, monkeypatch):
    """The harness turns a child that dies into a failed cell with the reason."""
    coverage = load_benchmark("coverage", "tapml_zoo_coverage")
    monkeypatch.setattr(coverage, "__file__", str(tmp_path / "dies.py"))
    (tmp_path / "dies.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    row = coverage._run_child("resnet", tmp_path, timeout_s=60, target="llvm")
    assert row["import"]["status"] == "fail" and "SIGSEGV" in row["import"]["reason"]
    assert row["record"]["status"] == "skipped"


def test_a_hanging_architecture_times_out(tmp_path, monkeypatch):
    coverage = load_benchmark("coverage", "tapml_zoo_coverage")
    monkeypatch.setattr(coverage, "__file__", str(tmp_path / "hangs.py"))
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(600)\n")
    row = coverage._run_child("resnet", tmp_path, timeout_s=2, target="llvm")
    assert row["import"]["status"] == "fail" and row["import"]["reason"].startswith("timeout")


@pytest.mark.parametrize("name", ["resnet"])
def test_zoo_file_follows_the_cli_contract(name):
    import torch

    from tapml_dbg.frontend.model_loader import load_model

    module, inputs = load_model(str(ZOO_DIR / f"{name}.py"))  # as `tapml-dbg record` loads it

    assert isinstance(module, torch.nn.Module) and all(isinstance(t, torch.Tensor) for t in inputs)
    with torch.no_grad():
        assert isinstance(module(*inputs), torch.Tensor)
