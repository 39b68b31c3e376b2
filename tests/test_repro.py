"""dump and carve: standalone repros and carved suites that need only tvm + numpy (+ pytest).

Planted faults come from tests/transforms/faults.py, as self-contained copies that name the op
(`conftest.fault_transform`: the compile cache keys on the transform's text, not on the
environment). Every repro and carved suite runs in a process of its own from another working
directory, behind an import blocker that refuses torch and tapml_dbg: forked from a zygote, a fresh
interpreter that installed the blocker and imported tvm and numpy, once per test process (`ZYGOTE`:
importing TVM is ~3 s of CPU, most of a small repro's run), so that each runs as in a fresh
interpreter whose first line is `import numpy, tvm`. The cnn and
tiny GPT-2 traces are opened once for the module (`cnn`, `gpt2`): every clean dump and carve, and the
CLI's `dump` and `carve` (their `_open` handed that session), use them; a planted fault opens its own.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
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
from tapml_dbg.api import Replay
from tapml_dbg.ui import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FAULTS = ROOT / "tests" / "transforms" / "faults.py"

# A fresh interpreter with torch and tapml_dbg unimportable that imports numpy and tvm, then, for each
# request line on stdin (JSON: argv, cwd, env, output files, timeout), forks a child that runs the
# script (or `-m` module) as `python SCRIPT ARGS` would, behind the blocker, and writes which forbidden
# modules were tried and which got loaded to the request's `report` file (its stdout is the script's
# own); the zygote answers one line with the child's exit code.
ZYGOTE = r"""
import importlib.abc, json, os, runpy, signal, sys, traceback
attempts = []
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "tapml_dbg"):
            attempts.append(name)
            raise ModuleNotFoundError("blocked import of " + name)
        return None
sys.meta_path.insert(0, _Block())
import numpy, tvm

def child(request):
    signal.alarm(request["timeout"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY), fd)
    sys.argv = list(request["argv"])
    try:
        if request["module"]:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # as an interpreter dies of it: the traceback, exit 1, no report
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tapml_dbg"))
    with open(request["report"], "w") as report:
        print("BLOCKED-ATTEMPTS:", ",".join(sorted(set(a.split(".")[0] for a in attempts))), file=report)
        print("FORBIDDEN-LOADED:", ",".join(loaded), file=report)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

while True:
    line = sys.stdin.readline()
    if not line:
        break
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            child(request)
        finally:
            os._exit(1)
    _pid, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class Zygote:
    """This test process's ZYGOTE: started on first use, one request at a time (tests call it from threads),
    gone when the test process is (its stdin closes)."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def run(self, argv: list[str], cwd: Path, module: str = "",
            timeout: int = 300) -> tuple[subprocess.CompletedProcess, str]:
        """`python ARGV` (`python -m MODULE ARGV[1:]` with `module`) in `cwd`, forked from the zygote: what it
        printed and its exit code, and the blocker's report."""
        with self.lock, tempfile.TemporaryDirectory(prefix="tapml-repro-run-") as scratch:
            if self.process is None or self.process.poll() is not None:
                self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, text=True, env=_env(),
                                                cwd=tempfile.gettempdir())
            files = {name: Path(scratch) / name for name in ("stdout", "stderr", "report")}
            for path in files.values():
                path.touch()
            request = {"argv": argv, "module": module, "cwd": str(cwd), "env": _env(), "timeout": timeout,
                       **{name: str(path) for name, path in files.items()}}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            reply = self.process.stdout.readline()
            assert reply, "the repro zygote died"
            code = json.loads(reply)["code"]
            return (subprocess.CompletedProcess(argv, code, files["stdout"].read_text(), files["stderr"].read_text()),
                    files["report"].read_text())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


ZYGOTE_PROCESS = Zygote()
atexit.register(ZYGOTE_PROCESS.stop)


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def cnn(traces):
    """examples/cnn.py's trace (the shared `traces`: recorded once per run), opened once for the module."""
    with Session.open(traces.get("cnn")) as session:
        yield session


@pytest.fixture(scope="module")
def gpt2(traces):
    """examples/tiny_gpt2.py's trace, opened once for the module."""
    with Session.open(traces.get("tiny_gpt2")) as session:
        yield session


def trace_of(session) -> Path:
    return Path(session.reader.path)


def cli_on(monkeypatch, session) -> None:
    """`cli.main` runs its command on `session`: the command line's parsing, the API call and the renderer,
    without opening the trace again."""
    monkeypatch.setattr(cli, "_open", lambda args, **_: contextlib.nullcontext(Replay(session)))


def make_dump(trace: Path, op, out: Path, transform: str | None = None) -> DumpResult:
    with Session.open(trace, transform=transform) as session:
        return dump_op(session, op, out, command=f"test dump {op}")


def make_carve(trace: Path, out: Path, transform: str | None = None, **kw) -> CarveResult:
    with Session.open(trace, transform=transform) as session:
        return carve(session, out, **kw)


def check_every_op_carved(session, meta: dict, folder: Path) -> None:
    """Every op of the session is in the carved suite: its module printed and parsed back (a RoundTripError
    would leave it out, with a line in `skipped`), its outputs all there, and every array it reads or
    compares in data.npz."""
    ops = meta["ops"]
    assert meta["skipped"] == [] and [op["index"] for op in ops] == [op.index for op in session.ops]
    assert [len(op["outputs"]) for op in ops] == [len(op.outputs) for op in session.ops]
    with np.load(folder / "data.npz", allow_pickle=False) as npz:
        assert {ref["key"] for op in ops for ref in op["inputs"] + op["outputs"]} <= set(npz.files)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("TAPML_FAULT_")}


def in_parallel(*calls):
    """Run independent subprocess-bound calls concurrently (each is a zero-argument callable)."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


def run_blocked(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` in `cwd`, in a process of its own where torch and tapml_dbg cannot be imported
    (forked from the zygote); checks that neither was imported."""
    result, report = ZYGOTE_PROCESS.run([str(script), *args], cwd)
    assert re.search(r"^FORBIDDEN-LOADED: *$", report, re.M), report + result.stdout + result.stderr
    attempts = re.search(r"BLOCKED-ATTEMPTS: (.*)", report)
    assert attempts and "tapml_dbg" not in attempts.group(1), report
    return result


def run_repro(folder: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """A repro's repro.py, run as `run_blocked` runs a script."""
    return run_blocked(folder / "repro.py", cwd, *args)


def run_suite(folder: Path, cwd: Path, *args: str) -> tuple[int, set[str], str]:
    """Run a carved suite with plain pytest (`python -m pytest`, forked from the zygote: tvm, numpy and pytest
    only); returns (exit code, failing test ids, output)."""
    result, _report = ZYGOTE_PROCESS.run(["pytest", str(folder), "-q", "-rf", *args], cwd, module="pytest",
                                         timeout=600)
    failed = set(re.findall(r"FAILED \S*test_ops\.py::test_op\[([^\]]+)\]", result.stdout))
    return result.returncode, failed, result.stdout + result.stderr


@contextlib.contextmanager
def rpc_server():
    """A local TVM RPC server on a free port (tests/rpc_helpers.py); yields "HOST:PORT" once it accepts
    connections, and stops it with its session processes."""
    server = Server()
    try:
        yield server.address
    finally:
        server.stop()


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def first_op(session, relax_op: str):
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


# ------------------------------------------------------------------------------ dump
def test_dump_cnn_planted_fault_reproduces_and_clean_dump_passes(cnn, tmp_path, monkeypatch):
    trace = trace_of(cnn)
    op = first_op(cnn, "relax.nn.conv2d")
    transform = fault_transform(tmp_path, "scale", op.name)
    faulty = make_dump(trace, op.name, tmp_path / "faulty", transform)
    assert (faulty.index, faulty.name, faulty.status, faulty.reproduces) == (op.index, op.name, "fail", True)
    clean_dir = tmp_path / "clean"
    cli_on(monkeypatch, cnn)  # the clean dump goes through the CLI: parsing, engine, renderer
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
    unit = op_module(cnn, op)  # nothing else of the model: exactly the op's inputs and outputs
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


def test_dump_transformer_planted_nan_reproduces_and_clean_dump_passes(gpt2, tmp_path):
    trace = trace_of(gpt2)
    op = first_op(gpt2, "relax.nn.layer_norm")
    faulty = make_dump(trace, op.name, tmp_path / "faulty", fault_transform(tmp_path, "nan", op.name))
    clean = dump_op(gpt2, op.index, tmp_path / "clean")
    assert faulty.status == "fail" and clean.status == "pass" and clean.layer == op.layer
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reproduced, passed = in_parallel(
        lambda: run_repro(tmp_path / "faulty", elsewhere),
        lambda: run_repro(tmp_path / "clean", elsewhere, "--target", "llvm", "--save-outputs", str(tmp_path / "o.npz")))
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr
    assert "nan_mismatch=" in reproduced.stdout
    assert passed.returncode == 0, passed.stdout + passed.stderr
    with np.load(tmp_path / "o.npz", allow_pickle=False) as outs:
        np.testing.assert_allclose(outs["out/0"], gpt2.source_values(op.index)[0], rtol=1e-4, atol=1e-5)


def test_dump_refuses_a_foreign_folder_and_replaces_its_own(cnn, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        dump_op(cnn, 1, foreign)
    name = cnn.ops[2].name
    first = dump_op(cnn, 1, tmp_path / "again")
    second = dump_op(cnn, name, tmp_path / "again")
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
def test_carved_cnn_suite_passes_and_a_planted_fault_fails_exactly_that_op(cnn, tmp_path, monkeypatch):
    """Every op of a CNN carves (printed as TVMScript and parsed back) and passes as a plain pytest suite run
    from elsewhere; a fault planted at its matmul fails exactly that op's test.

    The suite carved with the fault is the clean one plus the transform (every module, array and test file
    the same): run whole, every test but the matmul's passes, so the clean suite is run for that op alone
    (`-k`, as its README shows), where it passes; each op's module compiled once, not twice."""
    trace = trace_of(cnn)
    clean_dir, faulty_dir = tmp_path / "clean" / "cnn", tmp_path / "faulty" / "cnn"  # one name: one test_ops.py
    cli_on(monkeypatch, cnn)
    assert cli.main(["carve", str(trace), "-o", str(clean_dir)]) == 0
    meta = json.loads((clean_dir / "meta.json").read_text())
    ops = meta["ops"]
    check_every_op_carved(cnn, meta, clean_dir)
    assert sorted(p.name for p in clean_dir.iterdir()) == sorted(
        ["README.md", lib.LIB_PACKAGE, "conftest.py", "data.npz", "meta.json", "modules", "pytest.ini",
         "test_ops.py"])
    assert len(list((clean_dir / "modules").iterdir())) == len(ops)
    assert any(op["lifted_constants"] for op in ops)  # batch norm's running statistics
    victim = next(op for op in ops if op["relax_op"] == "relax.matmul")
    result = make_carve(trace, faulty_dir, fault_transform(tmp_path, "scale", victim["name"]))
    assert result.tests == len(ops) and not result.skipped
    clean_files, faulty_files = files_under(clean_dir), files_under(faulty_dir)
    copied = {name for name in faulty_files if name.startswith("transform/")}
    assert len(copied) == 1 and set(faulty_files) - copied == set(clean_files)
    assert {name for name in clean_files if clean_files[name] != faulty_files[name]} <= {"README.md", "meta.json"}
    assert json.loads(faulty_files["meta.json"])["ops"] == ops
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (code, failed, output), (fault_code, fault_failed, fault_output) = in_parallel(
        lambda: run_suite(clean_dir, elsewhere, "-k", lib.op_id(victim)),
        lambda: run_suite(faulty_dir, elsewhere, "--target", "llvm"))
    assert code == 0 and not failed and re.search(rf"\b1 passed, {len(ops) - 1} deselected", output), output
    assert fault_code == 1 and fault_failed == {lib.op_id(victim)}, fault_output
    assert re.search(rf"\b1 failed, {len(ops) - 1} passed", fault_output), fault_output


def test_carve_budget_leaves_ops_out_with_a_clear_message(cnn, tmp_path):
    result = carve(cnn, tmp_path / "small", max_mb=0.05)
    assert result.skipped and result.tests and result.tests + len(result.skipped) == result.ops
    assert all(re.fullmatch(r"op \d+ \S+ \([\d.]+ (B|KiB|MiB)\) left out: over the 0\.05 MiB budget "
                            r"\(raise with --max-mb\)", note) for note in result.skipped), result.skipped
    assert result.data_bytes <= 0.05 * 1024 * 1024
    meta = json.loads((tmp_path / "small" / "meta.json").read_text())
    assert len(meta["ops"]) == result.tests and meta["skipped"] == result.skipped
    assert "Left out" in (tmp_path / "small" / "README.md").read_text()
    with pytest.raises(UsageError, match="max-mb"):
        carve(cnn, tmp_path / "zero", max_mb=0)


def test_carved_transformer_ops_run_through_the_shared_lib(gpt2, tmp_path):
    """Every op of a transformer carves (printed as TVMScript and parsed back); take, split + get_item (tuple
    inputs), layer_norm, matmul, softmax, -inf constants, 0-d values run through the shared lib."""
    result = carve(gpt2, tmp_path / "gpt2")
    assert result.tests == result.ops and not result.skipped
    here = str(tmp_path / "gpt2")
    meta = lib.read_meta(here)
    check_every_op_carved(gpt2, meta, tmp_path / "gpt2")
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
