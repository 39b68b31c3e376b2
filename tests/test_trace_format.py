"""The v1 trace format: exact round trips, stats, data-only storage, errors, crash safety."""

import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import h5py
import ml_dtypes
import numpy as np
import pytest

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import FORMAT_NAME, FORMAT_VERSION, TraceReader, TraceWriter, tensor_stats
from tapml_dbg.trace import schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "trace_v1.h5")


def bits(dtype, values):
    """An array of `dtype` from raw bit patterns (for exact NaN payloads, -0.0, inf)."""
    dtype = np.dtype(dtype)
    return np.array(values, dtype=f"u{dtype.itemsize}").view(dtype)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == np.bool_:
        return bool((a == b).all())
    view = f"u{a.dtype.itemsize}"
    return bool((a.view(view) == b.view(view)).all())


SAMPLES = {
    # NaN with payload, negative NaN, signalling NaN, -0.0, +-inf, subnormal
    "float32": bits(np.float32, [0x7FC00123, 0xFFC00001, 0x7F800001, 0x80000000, 0x7F800000,
                                 0xFF800000, 0x00000001, 0x3F800000]),
    "float16": bits(np.float16, [0x7E01, 0xFC00, 0x7C00, 0x8000, 0x0001, 0x3C00, 0x7BFF]),
    "bfloat16": bits(ml_dtypes.bfloat16, [0x7FC1, 0xFFA0, 0x7F81, 0x8000, 0x7F80, 0xFF80,
                                          0x0001, 0x3F80]),
    "float64": bits(np.float64, [0x7FF8000000000123, 0x7FF0000000000001, 0x8000000000000000,
                                 0x7FF0000000000000, 0x0000000000000001]),
    "int64": np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max], dtype=np.int64),
    "int32": np.array([[np.iinfo(np.int32).min, 7], [0, np.iinfo(np.int32).max]], dtype=np.int32),
    "bool": np.array([[True, False, True]]),
    "uint8": np.arange(256, dtype=np.uint8).reshape(16, 16),
    "int8": np.array([-128, 0, 127], dtype=np.int8),
    "float8_e4m3fn": bits(ml_dtypes.float8_e4m3fn, [0x7F, 0x80, 0x01, 0x38]),
    "scalar_f32": np.array(-0.0, dtype=np.float32),
    "scalar_bf16": np.array(3.5, dtype=ml_dtypes.bfloat16),
    "scalar_bool": np.array(True),
    "empty_f32": np.zeros((0, 3), dtype=np.float32),
    "empty_bf16": np.zeros((2, 0), dtype=ml_dtypes.bfloat16),
    "empty_bool": np.zeros((0,), dtype=bool),
}


def write_trace(path, n_ops=3, outputs=None, compression=None, meta=None, inputs=None, **kw):
    """A small trace; op i's outputs default to [full((2,3), i)]."""
    outputs = outputs or {}
    with TraceWriter(path, meta=meta or {"model": "t.py:build"}, graph_json='{"a": 1}',
                     tvmscript="# script", ops=[{"index": i, "name": f"lv{i}"} for i in range(n_ops)],
                     inputs=inputs if inputs is not None else {"x": np.ones(3, np.float32)},
                     params={"w": np.eye(2, dtype=np.float32)}, compression=compression, **kw) as w:
        for i in range(n_ops):
            w.write_op(i, outputs.get(i, [np.full((2, 3), i, np.float32)]), note=f"op{i}")
    return path


# ---- round trips -------------------------------------------------------------------------

@pytest.mark.parametrize("compression", [None, "lzf", "gzip"])
def test_round_trip_is_bit_exact(tmp_path, compression):
    names = list(SAMPLES)
    path = tmp_path / "t.h5"
    with TraceWriter(path, meta={}, graph_json="{}", tvmscript="", ops=[{}] * len(names),
                     inputs=dict(SAMPLES), params=dict(SAMPLES), compression=compression) as w:
        for i, name in enumerate(names):
            w.write_op(i, [SAMPLES[name], SAMPLES[name]])
    with TraceReader(path) as r:
        assert r.input_names == names and r.param_names == names
        for i, name in enumerate(names):
            want = SAMPLES[name]
            for got in (r.input(name), r.param(name), *r.op_outputs(i)):
                assert got.dtype == want.dtype and got.shape == want.shape, name
                assert same_bits(got, want), name


def test_schema_helpers_round_trip_and_reject():
    for name, arr in SAMPLES.items():
        stored, dtype_name = schema.to_storable(arr)
        assert dtype_name == arr.dtype.name and stored.dtype.kind in "uif" and stored.shape == arr.shape
        assert same_bits(schema.from_stored(stored, dtype_name), arr), name
    assert schema.to_storable(np.zeros(2, ">f4"))[0].dtype == np.dtype("<f4")
    assert same_bits(schema.from_stored(np.arange(3, dtype=np.float32)[::2], "float32"),
                     np.array([0, 2], np.float32))
    for bad in (np.array(["a"]), np.array([1j]), np.array([object()])):
        with pytest.raises(ValueError):
            schema.to_storable(bad)
    with pytest.raises(ValueError, match="upgrade"):
        schema.from_stored(np.zeros(2, np.uint8), "float99")
    with pytest.raises(ValueError, match="corrupt"):
        schema.from_stored(np.zeros(2, np.float32), "bfloat16")


# ---- stats -------------------------------------------------------------------------------

def test_stats_values():
    s = tensor_stats(np.array([1.0, -4.0, np.nan, np.inf, -np.inf, 3.0], dtype=np.float32))
    assert s == {"min": -4.0, "max": 3.0, "mean": 0.0, "absmax": 4.0, "nan": 1, "inf": 2,
                 "numel": 6, "fp16_headroom": math.log2(65504 / 4)}
    assert tensor_stats(np.array([[True, False], [True, True]])) == {
        "min": 0.0, "max": 1.0, "mean": 0.75, "absmax": 1.0, "nan": 0, "inf": 0, "numel": 4,
        "fp16_headroom": math.log2(65504)}
    big = np.array([np.iinfo(np.int64).max, -5], dtype=np.int64)
    assert tensor_stats(big)["max"] == float(np.iinfo(np.int64).max)
    bf = tensor_stats(np.array([1.5, -0.0, np.inf, np.nan], dtype=ml_dtypes.bfloat16))
    assert (bf["min"], bf["max"], bf["mean"], bf["nan"], bf["inf"]) == (-0.0, 1.5, 0.75, 1, 1)
    h = tensor_stats(np.array([65504, -1], dtype=np.float16))
    assert h["fp16_headroom"] == 0.0 and h["mean"] == 32751.5
    assert tensor_stats(np.array(-2.0))["absmax"] == 2.0


def test_stats_degenerate():
    none = {"min": None, "max": None, "mean": None, "absmax": None, "fp16_headroom": None}
    assert tensor_stats(np.zeros((0, 4), np.float32)) == {**none, "nan": 0, "inf": 0, "numel": 0}
    assert tensor_stats(np.array([np.nan, np.inf], np.float16)) == {**none, "nan": 1, "inf": 1,
                                                                     "numel": 2}
    z = tensor_stats(np.zeros(5, np.int32))
    assert z["absmax"] == 0.0 and z["fp16_headroom"] is None
    big = np.ones(2_000_000, np.float32)
    big[7] = np.nan
    s = tensor_stats(big)
    assert s["mean"] == 1.0 and s["nan"] == 1 and s["numel"] == 2_000_000


def test_stats_are_stored_beside_tensors(tmp_path):
    x = np.array([1.0, np.nan, -3.0], np.float32)
    path = write_trace(tmp_path / "t.h5", outputs={1: [x, np.array([], np.int64)]}, inputs={"x": x})
    with TraceReader(path) as r:
        assert r.input_stats("x") == tensor_stats(x)
        assert r.op_stats(1) == [tensor_stats(x), tensor_stats(np.array([], np.int64))]
        assert r.param_stats("w")["absmax"] == 1.0


# ---- data only ---------------------------------------------------------------------------

def test_no_object_or_vlen_data_anywhere(tmp_path):
    path = write_trace(tmp_path / "t.h5", meta={"model": "ünïcode", "n": [1, 2]},
                       outputs={0: list(SAMPLES.values())}, compression="lzf")
    seen = []

    def check(dtype, where):
        assert dtype.kind != "O", where
        assert h5py.check_vlen_dtype(dtype) is None, where
        info = h5py.check_string_dtype(dtype)
        assert info is None or info.length is not None, where

    def visit(name, obj):
        seen.append(name)
        if isinstance(obj, h5py.Dataset):
            check(obj.dtype, name)
        for attr in obj.attrs:
            check(obj.attrs.get_id(attr).dtype, f"{name}@{attr}")

    with h5py.File(path, "r") as f:
        visit("/", f)
        f.visititems(visit)
    assert "graph/ir_json" in seen and "ops/0/3" in seen


def test_text_and_meta(tmp_path):
    path = tmp_path / "t.h5"
    graph = '{"nodes": [' + ", ".join(['{"k": "ü"}'] * 20000) + "]}"  # a few hundred KB
    with TraceWriter(path, meta={"model": "m", "created": "now"}, graph_json=graph,
                     tvmscript="@R.function\ndef main(): ...", ops=[{"name": "a", "op": "relax.add"}],
                     inputs={}, params={}, compression="gzip") as w:
        w.set_meta("elapsed_s", 1.25)  # fits the reserved capacity: rewritten in place
        w.set_meta("notes", "x" * 5000)  # does not: the attribute is recreated
        with pytest.raises(TypeError):
            w.set_meta("bad", object())
        assert w.meta["elapsed_s"] == 1.25 and "bad" not in w.meta
    with TraceReader(path) as r:
        assert r.graph_json == graph
        assert r.tvmscript.startswith("@R.function")
        assert r.ops == [{"name": "a", "op": "relax.add"}]
        assert r.meta == {"model": "m", "created": "now", "elapsed_s": 1.25, "notes": "x" * 5000}
        assert r.version == FORMAT_VERSION and r.complete
        assert r.finished_ops() == [] and not r.has_op(0)
        assert r.input_names == [] and r.param_names == []
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == FORMAT_NAME.encode()


def test_opening_reads_no_tensor(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "t.h5", n_ops=5)

    def boom(*a, **k):
        raise AssertionError("a tensor was read while opening")

    monkeypatch.setattr(h5py.Dataset, "__getitem__", boom)
    monkeypatch.setattr(h5py.Dataset, "read_direct", boom)
    with TraceReader(path) as r:
        assert r.complete and r.meta["model"] == "t.py:build"
        assert r.finished_ops() == [0, 1, 2, 3, 4] and r.op_note(3) == "op3"
        assert r.input_stats("x")["numel"] == 3
        assert r.tensor_bytes() == 3 * 4 + 4 * 4 + 5 * 6 * 4
        assert r.file_size == os.path.getsize(path)


# ---- writer behaviour --------------------------------------------------------------------

def test_ops_any_order_and_write_errors(tmp_path):
    path = tmp_path / "t.h5"
    with TraceWriter(path, meta={}, graph_json="{}", tvmscript="", ops=[{}] * 4,
                     inputs={}, params={}) as w:
        w.write_op(3, [np.array([3.0])])
        w.write_op(1, [])
        with pytest.raises(ValueError, match="already written"):
            w.write_op(3, [np.array([3.0])])
        for bad in (4, -1):
            with pytest.raises(ValueError, match="not in the op table"):
                w.write_op(bad, [np.zeros(1)])
        with pytest.raises(ValueError, match="cannot be stored"):
            w.write_op(0, [np.zeros(1), np.array(["s"])])
        w.write_op(0, [np.array([0.5])])  # the failed attempt left nothing behind
    with TraceReader(path) as r:
        assert r.finished_ops() == [0, 1, 3] and not r.has_op(2) and not r.has_op(9)
        assert r.op_outputs(1) == [] and r.op_note(1) == ""
        assert [a.tolist() for a in r.op_outputs(0)] == [[0.5]]
        with pytest.raises(TraceError, match=r"op 2 has no recorded values \(the recording "
                                             r"stopped before it; record again\)"):
            r.op_outputs(2)
        with pytest.raises(TraceError, match="no input named 'nope'"):
            r.input("nope")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="compression"):
        TraceWriter(tmp_path / "a.h5", meta={}, graph_json="", tvmscript="", ops=[], inputs={},
                    params={}, compression="zstd")
    with pytest.raises(ValueError, match="name"):
        TraceWriter(tmp_path / "b.h5", meta={}, graph_json="", tvmscript="", ops=[],
                    inputs={"a/b": np.zeros(1)}, params={})


def test_exception_marks_incomplete(tmp_path):
    path = tmp_path / "t.h5"
    with pytest.raises(RuntimeError):
        with TraceWriter(path, meta={}, graph_json="{}", tvmscript="", ops=[{}] * 3,
                         inputs={}, params={}) as w:
            w.write_op(0, [np.ones(2)])
            raise RuntimeError("source crashed")
    with TraceReader(path) as r:
        assert not r.complete and r.finished_ops() == [0]
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write_op(1, [np.ones(2)])


def test_compression_shrinks_compressible_data(tmp_path):
    sizes = {}
    for comp in (None, "lzf", "gzip"):
        path = write_trace(tmp_path / f"{comp}.h5", outputs={0: [np.zeros((256, 256), np.float32)]},
                           compression=comp)
        sizes[comp] = os.path.getsize(path)
        with TraceReader(path) as r:
            assert r.tensor_bytes() == 12 + 16 + 256 * 256 * 4 + 2 * 24
    assert sizes["lzf"] < sizes[None] / 4 and sizes["gzip"] < sizes[None] / 4


# ---- reader errors -----------------------------------------------------------------------

def test_reader_errors(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        TraceReader(tmp_path / "missing.h5")
    with pytest.raises(TraceError, match="directory"):
        TraceReader(tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a trace\n")
    with pytest.raises(TraceError, match="not an HDF5 file"):
        TraceReader(text)
    (tmp_path / "empty.h5").write_bytes(b"")
    with pytest.raises(TraceError, match="not an HDF5 file"):
        TraceReader(tmp_path / "empty.h5")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(TraceError, match="HDF5 file but not a tapml trace"):
        TraceReader(other)


def test_truncated_trace(tmp_path):
    path = write_trace(tmp_path / "t.h5", n_ops=20,
                       outputs={i: [np.random.default_rng(i).random((64, 64))] for i in range(20)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt") as info:
        TraceReader(path)
    assert "\n" not in str(info.value)


def _set_version(path, major, minor):
    with h5py.File(path, "r+") as f:
        f.attrs.modify("version_major", major)
        f.attrs.modify("version_minor", minor)


def test_version_rules(tmp_path):
    path = write_trace(tmp_path / "t.h5")
    _set_version(path, 2, 0)
    with pytest.raises(TraceError) as info:
        TraceReader(path)
    assert str(info.value) == ("trace format v2.0 is newer than this tapml-dbg (reads v1); "
                               "upgrade tapml-dbg")
    _set_version(path, 0, 9)
    with pytest.raises(TraceError, match="older"):
        TraceReader(path)
    _set_version(path, 1, 7)  # a newer minor only adds things: still readable
    with TraceReader(path) as r:
        assert r.version == (1, 7) and r.op_outputs(2)[0][0, 0] == 2.0


def test_trace_modules_never_unpickle_or_eval():
    folder = os.path.join(ROOT, "tapml_dbg", "trace")
    for name in os.listdir(folder):
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as fh:
                src = fh.read()
            assert not re.search(r"import pickle|pickle\.|\beval\(|\bexec\(|allow_pickle", src), name


# ---- crash safety: a real SIGKILL --------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from tapml_dbg.trace import TraceWriter

    n = 5000
    order = np.random.default_rng(int(sys.argv[2])).permutation(n)  # any order, not increasing
    w = TraceWriter(sys.argv[1], meta={"model": "kill"}, graph_json="{}", tvmscript="",
                    ops=[{"index": i} for i in range(n)], inputs={"x": np.zeros(3, np.float32)},
                    params={}, compression=sys.argv[3] if sys.argv[3] != "none" else None)
    for j, i in enumerate(order):
        i = int(i)
        w.write_op(i, [np.full((i % 5 + 1, 40), i, np.float32), np.arange(i % 37, dtype=np.int64)],
                   note=f"op {i}")
        if j % 40 == 39:
            w.set_meta("progress", j)
        print(i, flush=True)
""")


@pytest.mark.parametrize("after,delay_ms,compression", [(20, 0.0, "none"), (75, 0.7, "lzf"),
                                                        (160, 2.3, "none")])
def test_sigkill_leaves_readable_trace(tmp_path, after, delay_ms, compression):
    path = tmp_path / "killed.h5"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(after), compression],
                             stdout=subprocess.PIPE, text=True, env=env)
    printed = []
    try:
        while len(printed) < after:
            line = child.stdout.readline()
            assert line, f"writer exited early with code {child.wait()}"
            printed.append(int(line))
        if delay_ms:
            import time
            time.sleep(delay_ms / 1000)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    with TraceReader(path) as r:
        assert not r.complete
        assert r.meta["model"] == "kill"
        finished = r.finished_ops()
        assert set(printed) <= set(finished)
        assert len(finished) < 5000
        for i in finished:  # every op the reader calls finished round-trips, not just printed
            out = r.op_outputs(i)
            assert same_bits(out[0], np.full((i % 5 + 1, 40), i, np.float32))
            assert same_bits(out[1], np.arange(i % 37, dtype=np.int64))
            assert r.op_note(i) == f"op {i}"


# ---- frozen v1 fixture -------------------------------------------------------------------

def test_frozen_v1_fixture():
    """Reads the committed v1 file; if this fails, the reader broke v1 compatibility."""
    with TraceReader(FIXTURE) as r:
        assert r.version == (1, 0) and r.complete
        assert r.meta == {"model": "fixture.py:build", "source": "torch",
                          "created": "2025-01-01T00:00:00Z", "versions": {"tapml-dbg": "0.1.0"},
                          "elapsed_s": 0.5}
        assert r.graph_json == '{"root": 1, "nodes": [{"type_key": ""}]}'
        assert r.tvmscript == "# from tvm.script import relax as R\n"
        assert r.ops == [{"index": 0, "name": "lv", "op": "relax.matmul", "layer": "fc"},
                         {"index": 1, "name": "lv1", "op": "relax.greater", "layer": "fc"},
                         {"index": 2, "name": "gv", "op": "relax.sum", "layer": ""}]
        assert r.input_names == ["x", "mask"] and r.param_names == ["w"]
        assert same_bits(r.input("x"), np.array([[1.0, -2.5], [-0.0, np.inf]], np.float32))
        assert same_bits(r.input("mask"), bits(ml_dtypes.bfloat16, [0x3FC0, 0x8000, 0x7F80, 0x7FC1]))
        assert same_bits(r.param("w"), np.array([[0.5, -1.0], [2.0, 65504.0]], np.float16))
        assert r.finished_ops() == [0, 1, 2]
        assert same_bits(r.op_outputs(0)[0], np.array([[-5.0, 2.0], [np.inf, -0.0]], np.float32))
        assert same_bits(r.op_outputs(1)[0], np.array([True, False, True]))
        out2 = r.op_outputs(2)
        assert same_bits(out2[0], np.array([7, -8], np.int64))
        assert same_bits(out2[1], np.array(3.25, np.float32))
        assert r.op_note(2) == "computed by torch"
        assert r.input_stats("mask") == {"min": -0.0, "max": 1.5, "mean": 0.75, "absmax": 1.5,
                                         "nan": 1, "inf": 1, "numel": 4,
                                         "fp16_headroom": math.log2(65504 / 1.5)}
        assert r.param_stats("w")["fp16_headroom"] == 0.0
        assert r.op_stats(2)[0] == {"min": -8.0, "max": 7.0, "mean": -0.5, "absmax": 8.0,
                                    "nan": 0, "inf": 0, "numel": 2,
                                    "fp16_headroom": math.log2(65504 / 8)}
        assert r.tensor_bytes() == 16 + 8 + 8 + 16 + 3 + 16 + 4


def test_info_counts_activation_bytes_by_the_real_dtype_sizes(tmp_path):
    """`info` once kept its own dtype table: uint16 and uint64 counted 4 bytes, float8 4 bytes."""
    from tapml_dbg.trace.inspect import trace_info

    outputs = [{"shape": [10], "dtype": "uint16"}, {"shape": [10], "dtype": "uint64"},
               {"shape": [10], "dtype": "float8_e4m3fn"}, {"shape": [2, 5], "dtype": "bfloat16"},
               {"shape": [], "dtype": "bool"}]
    ops = [{"index": 0, "name": "a", "op": "relax.add", "layer": "blocks.0.fc", "outputs": outputs}]
    path = tmp_path / "t.h5"
    with TraceWriter(path, meta={"model": "m"}, graph_json="{}", tvmscript="", ops=ops, inputs={}, params={}):
        pass
    info = trace_info(path)
    assert info["activation_bytes"] == 10 * 2 + 10 * 8 + 10 * 1 + 10 * 2 + 1
    assert info["num_layers"] == 3  # blocks, blocks.0, blocks.0.fc
