"""The portable runtime (`tapml_dbg/portable`): one runtime for repros and for the engine's worker.

It is copied verbatim into every repro, so it must import nothing from tapml_dbg; and the engine
and a repro must reach the same verdict on the same unit, which they do because both build
through `portable.build`.
"""

from __future__ import annotations

import ast
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tapml_dbg import portable
from tapml_dbg.errors import ModelError, TargetError
from tapml_dbg.frontend.model_loader import load_python_function
from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.portable import runner as portable_runner
from tapml_dbg.runtime import compile_cache
from tapml_dbg.runtime.messages import CompileRequest, UnitRequest, UnitStatus, WorkerConfig
from tapml_dbg.runtime.target import TargetSpec, parse_target
from tapml_dbg.runtime.worker import _WorkerState

PORTABLE = Path(portable.__file__).parent
ALLOWED_TOP_LEVEL = {"numpy", "tvm", "ml_dtypes"}
CUDA = '{"kind":"cuda","arch":"sm_80"}'  # an explicit arch: building needs no GPU
NO_DEVICE_CODE = "no device code was generated"


# ------------------------------------------------------------------------------ what it imports
def _imports(path: Path) -> list[tuple[int, str]]:
    """(relative level, module) of every import in a file, at any depth (functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def test_portable_imports_only_stdlib_numpy_tvm_and_itself():
    files = sorted(PORTABLE.glob("*.py"))
    assert {"codec.py", "comparison.py", "errors.py", "loader.py", "repro.py", "runner.py"} <= {f.name for f in files}
    for path in files:
        for level, module in _imports(path):
            if level:  # relative: one of portable's own modules
                assert level == 1, f"{path.name}: relative import reaches outside portable/ ({'.' * level}{module})"
                continue
            top = module.split(".")[0]
            assert top != "tapml_dbg", f"{path.name} imports {module}: repros run without tapml_dbg"
            assert top in ALLOWED_TOP_LEVEL or top in sys.stdlib_module_names, f"{path.name} imports {module}"


# ------------------------------------------------------------------------------ one wording
def test_labels_and_target_errors_are_the_engines():
    for rpc, tracker, key in ((None, None, None), ("h:1", None, None), (None, "t:2", "k")):
        runner = portable.Runner("llvm", rpc, tracker, key)  # nothing connects until a device is needed
        assert runner.where == TargetSpec(rpc=rpc, tracker=tracker, key=key).where
    assert portable.Runner("llvm", tracker="t:2", key="k").where == "llvm via tracker t:2 key k"
    with pytest.raises(portable.PortableError) as mine:
        portable.parse_target("no-such-kind")
    with pytest.raises(TargetError) as engine:
        parse_target("no-such-kind")
    assert str(engine.value) == str(mine.value) and portable.TARGET_HINT in str(mine.value)
    assert "\n" not in str(mine.value)


def test_one_line_is_cut_at_the_named_limit():
    text = portable.one_line(RuntimeError("first\n\n" + "x" * (2 * portable.MESSAGE_LIMIT)))
    assert text.startswith("RuntimeError: xxx") and len(text) == portable.MESSAGE_LIMIT


def test_one_loader_for_models_transforms_and_repros(tmp_path):
    path = tmp_path / "user.py"
    path.write_text("import sibling\n\ndef make():\n    return sibling.VALUE\n")
    (tmp_path / "sibling.py").write_text("VALUE = 42\n")
    assert portable.load_function(str(path), "make")() == 42
    assert load_python_function(f"{path}:make")() == 42
    for spec, needle in ((f"{path}:absent", "has no function 'absent'"),
                         (f"{tmp_path / 'nope.py'}", "model file not found")):
        with pytest.raises(portable.PortableError) as mine:
            portable.load_function(*portable.split_spec(spec), what="model")
        with pytest.raises(ModelError, match=needle) as engine:
            load_python_function(spec)
        assert str(engine.value) == str(mine.value)
    (tmp_path / "broken.py").write_text("raise ValueError('boom')\n")
    with pytest.raises(ModelError, match="importing .*broken.py failed: ValueError: boom"):
        load_python_function(f"{tmp_path / 'broken.py'}:f", what="transform")


# ------------------------------------------------------------------------------ the device-code check
class _FakeModule:
    def __init__(self, kind, *imports):
        self.kind, self.imports = kind, list(imports)


class _FakeExecutable:
    def __init__(self, mod):
        self.mod = mod


def test_has_device_module_looks_through_nested_imports():
    assert portable.has_device_module(_FakeExecutable(_FakeModule("library", _FakeModule("llvm", _FakeModule("cuda")))))
    assert not portable.has_device_module(_FakeExecutable(_FakeModule("library", _FakeModule("llvm"))))
    assert not portable.has_device_module(_FakeExecutable(_FakeModule("library")))


def _add_module():
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((4,), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x], pure=True):
        y = builder.emit(relax.op.add(x, x), "y")
        builder.emit_func_output(relax.Tuple([y]))
    return tvm.IRModule({"main": builder.get()["main"]})


def test_an_out_of_bounds_read_on_the_cpu_reads_other_bytes_in_every_run():
    """The import's `take(x, -1, mode="fast")` (transformers' `logits[:, -1]`) reads the row before
    x. Each cpu input sits amid fresh random bytes, so every run reads other values there (the
    two runs of a nondeterminism check always differ) while an in-bounds read is exact."""
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x], pure=True):
        before = builder.emit(relax.op.take(x, relax.const(-1, "int64"), axis=0, mode="fast"), "before")
        last = builder.emit(relax.op.take(x, relax.const(3, "int64"), axis=0, mode="fast"), "last")
        builder.emit_func_output(relax.Tuple([before, last]))
    runner = portable.Runner("llvm")
    vm = runner.load(runner.build(tvm.IRModule({"main": builder.get()["main"]})))
    values = np.arange(32, dtype=np.float32).reshape(4, 8)
    runs = [runner.run(vm, [values]) for _ in range(4)]
    assert all(np.array_equal(last, values[3]) for _before, last in runs)
    reads = {before.tobytes() for before, _last in runs}
    assert len(reads) == len(runs)  # the bytes before the input differ in every run
    placed, again = portable_runner.guarded(values), portable_runner.guarded(values)
    assert placed.ctypes.data % portable_runner.ALIGNMENT == 0 and np.array_equal(placed, values)
    around = [np.frombuffer(p.base, np.uint8)[:p.ctypes.data - p.base.ctypes.data][-64:] for p in (placed, again)]
    assert not np.array_equal(*around)  # new bytes on every call, not the allocator's
    assert portable_runner.guarded(np.zeros(3, np.complex64)) is None  # numpy hands TVM no complex


def _repro_dir(folder: Path, mod, target: str) -> tuple[dict, dict]:
    """A one-op repro directory, as a dump writes it (module, data, meta), for `check_op`."""
    x = np.arange(4, dtype=np.float32)
    (folder / "module.py").write_text(mod.script(), encoding="utf-8")
    portable.write_npz(str(folder / portable.DATA_FILE), [("in/x", x), ("out/y", x + x)])
    entry = {"dtype": "float32", "shape": [4]}
    op = {"index": 0, "name": "y", "op": "relax.add", "layer": "", "module": "module.py",
          "inputs": [dict(entry, key="in/x")],
          "outputs": [dict(entry, key="out/y", rtol=1e-6, atol=0.0, judged=True)]}
    meta = {"format": portable.FORMAT, "version": portable.FORMAT_VERSION, "target": target, "transform": None,
            "ops": [op]}
    (folder / portable.META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return meta, op


def _has_codegen(kind: str) -> bool:
    import tvm

    return tvm.get_global_func(f"target.build.{kind}", allow_missing=True) is not None


@pytest.mark.skipif(not _has_codegen("cuda"), reason="this TVM cannot generate CUDA code")
def test_kernels_without_a_device_module_are_a_compile_error_in_the_engine_and_in_a_repro(tmp_path, monkeypatch):
    """The same build, so the same verdict: the worker's compile cache and a repro's check_op both
    call portable.build, whose device-code check turns host-only kernels into a compile error."""
    mod = _add_module()
    unit_json = function_to_json(mod["main"])
    meta, op = _repro_dir(tmp_path, mod, CUDA)
    cache = tmp_path / "cache"
    worker = _WorkerState(WorkerConfig(str(tmp_path / "unused.h5"), TargetSpec(target=CUDA), str(cache)))

    # as TVM builds it, the unit has device code: the check lets it through (no false alarm)
    assert not compile_cache.compile_unit(unit_json, CUDA, None, cache).cached
    assert worker.handle(CompileRequest(UnitRequest(unit_json, []), code_only=True)).status == UnitStatus.OK

    # the same unit when its kernels stay on the host (what an unscheduled PrimFunc gives)
    monkeypatch.setattr(portable_runner, "has_device_module", lambda executable: False)
    fresh = tmp_path / "fresh-cache"
    worker.config.cache_dir = str(fresh)
    for request in (UnitRequest(unit_json, []), CompileRequest(UnitRequest(unit_json, []), code_only=True)):
        reply = worker.handle(request)
        assert reply.status == UnitStatus.COMPILE_ERROR and NO_DEVICE_CODE in reply.message, reply
    assert not list(fresh.glob("*.so")), "a unit without device code must not be cached"

    data = portable.Data(str(tmp_path))
    try:
        check = portable.check_op(str(tmp_path), meta, op, portable.Runner(CUDA), data)
    finally:
        data.close()
    assert check.status == portable.COMPILE_ERROR and NO_DEVICE_CODE in check.message, check.report()
    assert check.message == reply.message  # word for word: one function decided both
    out = io.StringIO()
    assert portable.repro_main(str(tmp_path), [], out=out) == portable.EXIT_REPRODUCED
    assert f"on {TargetSpec(target=CUDA).where}: compile-error" in out.getvalue()


def test_host_targets_need_no_device_module(tmp_path):
    """llvm kernels are host code: the check does not apply, and a repro runs the op to a pass."""
    meta, op = _repro_dir(tmp_path, _add_module(), "llvm")
    out = io.StringIO()
    assert portable.repro_main(str(tmp_path), [], out=out) == portable.EXIT_OK, out.getvalue()
    assert "on llvm: pass" in out.getvalue()


def test_an_exception_without_a_message_says_where_it_was_raised(tmp_path):
    """TVM 0.27's CUDA schedule rules fail some units with a bare `assert`: the one-line wording
    names the statement and its file:line instead of an empty `AssertionError:`."""
    from tapml_dbg.portable.errors import one_line

    rule = tmp_path / "rule.py"
    rule.write_text("def apply(loops):\n    assert len(loops) == 3\n")
    namespace: dict = {}
    exec(compile(rule.read_text(), str(rule), "exec"), namespace)
    try:
        namespace["apply"]([1, 2])
    except AssertionError as exc:
        text = one_line(exc)
    assert text.startswith("AssertionError: `assert len(loops) == 3` at ") and text.endswith("rule.py:2 (no message)")
    assert one_line(ValueError("first\nthe cause")) == "ValueError: the cause"


def test_compare_of_the_same_bits_gives_the_figures_of_the_full_passes():
    """An exact output (a move, a weight's transpose) skips the float64 passes; its figures must be the
    ones those passes give, NaNs and infinities in the same places included, and a value that differs
    in its bits only (-0.0 against 0.0) still goes through them."""
    from tapml_dbg.portable.comparison import compare

    source = np.array([1.5, -3.25, np.nan, np.inf, -np.inf, 0.0, 2.0], dtype=np.float32)
    same = compare(source.copy(), source, 1e-5, 1e-6)
    assert same["passed"] and same["mismatched"] == 0 and same["cosine"] == 1.0
    assert same["max_abs_err"] == same["max_rel_err"] == same["scale_rel_err"] == 0.0
    assert same["absmax"] == 3.25 and same["bound"] == pytest.approx(1e-6 + 1e-5 * 3.25)
    signed_zero = source.copy()
    signed_zero[5] = -0.0
    assert compare(signed_zero, source, 1e-5, 1e-6)["passed"]
    off = source.copy()
    off[0] = 1.6
    assert not compare(off, source, 1e-5, 1e-6)["passed"]
    half = np.array([1.0, -65504.0, np.inf], dtype=np.float16)
    assert compare(half.copy(), half, 1e-3, 1e-3)["absmax"] == 65504.0
