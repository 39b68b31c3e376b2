"""Bad input gives one clear line, exit 1, and no traceback."""

from __future__ import annotations

import h5py
import pytest

from conftest import run_cli

BAD_MODELS = {
    "wrong_types.py": ("def build():\n    return 'not a module', (1,)\n", "torch.nn.Module"),
    "no_tuple.py": ("import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n", "must return"),
    "raises.py": ("def build():\n    raise ValueError('boom')\n", "boom"),
    "data_dependent.py": (
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2 if x.sum() > 0 else x - 1\n"
        "def build():\n    return M(), (torch.randn(3),)\n", "torch.export failed"),
    "unsupported_op.py": (
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.logsumexp(x, dim=-1)\n"
        "def build():\n    return M(), (torch.randn(2, 8),)\n", "aten.amax.default"),
}


def _assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    text = lines[0]
    for needle in needles:
        assert needle in text, result.stderr


@pytest.mark.parametrize("name", sorted(BAD_MODELS))
def test_bad_model(tmp_path, name):
    source, needle = BAD_MODELS[name]
    (tmp_path / name).write_text(source)
    result = run_cli("record", str(tmp_path / name), "-o", str(tmp_path / "t.h5"))
    _assert_one_line_error(result, needle)


def test_missing_model_file(tmp_path):
    _assert_one_line_error(run_cli("record", str(tmp_path / "nope.py"), "-o", str(tmp_path / "t.h5")),
                           "not found")


def test_missing_function(tmp_path):
    (tmp_path / "m.py").write_text("def other():\n    pass\n")
    _assert_one_line_error(run_cli("record", f"{tmp_path / 'm.py'}:make", "-o", str(tmp_path / "t.h5")),
                           "no function 'make'")


def test_not_a_trace(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("hello, not HDF5\n")
    for command in (["info", str(path)], ["bisect", str(path)], ["replay", str(path), "-c", "info"]):
        _assert_one_line_error(run_cli(*command))


def test_missing_trace(tmp_path):
    _assert_one_line_error(run_cli("info", str(tmp_path / "absent.h5")), "does not exist")


def test_truncated_trace(tmp_path, traces):
    data = traces.get("mlp").read_bytes()
    path = tmp_path / "cut.h5"
    path.write_bytes(data[: len(data) // 2])
    _assert_one_line_error(run_cli("info", str(path)))
    _assert_one_line_error(run_cli("bisect", str(path)))


def test_newer_version(tmp_path, traces):
    path = tmp_path / "new.h5"
    path.write_bytes(traces.get("mlp").read_bytes())
    with h5py.File(path, "r+") as handle:
        handle.attrs["version_major"] = 2
    _assert_one_line_error(run_cli("info", str(path)), "upgrade")


def test_bad_target_and_transform(traces, tmp_path):
    path = str(traces.get("mlp"))
    _assert_one_line_error(run_cli("bisect", path, "--target", "nosuchkind"), "target")
    _assert_one_line_error(run_cli("bisect", path, "--transform", str(tmp_path / "missing.py:f")), "not found")


def test_missing_op(traces, tmp_path):
    _assert_one_line_error(run_cli("dump", str(traces.get("mlp")), "--op", "no_such_op", "-o", str(tmp_path / "d")),
                           "no op named")


def test_crafted_graph_cannot_build_arbitrary_objects(tmp_path):
    """Opening a trace only rebuilds Relax op calls and their attributes; nothing else."""
    import json

    import numpy as np

    from conftest import ROOT

    path = tmp_path / "crafted.h5"
    path.write_bytes((ROOT / "traces" / "sample_mlp.h5").read_bytes())
    with h5py.File(path, "r+") as handle:
        graph = json.loads(bytes(handle["graph/ir_json"][()]).decode())
        call = next(b["value"] for b in graph["bindings"] if b["value"].get("attrs"))
        call["attrs"]["type"] = "runtime.Module"
        data = np.frombuffer(json.dumps(graph).encode(), dtype=np.uint8)
        del handle["graph/ir_json"]
        handle.create_dataset("graph/ir_json", data=data)
    _assert_one_line_error(run_cli("bisect", str(path)), "not a Relax op attribute")
