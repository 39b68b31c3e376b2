"""dump and carve: standalone repros and carved suites that need only tvm + numpy (+ pytest).

Planted faults come from tests/transforms/faults.py, as self-contained copies that name the op
(`conftest.fault_transform`: the compile cache keys on the transform's text, not on the
environment). Every repro and carved suite runs in a fresh interpreter from another working
directory; repro.py runs behind an import blocker that refuses torch and tapml_dbg.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import fault_transform
from rpc_helpers import Server
from tapml_dbg.judge.compare import Tolerance, compare_arrays
from tapml_dbg.errors import UsageError
from tapml_dbg.repro import CarveResult, DumpResult, carve, dump_op
from tapml_dbg.repro.files import LIB_SOURCE, lib_files
from tapml_dbg import portable as lib
from tapml_dbg.portable import comparison
from tapml_dbg.repro.unit import lift_constants, op_module, to_script
from tapml_dbg.engine.session import Session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FAULTS = ROOT / "tests" / "transforms" / "faults.py"

# Runs a script with torch and tapml_dbg unimportable, then checks neither got loaded.
BLOCKED_RUN = r"""
import importlib.abc, runpy, sys
attempts = []
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "tapml_dbg"):
            attempts.append(name)
            raise ModuleNotFoundError("blocked import of " + name)
        return None
sys.meta_path.insert(0, _Block())
script = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tapml_dbg"))
print("BLOCKED-ATTEMPTS:", ",".join(sorted(set(a.split(".")[0] for a in attempts))))
print("FORBIDDEN-LOADED:", ",".join(loaded))
sys.exit(code)
"""


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def example_traces(traces):
    """cnn and tiny_gpt2 traces, from the shared `traces` fixture (recorded once per run, for every
    worker and every test file that asks)."""
    return {name: traces.get(name) for name in ["cnn", "tiny_gpt2"]}


def make_dump(trace: Path, op, out: Path, transform: str | None = None) -> DumpResult:
    with Session.open(trace, transform=transform) as session:
        return dump_op(session, op, out, command=f"test dump {op}")


def make_carve(trace: Path, out: Path, transform: str | None = None, **kw) -> CarveResult:
    with Session.open(trace, transform=transform) as session:
        return carve(session, out, **kw)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("TAPML_FAULT_")}


def in_parallel(*calls):
    """Run independent subprocess-bound calls concurrently (each is a zero-argument callable)."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


def run_repro(folder: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """repro.py in a fresh interpreter where torch and tapml_dbg cannot be imported."""
    result = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(folder / "repro.py"), *args], cwd=cwd,
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert re.search(r"^FORBIDDEN-LOADED: *$", result.stdout, re.M), result.stdout + result.stderr
    attempts = re.search(r"BLOCKED-ATTEMPTS: (.*)", result.stdout)
    assert attempts and "tapml_dbg" not in attempts.group(1), result.stdout
    return result


def run_suite(folder: Path, cwd: Path, *args: str) -> tuple[int, set[str], str]:
    """Run a carved suite with plain pytest; returns (exit code, failing test ids, output)."""
    result = subprocess.run([sys.executable, "-m", "pytest", str(folder), "-q", "-rf", *args],
                            cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    failed = set(re.findall(r"FAILED \S*test_ops\.py::test_op\[([^\]]+)\]", result.stdout))
    return result.returncode, failed, result.stdout + result.stderr


@contextlib.contextmanager
def rpc_server():
    """A local TVM RPC server on a free port; yields "HOST:PORT" once it accepts connections.

    rpc_helpers.Server stops its whole process group: TVM's server runs in a popen_worker child
    that a plain terminate() would leave running (tests/conftest.py checks that none is left)."""
    server = Server()
    try:
        yield server.address
    finally:
        server.stop()


def first_op(trace: Path, relax_op: str):
    with Session.open(trace) as session:
        return next(op for op in session.ops if op.relax_op == relax_op)


# ------------------------------------------------------------------------------ the shared lib
EXPECTED_PASS = {"equal": True, "noise": True, "fault": False, "nan": False, "inf": False, "shape": False,
                 "dtype": False, "int": False, "bool": False, "zero": True, "empty": True, "scalar": False}


@pytest.mark.parametrize("case", sorted(EXPECTED_PASS))
def test_compare_rule(case):
    """The one compare rule (in the file repros copy), checked on known cases through both doors."""
    rng = np.random.default_rng(0)
    source = rng.standard_normal((4, 5)).astype(np.float32)
    target = source.copy()
    tol = Tolerance(rtol=1e-4, atol=1e-6)
    if case == "noise":
        target = source + np.float32(1e-6)
    elif case == "fault":
        target = source * np.float32(1.01)
    elif case == "nan":
        target[1, 2] = np.nan
    elif case == "inf":
        source[0, 0], target[0, 0] = np.inf, -np.inf
    elif case == "shape":
        target = source.reshape(5, 4)
    elif case == "dtype":
        target = source.astype(np.float64)
    elif case == "int":
        source = np.arange(6, dtype=np.int64)
        target = source.copy()
        target[3] = 7
        tol = Tolerance(0.0, 0.0)
    elif case == "bool":
        source = np.array([True, False, True])
        target = np.array([True, True, True])
        tol = Tolerance(0.0, 0.0)
    elif case == "zero":
        source = np.zeros((3,), np.float32)
        target = np.full((3,), 1e-7, np.float32)
    elif case == "empty":
        source = target = np.zeros((0, 3), np.float32)
    elif case == "scalar":
        source, target = np.array(2.0, np.float32), np.array(2.5, np.float32)
    engine = compare_arrays(target, source, tol)
    mine = lib.compare(target, source, tol.rtol, tol.atol)
    assert mine["passed"] == engine.passed == EXPECTED_PASS[case]
    if case == "nan":
        assert engine.nan_mismatch == 1 and math.isnan(engine.cosine)
    if case == "inf":
        assert engine.inf_mismatch == 1
    if case == "fault":
        assert engine.scale_rel_err == pytest.approx(0.01, rel=1e-3)
    if case == "int":
        assert engine.mismatched == 1
    assert lib.format_metrics(mine)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_compare_in_blocks_equals_compare_in_one_block(monkeypatch, dtype):
    """Big tensors are compared block by block (bounded memory); the figures must not change."""
    rng = np.random.default_rng(1)
    source = (rng.standard_normal((37, 29)) * 5).astype(dtype)
    target = source + (rng.standard_normal(source.shape) * 1e-3).astype(dtype) if dtype == "float32" else source.copy()
    target.reshape(-1)[::17] += 3
    if dtype == "float32":
        target.reshape(-1)[5], source.reshape(-1)[600] = np.nan, np.inf
    whole = lib.compare(target.T, source.T, 1e-4, 1e-6)  # transposed: non-contiguous inputs too
    monkeypatch.setattr(comparison, "COMPARE_BLOCK", 100)
    blocks = lib.compare(target.T, source.T, 1e-4, 1e-6)
    assert whole["mismatched"] > 10 and not whole["passed"]
    for key, value in whole.items():
        if isinstance(value, float) and not math.isnan(value):
            assert blocks[key] == pytest.approx(value, rel=1e-9), key
        elif not isinstance(value, float):
            assert blocks[key] == value, key


def test_bits_round_trip_for_bfloat16_and_scalars(tmp_path):
    import ml_dtypes

    arrays = {"bf16": (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(ml_dtypes.bfloat16),
              "scalar": np.array(-np.inf, np.float32), "bool": np.array([True, False]),
              "bf16_scalar": np.array(1.5, ml_dtypes.bfloat16)}
    lib.write_npz(str(tmp_path / "data.npz"), ((k, lib.encode_array(a)[0]) for k, a in arrays.items()))
    with np.load(tmp_path / "data.npz", allow_pickle=False) as npz:
        assert npz["bf16"].dtype == np.uint16
        for key, array in arrays.items():
            back = lib.decode_array(npz[key], str(array.dtype))
            assert back.dtype == array.dtype and back.shape == array.shape
            assert back.tobytes() == array.tobytes()
    compared = lib.compare(arrays["bf16"], arrays["bf16"], 4e-2, 1e-2)
    assert compared["passed"]


def test_lift_constants_keeps_finite_scalars_inline():
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x], attrs={"num_input": 1}, pure=True):
        a = builder.emit(relax.op.multiply(x, relax.const(0.5, "float32")), "scaled")
        b = builder.emit(relax.op.add(a, relax.const(np.arange(6, dtype="float32").reshape(2, 3))), "shifted")
        c = builder.emit(relax.op.maximum(b, relax.const(float("-inf"), "float32")), "clipped")
        builder.emit_func_output(relax.Tuple([c]))
    func = builder.get()["main"]
    lifted, constants = lift_constants(func)
    assert [array.shape for _name, array in constants] == [(2, 3), ()]
    assert len(lifted.params) == 3 and int(lifted.attrs["num_input"]) == 3
    text = to_script(lifted, "clipped")
    assert "metadata[" not in text and "R.const(0.5" in text
    back = tvm.script.from_source(text)
    executable = tvm.compile(back, "llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [np.ones((2, 3), np.float32)] + [array for _name, array in constants]
    out = lib.flatten(vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in args]))
    np.testing.assert_array_equal(out[0], 0.5 + np.arange(6, dtype=np.float32).reshape(2, 3))


# ------------------------------------------------------------------------------ TVMScript round trip
@pytest.mark.parametrize("example", ["cnn", "tiny_gpt2"])
def test_every_op_round_trips_through_tvmscript(example_traces, example):
    """Every op of a CNN and a transformer prints, parses back equal, and keeps its name."""
    with Session.open(example_traces[example]) as session:
        kinds = set()
        for op in session.ops:
            unit = op_module(session, op)  # raises RoundTripError on any failure
            kinds.add(op.relax_op)
            assert all(ref.array is not None for ref in unit.refs) and len(unit.outputs) == len(op.outputs)
    if example == "tiny_gpt2":
        assert {"relax.nn.layer_norm", "relax.matmul", "relax.take", "relax.split", "get_item"} <= kinds


# ------------------------------------------------------------------------------ dump
def test_dump_cnn_planted_fault_reproduces_and_clean_dump_passes(example_traces, tmp_path):
    trace = example_traces["cnn"]
    op = first_op(trace, "relax.nn.conv2d")
    transform = fault_transform(tmp_path, "scale", op.name)
    faulty = make_dump(trace, op.name, tmp_path / "faulty", transform)
    assert (faulty.index, faulty.name, faulty.status, faulty.reproduces) == (op.index, op.name, "fail", True)
    clean_dir = tmp_path / "clean"
    from tapml_dbg.ui import cli  # the clean dump goes through the CLI: parsing, engine, renderer

    assert cli.main(["dump", str(trace), "--op", str(op.index), "-o", str(clean_dir)]) == 0

    folder = tmp_path / "faulty"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    transform_file = f"transform/{Path(transform.rsplit(':', 1)[0]).name}"
    lib_copy = [f"{lib.LIB_PACKAGE}/{name}" for name in lib_files()]
    assert files == sorted(["README.md", "data.npz", "meta.json", "module.py", "repro.py", transform_file, *lib_copy])
    assert faulty.bytes == sum((folder / f).stat().st_size for f in files)
    for name in lib_files():  # the engine's own runtime, verbatim
        assert (folder / lib.LIB_PACKAGE / name).read_bytes() == (LIB_SOURCE / name).read_bytes(), name
    assert (folder / transform_file).read_bytes() == Path(transform.rsplit(":", 1)[0]).read_bytes()
    readme = (folder / "README.md").read_text()
    for needle in ("examples/cnn.py", f"`{op.name}`", op.layer, op.op, "tvm 0.27", "torch 2.",
                   "rtol=0.0001 atol=1e-06", "**fail**", "| 0 | 0.0", "test dump", "KiB in all",
                   f"{transform_file}:scale"):
        assert needle in readme, needle
    assert "(not judged" not in readme
    with Session.open(trace) as session:  # nothing else of the model: exactly the op's inputs and outputs
        unit = op_module(session, op)
    with np.load(folder / "data.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(ref.key for ref in unit.refs)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["ops"][0]["outputs"][0]["rtol"] == 1e-4 and meta["seen"]["status"] == "fail"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reproduced, passed = in_parallel(lambda: run_repro(folder, elsewhere), lambda: run_repro(clean_dir, elsewhere))
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr
    assert "REPRODUCED" in reproduced.stdout and "max_abs_err=" in reproduced.stdout
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "NOT REPRODUCED" in passed.stdout
    assert not (folder / "__pycache__").exists() and not (clean_dir / "__pycache__").exists()

    with rpc_server() as address:  # the same repro over TVM RPC (in-process: the lib is what runs)
        out = io.StringIO()
        assert lib.repro_main(str(folder), ["--rpc", address], out=out) == lib.EXIT_REPRODUCED, out.getvalue()
        assert f"on llvm via rpc {address}: fail" in out.getvalue()

    # a transform that needs an environment variable the dump saw but the run lacks: "cannot run", exit 2
    (folder / transform_file).write_text("import os\n\ndef scale(mod):\n    os.environ['TAPML_REPRO_TEST_OP']\n"
                                         "    return mod\n")
    meta["transform"]["env"] = {"TAPML_REPRO_TEST_OP": op.name}
    (folder / "meta.json").write_text(json.dumps(meta))
    out = io.StringIO()
    assert lib.repro_main(str(folder), [], out=out) == lib.EXIT_BROKEN
    assert "TAPML_REPRO_TEST_OP" in out.getvalue()


def test_dump_transformer_planted_nan_reproduces_and_clean_dump_passes(example_traces, tmp_path):
    trace = example_traces["tiny_gpt2"]
    op = first_op(trace, "relax.nn.layer_norm")
    faulty = make_dump(trace, op.name, tmp_path / "faulty", fault_transform(tmp_path, "nan", op.name))
    clean = make_dump(trace, op.index, tmp_path / "clean")
    assert faulty.status == "fail" and clean.status == "pass" and clean.layer == op.layer
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reproduced, passed = in_parallel(
        lambda: run_repro(tmp_path / "faulty", elsewhere),
        lambda: run_repro(tmp_path / "clean", elsewhere, "--target", "llvm", "--save-outputs", str(tmp_path / "o.npz")))
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr
    assert "nan_mismatch=" in reproduced.stdout
    assert passed.returncode == 0, passed.stdout + passed.stderr
    with np.load(tmp_path / "o.npz", allow_pickle=False) as outs, Session.open(trace) as session:
        np.testing.assert_allclose(outs["out/0"], session.source_values(op.index)[0], rtol=1e-4, atol=1e-5)


def test_dump_refuses_a_foreign_folder_and_replaces_its_own(example_traces, tmp_path):
    trace = example_traces["cnn"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with Session.open(trace) as session:
        with pytest.raises(UsageError, match="not empty"):
            dump_op(session, 1, foreign)
        name = session.ops[2].name
        first = dump_op(session, 1, tmp_path / "again")
        second = dump_op(session, name, tmp_path / "again")
    assert (first.index, second.index) == (1, 2)
    assert json.loads((tmp_path / "again" / "meta.json").read_text())["ops"][0]["name"] == name


def test_transform_env_names_are_noted():
    from tapml_dbg.repro.files import transform_env_names

    text = 'import os\nA = os.environ["FAULT_A"]\nB = os.getenv("FAULT_B")\nC = os.environ.get(f"TAPML_X_{1}")\n'
    os.environ["TAPML_X_1"] = "on"
    try:
        assert transform_env_names(text + "# reads TAPML_X_1\n") == ["FAULT_A", "FAULT_B", "TAPML_X_1"]
    finally:
        del os.environ["TAPML_X_1"]


# ------------------------------------------------------------------------------ carve
def test_carved_cnn_suite_passes_and_a_planted_fault_fails_exactly_that_op(example_traces, tmp_path):
    trace = example_traces["cnn"]
    clean_dir = tmp_path / "clean"
    from tapml_dbg.ui import cli

    assert cli.main(["carve", str(trace), "-o", str(clean_dir)]) == 0
    meta = json.loads((clean_dir / "meta.json").read_text())
    ops = meta["ops"]
    with Session.open(trace) as session:
        assert meta["skipped"] == [] and len(ops) == len(session.ops)
    assert sorted(p.name for p in clean_dir.iterdir()) == sorted(
        ["README.md", lib.LIB_PACKAGE, "conftest.py", "data.npz", "meta.json", "modules", "pytest.ini",
         "test_ops.py"])
    assert len(list((clean_dir / "modules").iterdir())) == len(ops)
    assert any(op["lifted_constants"] for op in ops)  # batch norm's running statistics
    victim = next(op for op in ops if op["relax_op"] == "relax.matmul")
    result = make_carve(trace, tmp_path / "faulty", fault_transform(tmp_path, "scale", victim["name"]))
    assert result.tests == len(ops) and not result.skipped
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (code, failed, output), (fault_code, fault_failed, fault_output) = in_parallel(
        lambda: run_suite(clean_dir, elsewhere), lambda: run_suite(tmp_path / "faulty", elsewhere, "--target", "llvm"))
    assert code == 0 and not failed, output
    assert f"{len(ops)} passed" in output
    assert fault_code == 1 and fault_failed == {lib.op_id(victim)}, fault_output


def test_carve_budget_leaves_ops_out_with_a_clear_message(example_traces, tmp_path):
    trace = example_traces["cnn"]
    result = make_carve(trace, tmp_path / "small", max_mb=0.05)
    assert result.skipped and result.tests and result.tests + len(result.skipped) == result.ops
    assert all(re.fullmatch(r"op \d+ \S+ \([\d.]+ (B|KiB|MiB)\) left out: over the 0\.05 MiB budget "
                            r"\(raise with --max-mb\)", note) for note in result.skipped), result.skipped
    assert result.data_bytes <= 0.05 * 1024 * 1024
    meta = json.loads((tmp_path / "small" / "meta.json").read_text())
    assert len(meta["ops"]) == result.tests and meta["skipped"] == result.skipped
    assert "Left out" in (tmp_path / "small" / "README.md").read_text()
    with Session.open(trace) as session:
        with pytest.raises(UsageError, match="max-mb"):
            carve(session, tmp_path / "zero", max_mb=0)


def test_carved_transformer_ops_run_through_the_shared_lib(example_traces, tmp_path):
    """take, split + get_item (tuple inputs), layer_norm, matmul, softmax, -inf constants, 0-d values."""
    trace = example_traces["tiny_gpt2"]
    result = make_carve(trace, tmp_path / "gpt2")
    assert result.tests == result.ops and not result.skipped
    here = str(tmp_path / "gpt2")
    meta = lib.read_meta(here)
    wanted = {"relax.take", "relax.split", "get_item", "relax.nn.layer_norm", "relax.matmul", "relax.nn.softmax",
              "relax.where", "relax.full"}
    chosen, seen = [], set()
    for op in meta["ops"]:
        scalar = any(ref["shape"] == [] for ref in op["inputs"] + op["outputs"])
        if (op["relax_op"] in wanted and op["relax_op"] not in seen) or scalar or op["lifted_constants"]:
            seen.add(op["relax_op"])
            chosen.append(op)
    assert wanted <= seen
    assert any(any(ref["shape"] == [] for ref in op["inputs"] + op["outputs"]) for op in chosen)
    assert any(ref["kind"] == "op" and ref["field"] > 0 for op in chosen for ref in op["inputs"])  # tuple input
    runner, data = lib.Runner("llvm"), lib.Data(here)
    try:
        for op in chosen:
            check = lib.check_op(here, meta, op, runner, data)
            assert check.passed, check.report()
    finally:
        data.close()


def test_a_fault_only_the_noise_floor_catches_reproduces_in_its_dump(traces, tmp_path):
    """A x1.0001 gelu is far above torch's own error but under the fixed rtol: the session fails it, so
    the repro must too (it judges by the float64 reference stored with it), and the clean dump passes."""
    trace = traces.get("mlp")
    transform = fault_transform(tmp_path, "scale", "gelu_1", scale="1.0001")
    faulty, clean = tmp_path / "faulty", tmp_path / "clean"
    with Session.open(trace, transform=transform) as session:
        index = session.resolve("gelu_1").index
        assert session.isolated(index).failed
        dump_op(session, index, faulty)
    make_dump(trace, index, clean)
    out = json.loads((faulty / "meta.json").read_text())["ops"][0]["outputs"][0]
    assert out["noise"]["source_factor"] > 1 and out["noise"]["reference"]["dtype"] == "float64"
    faulty_run, clean_run = in_parallel(lambda: run_repro(faulty, tmp_path), lambda: run_repro(clean, tmp_path))
    assert faulty_run.returncode == lib.EXIT_REPRODUCED, faulty_run.stdout + faulty_run.stderr
    assert "noise floor" in faulty_run.stdout
    assert clean_run.returncode == lib.EXIT_OK, clean_run.stdout + clean_run.stderr
    assert "noise floor" in (faulty / "README.md").read_text()
