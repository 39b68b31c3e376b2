"""Bad input gives one clear line, exit 1, and no traceback."""

from __future__ import annotations

import json
import re
import subprocess

import h5py
import numpy as np
import pytest

from conftest import run_cli
from damage_trace import flip_dataset_bit

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
    # no TVM converter and not on the host's allowlist (aten.amax, no converter either, runs on the host:
    # docs/host-only-ops.md)
    "unsupported_op.py": (
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.kthvalue(x, 2, dim=-1).values\n"
        "def build():\n    return M(), (torch.randn(2, 8),)\n", "aten.kthvalue.default"),
}


def _main(capfd, *argv: str) -> subprocess.CompletedProcess:
    """`tapml-dbg ARGV` through `cli.main` in this process, what it wrote to file descriptors 1 and 2
    captured (TVM's own log lines too): a command refused before it does any work costs no process of
    its own (test_not_a_trace runs one as a process)."""
    from tapml_dbg.ui.cli import main

    capfd.readouterr()
    code = main(list(argv))
    captured = capfd.readouterr()
    return subprocess.CompletedProcess(list(argv), code, captured.out, captured.err)


def _assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    text = lines[0]
    for needle in needles:
        assert needle in text, result.stderr


@pytest.mark.parametrize("name", sorted(BAD_MODELS))
def test_bad_model(tmp_path, name, capfd):
    source, needle = BAD_MODELS[name]
    (tmp_path / name).write_text(source)
    result = _main(capfd, "record", str(tmp_path / name), "-o", str(tmp_path / "t.h5"))
    _assert_one_line_error(result, needle)
    assert not (tmp_path / "t.h5").exists()


def test_missing_model_file(tmp_path, capfd):
    _assert_one_line_error(_main(capfd, "record", str(tmp_path / "nope.py"), "-o", str(tmp_path / "t.h5")),
                           "not found")


def test_missing_function(tmp_path, capfd):
    (tmp_path / "m.py").write_text("def other():\n    pass\n")
    _assert_one_line_error(_main(capfd, "record", f"{tmp_path / 'm.py'}:make", "-o", str(tmp_path / "t.h5")),
                           "no function 'make'")


def test_not_a_trace(tmp_path, capfd):
    path = tmp_path / "notes.h5"
    path.write_text("hello, not HDF5\n")
    _assert_one_line_error(run_cli("info", str(path)))  # as a process
    for command in (["bisect", str(path)], ["replay", str(path), "-c", "info"]):
        _assert_one_line_error(_main(capfd, *command))


def test_missing_trace(tmp_path, capfd):
    _assert_one_line_error(_main(capfd, "info", str(tmp_path / "absent.h5")), "does not exist")


def test_truncated_trace(tmp_path, traces, capfd):
    data = traces.get("mlp").read_bytes()
    path = tmp_path / "cut.h5"
    path.write_bytes(data[: len(data) // 2])
    _assert_one_line_error(_main(capfd, "info", str(path)))
    _assert_one_line_error(_main(capfd, "bisect", str(path)))


def test_newer_version(tmp_path, traces, capfd):
    path = tmp_path / "new.h5"
    path.write_bytes(traces.get("mlp").read_bytes())
    with h5py.File(path, "r+") as handle:
        handle.attrs["version_major"] = 2
    _assert_one_line_error(_main(capfd, "info", str(path)), "upgrade")


def test_bad_target_and_transform(traces, tmp_path, capfd):
    path = str(traces.get("mlp"))
    _assert_one_line_error(_main(capfd, "bisect", path, "--target", "nosuchkind"), "target")
    _assert_one_line_error(_main(capfd, "bisect", path, "--transform", str(tmp_path / "missing.py:f")), "not found")


@pytest.mark.parametrize("target, needles", [
    ('{"kind":"llvm","mcpu":"nonsense"}', ("mcpu 'nonsense'", "CPU names, e.g.")),
    ('{"kind":"llvm","mcpu":"haswel"}', ("mcpu 'haswel'", "e.g. haswell")),  # a typo: the close names
    ('{"kind":"llvm","mtriple":"nonsense-x"}', ("mtriple 'nonsense-x'",)),
    ('{"kind":"cuda","arch":"sm_x"}', ("CUDA arch 'sm_x'",)),
    ('{"kind":"cuda","host":{"kind":"llvm","mcpu":"nonsense"}}', ("mcpu 'nonsense'",)),
])
def test_a_target_tvm_would_only_warn_about_is_refused(target, needles, capfd):
    """TVM 0.27 accepts these, logs a warning at compile time and compiles for a generic CPU (or fails
    per unit): the tool refuses them at once, in one line that says what LLVM does know."""
    from conftest import ROOT

    trace = str(ROOT / "traces" / "sample_mlp.h5")
    _assert_one_line_error(_main(capfd, "bisect", trace, "--target", target), "invalid target", *needles)


def test_a_target_llvm_knows_is_accepted():
    from tapml_dbg.portable.runner import parse_target

    for target in ('{"kind":"llvm","mcpu":"haswell"}', '{"kind":"llvm","mtriple":"aarch64-linux-gnu","mcpu":"cortex-a72"}',
                   '{"kind":"cuda","arch":"sm_90a"}', "llvm"):
        assert parse_target(target).kind.name in ("llvm", "cuda")


RAISING_PASS = """\
from tvm import relax


def _check(binding):
    if binding.var.name == "gelu_1":
        raise ValueError("this pass does not handle gelu")  # line 6


def broken(mod):
    for _gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for block in func.body.blocks:
                for binding in block.bindings:
                    _check(binding)
    return mod
"""


@pytest.mark.parametrize("command", ["bisect", "triage"])
def test_an_exception_in_the_users_pass_is_reported_as_the_pass_failing(tmp_path, command, capfd):
    """Not "the op does not compile for the target": the one line names the pass, its own line (file:line,
    the statement) and the exception, and the op whose unit it was applied to."""
    from conftest import ROOT

    (tmp_path / "my_pass.py").write_text(RAISING_PASS)
    result = _main(capfd, command, str(ROOT / "traces" / "sample_mlp.h5"), "--transform",
                   f"{tmp_path / 'my_pass.py'}:broken")
    _assert_one_line_error(result, f"the transform {tmp_path / 'my_pass.py'}:broken raised at {tmp_path / 'my_pass.py'}:6 in _check",
                           "raise ValueError(", "ValueError: this pass does not handle gelu", "op gelu_1: ")
    assert "does not compile" not in result.stdout + result.stderr


def test_missing_op(traces, tmp_path, capfd):
    _assert_one_line_error(_main(capfd, "dump", str(traces.get("mlp")), "--op", "no_such_op", "-o",
                                 str(tmp_path / "d")), "no op named")


def test_crafted_graph_cannot_build_arbitrary_objects(tmp_path, capfd):
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
    _assert_one_line_error(_main(capfd, "bisect", str(path)), "not a Relax op attribute")


# ---- untrusted and damaged traces (the trace boundary) ---------------------------------------

def _strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_info_json_is_strict_json(tmp_path, traces, capfd):
    """`info --json` printed a bare NaN (not JSON) for a NaN in the trace's meta."""
    path = tmp_path / "nan.h5"
    path.write_bytes(traces.get("mlp").read_bytes())
    with h5py.File(path, "r+") as handle:
        meta = json.loads(bytes(handle.attrs["meta"]).rstrip(b"\0"))
        meta.update(eager_output_max_abs_diff=float("nan"), record_seconds=float("inf"))
        handle.attrs["meta"] = np.array(json.dumps(meta).encode(), dtype=h5py.string_dtype("utf-8", 4096))
    done = _main(capfd, "info", str(path), "--json")
    code, out = done.returncode, done.stdout
    assert code == 0
    info = _strict(out)
    assert info["eager_output_max_abs_diff"] == "NaN" and info["record_seconds"] == "Infinity"


def test_strict_json_spells_non_finite_floats_as_strings():
    from tapml_dbg.ui.cli import strict_json

    value = {"a": [float("nan"), float("-inf"), 1.5, None], "b": {"c": float("inf")}, "d": (np.float64("nan"),)}
    assert _strict(strict_json(value)) == {"a": ["NaN", "-Infinity", 1.5, None], "b": {"c": "Infinity"},
                                           "d": ["NaN"]}


def test_info_verify_reports_each_damaged_part(tmp_path, traces, capfd):
    path = tmp_path / "flipped.h5"
    path.write_bytes(traces.get("mlp").read_bytes())
    done = _main(capfd, "info", str(path), "--verify")
    code, out = done.returncode, done.stdout
    assert code == 0 and out.startswith("intact") and "checksums verified" in out
    flip_dataset_bit(path, "ops/12/0")
    flip_dataset_bit(path, "params/p_head_weight")
    done = _main(capfd, "info", str(path), "--verify")
    code, out = done.returncode, done.stdout
    assert code == 1
    assert out.startswith("damaged") and "2 of" in out
    assert "op 12's recorded output 0 is corrupt (checksum mismatch)" in out
    assert "param 'p_head_weight' is corrupt (checksum mismatch)" in out
    done = _main(capfd, "info", str(path), "--verify", "--json")
    code, out = done.returncode, done.stdout
    report = _strict(out)
    assert code == 1 and not report["ok"] and [d["part"] for d in report["damaged"]] == ["param 'p_head_weight'",
                                                                                          "op 12"]


def test_corrupt_recorded_output_is_one_error_line_in_replay(tmp_path, traces, capfd):
    """Before checksums, replay judged op 25 against the flipped value without a word."""
    path = tmp_path / "flipped.h5"
    path.write_bytes(traces.get("mlp").read_bytes())
    flip_dataset_bit(path, "ops/25/0")
    result = _main(capfd, "replay", str(path), "-c", "compare 25")
    _assert_one_line_error(result, "op 25's recorded output 0 is corrupt (checksum mismatch)", "record")


HOSTILE_GRAPHS = {
    "unknown op": (lambda g: g["bindings"][0]["value"].update(call="relax.no_such_op"),
                   "an operator this TVM does not have"),
    "op that calls a function by name": (lambda g: g["bindings"][0]["value"].update(call="relax.call_py_func"),
                                         "not an operator a trace may use"),
    "params of the wrong type": (lambda g: g.update(params={"x": 1}), "params must be a list"),
    "var of the wrong type": (lambda g: g["bindings"][1]["value"]["args"].__setitem__(0, {"var": 3}),
                              "must be a string"),
    "undefined var": (lambda g: g["bindings"][0]["value"]["args"].__setitem__(0, {"var": "ghost"}),
                      "not defined before it"),
    "const of the wrong size": (lambda g: g["bindings"][0]["value"]["args"][1]["const"].update(shape=[1000]),
                                "base64 characters for 4000 bytes"),
    "attribute value of no known kind": (lambda g: g["bindings"][2]["value"]["attrs"]["fields"].update(axis={"x": 1}),
                                         "no known attribute value"),
    "deep expression": (lambda g: g["bindings"][0]["value"]["args"].__setitem__(0, _nested_tuple(200)),
                        "nested deeper than"),
    "shape of strings": (lambda g: g["params"][0].update(shape=["1", 3]), "must be an integer"),
    "attrs in a wrong type": (lambda g: g["bindings"][2]["value"].update(attrs=[]), "must be an object"),
}


def _nested_tuple(depth: int) -> dict:
    expr = {"var": "x"}
    for _ in range(depth):
        expr = {"tuple": [expr]}
    return expr


@pytest.mark.parametrize("name", sorted(HOSTILE_GRAPHS))
def test_hostile_but_valid_json_graphs_are_trace_errors(name):
    from conftest import ROOT

    from tapml_dbg.errors import TraceError
    from tapml_dbg.model.serialize import function_from_json
    from tapml_dbg.trace import TraceReader

    with TraceReader(ROOT / "tests" / "fixtures" / "trace_v1_1.h5") as reader:
        graph = reader.outline.graph()
    function_from_json(json.loads(json.dumps(graph)))  # the untouched graph builds
    edit, needle = HOSTILE_GRAPHS[name]
    edit(graph)
    with pytest.raises(TraceError, match=re.escape(needle)) as info:
        function_from_json(graph)
    assert "\n" not in str(info.value)
