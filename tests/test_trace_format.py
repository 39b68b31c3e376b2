"""The v1 trace format: exact round trips, stats, data-only storage, errors, crash safety."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import zlib

import h5py
import ml_dtypes
import numpy as np
import pytest

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import FORMAT_NAME, FORMAT_VERSION, TraceReader, TraceWriter, tensor_stats
from tapml_dbg.trace import schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "trace_v1.h5")
FIXTURE_V1_1 = os.path.join(ROOT, "tests", "fixtures", "trace_v1_1.h5")
# what the reader fills in for op-table keys an entry lacks
OP_DEFAULTS = {"op": "", "relax_op": "", "layer": "", "fx_node": "", "inputs": [], "outputs": [], "is_tuple": False,
               "source_location": None, "stock_outputs": [], "step": None}


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


def op_table(n):
    """A valid op table of `n` ops (the reader checks it)."""
    return [{"index": i, "name": f"lv{i}"} for i in range(n)]


def without_index(f):
    """Delete a trace's tensor index: an edit of attributes in place (the value's own bytes left
    where they are) is seen by the HDF5 path, which these tests check; the index reads the values
    as recorded, verified by its own checksums (test_tensor_index.py)."""
    del f[schema.DS_TENSOR_INDEX]


def write_trace(path, n_ops=3, outputs=None, compression=None, meta=None, inputs=None, **kw):
    """A small trace; op i's outputs default to [full((2,3), i)]."""
    outputs = outputs or {}
    with TraceWriter(path, meta=meta or {"model": "t.py:build"}, graph_json='{"a": 1}',
                     tvmscript="# script", ops=op_table(n_ops),
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
    with TraceWriter(path, meta={}, graph_json="{}", tvmscript="", ops=op_table(len(names)),
                     inputs=dict(SAMPLES), params=dict(SAMPLES), compression=compression) as w:
        for i, name in enumerate(names):
            w.write_op(i, [SAMPLES[name], SAMPLES[name]])
    with TraceReader(path) as r:
        assert r.outline.input_names == names and r.outline.param_names == names
        for i, name in enumerate(names):
            want = SAMPLES[name]
            for got in (r.tensors.input(name), r.tensors.param(name), *r.tensors.op_outputs(i)):
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
        assert r.tensors.input_stats("x") == tensor_stats(x)
        assert r.tensors.op_stats(1) == [tensor_stats(x), tensor_stats(np.array([], np.int64))]
        assert r.tensors.param_stats("w")["absmax"] == 1.0


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
                     tvmscript="@R.function\ndef main(): ...", ops=[{"index": 0, "name": "a", "op": "relax.add"}],
                     inputs={}, params={}, compression="gzip") as w:
        w.set_meta("elapsed_s", 1.25)  # fits the reserved capacity: rewritten in place
        w.set_meta("notes", "x" * 5000)  # does not: the attribute is recreated
        with pytest.raises(TypeError):
            w.set_meta("bad", object())
        assert w.meta["elapsed_s"] == 1.25 and "bad" not in w.meta
    with TraceReader(path) as r:
        assert r.outline.graph_json == graph
        assert r.outline.tvmscript.startswith("@R.function")
        assert r.outline.ops == [{**OP_DEFAULTS, "index": 0, "name": "a", "op": "relax.add"}]
        assert r.meta == {"model": "m", "created": "now", "elapsed_s": 1.25, "notes": "x" * 5000}
        assert r.version == FORMAT_VERSION and r.complete
        assert r.recorded.finished_ops() == [] and not r.recorded.has_op(0)
        assert r.outline.input_names == [] and r.outline.param_names == []
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == FORMAT_NAME.encode()


def test_opening_reads_no_tensor(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "t.h5", n_ops=5)
    read = h5py.Dataset.__getitem__

    def texts_only(self, *a, **k):  # the op table (under /graph) may be read, no tensor
        if not self.name.startswith("/graph/"):
            raise AssertionError("a tensor was read while opening")
        return read(self, *a, **k)

    def boom(*a, **k):
        raise AssertionError("a tensor was read while opening")

    monkeypatch.setattr(h5py.Dataset, "__getitem__", texts_only)
    monkeypatch.setattr(h5py.Dataset, "read_direct", boom)
    with TraceReader(path) as r:
        assert r.complete and r.meta["model"] == "t.py:build"
        assert r.recorded.finished_ops() == [0, 1, 2, 3, 4] and r.recorded.op_note(3) == "op3"
        assert r.tensors.input_stats("x")["numel"] == 3
        assert r.tensors.tensor_bytes() == 3 * 4 + 4 * 4 + 5 * 6 * 4
        assert r.file_size == os.path.getsize(path)


# ---- writer behaviour --------------------------------------------------------------------

def test_ops_any_order_and_write_errors(tmp_path):
    path = tmp_path / "t.h5"
    with TraceWriter(path, meta={}, graph_json="{}", tvmscript="", ops=op_table(4),
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
        assert r.recorded.finished_ops() == [0, 1, 3] and not r.recorded.has_op(2) and not r.recorded.has_op(9)
        assert r.tensors.op_outputs(1) == [] and r.recorded.op_note(1) == ""
        assert [a.tolist() for a in r.tensors.op_outputs(0)] == [[0.5]]
        with pytest.raises(TraceError, match=r"op 2 has no recorded values \(the recording "
                                             r"stopped before it; record again\)"):
            r.tensors.op_outputs(2)
        with pytest.raises(TraceError, match="no input named 'nope'"):
            r.tensors.input("nope")


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
        with TraceWriter(path, meta={}, graph_json="{}", tvmscript="", ops=op_table(3),
                         inputs={}, params={}) as w:
            w.write_op(0, [np.ones(2)])
            raise RuntimeError("source crashed")
    with TraceReader(path) as r:
        assert not r.complete and r.recorded.finished_ops() == [0]
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
            assert r.tensors.tensor_bytes() == 12 + 16 + 256 * 256 * 4 + 2 * 24
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
        assert r.version == (1, 7) and r.tensors.op_outputs(2)[0][0, 0] == 2.0


def test_trace_modules_never_unpickle_or_eval():
    folder = os.path.join(ROOT, "tapml_dbg", "trace")
    for name in os.listdir(folder):
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as fh:
                src = fh.read()
            assert not re.search(r"import pickle|pickle\.|\beval\(|\bexec\(|allow_pickle", src), name


# ---- integrity: checksums -------------------------------------------------------------------

def flip(path, offset, bit=0):
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def data_offset(path, name):
    with h5py.File(path, "r") as f:
        return f[name].id.get_offset(), f[name].id.get_storage_size()


def test_every_dataset_carries_the_checksum_of_its_bytes(tmp_path):
    path = write_trace(tmp_path / "t.h5", outputs={1: [SAMPLES["bfloat16"], SAMPLES["empty_f32"]]})
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        assert "graph/op_table" in names and "ops/1/1" in names
        for name in names:
            raw = np.ascontiguousarray(f[name][()])
            assert f[name].attrs["crc32"] == zlib.crc32(raw.tobytes()), name
    assert FORMAT_VERSION == (1, 4)


def test_a_flipped_bit_in_an_op_output_names_the_op(tmp_path):
    """Before v1.2 the reader returned the corrupted value and replay judged against it silently."""
    path = write_trace(tmp_path / "t.h5", n_ops=3)
    offset, _ = data_offset(path, "ops/2/0")
    flip(path, offset + 5, bit=3)
    with TraceReader(path) as r:
        assert r.tensors.op_outputs(1)[0][0, 0] == 1.0  # the rest of the trace still reads
        with pytest.raises(TraceError, match=r"op 2's recorded output 0 is corrupt \(checksum mismatch\); "
                                             r"record the model again") as info:
            r.tensors.op_outputs(2)
        assert "\n" not in str(info.value)


def test_every_single_bit_flip_in_tensor_data_is_detected(tmp_path):
    base = write_trace(tmp_path / "base.h5", n_ops=1, inputs={"x": np.arange(4, dtype=np.float32)})
    offset, size = data_offset(base, "inputs/x")
    data = base.read_bytes()
    path = tmp_path / "flipped.h5"
    for byte in range(offset, offset + size):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[byte] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            with TraceReader(path) as r, pytest.raises(TraceError, match="input 'x' is corrupt"):
                r.tensors.input("x")


def test_a_flipped_text_is_detected(tmp_path):
    path = write_trace(tmp_path / "t.h5")
    offset, _ = data_offset(path, "graph/op_table")
    flip(path, offset + 3)  # still JSON text, only a name changes
    with TraceReader(path) as r, pytest.raises(TraceError, match=r"/graph/op_table is corrupt \(checksum mismatch"):
        r.outline.ops


def test_v1_2_needs_checksums_and_older_traces_read_without(tmp_path):
    path = write_trace(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        without_index(f)
        del f["ops/1/0"].attrs["crc32"]
    with TraceReader(path) as r, pytest.raises(TraceError, match=r"op 1's recorded output 0 is corrupt \(@crc32 is missing"):
        r.tensors.op_outputs(1)
    _set_version(path, 1, 1)  # a v1.1 trace has no checksums: read as before
    with TraceReader(path) as r:
        assert r.tensors.op_outputs(1)[0][0, 0] == 1.0


FIXTURE_OPS = [{"index": i, "name": name, "inputs": inputs} for i, (name, inputs) in
               enumerate([("lv", ["x"]), ("lv1", ["lv"]), ("lv2", ["lv1"]), ("gv", ["lv2"])])]


def consistent_trace(path):
    """A v1.2 trace whose graph (the v1.1 fixture's) matches its op table, every op recorded."""
    with TraceReader(FIXTURE_V1_1) as r:
        graph = r.outline.graph_json
    with TraceWriter(path, meta={"model": "m"}, graph_json=graph, tvmscript="", ops=FIXTURE_OPS,
                     inputs={"x": np.array([[1.0, -2.0, 0.5]], np.float32)}, params={"w": np.eye(2, dtype=np.float32)}) as w:
        for i in range(4):
            w.write_op(i, [np.full((1, 3), i, np.float32)])
    return path


def test_verify_lists_every_damaged_part(tmp_path):
    from tapml_dbg.trace.verify import verify_trace

    path = consistent_trace(tmp_path / "t.h5")
    assert verify_trace(path).ok and verify_trace(path).checksummed
    for name in ("ops/1/0", "ops/3/0", "params/w"):
        offset, _ = data_offset(path, name)
        flip(path, offset + 1)
    report = verify_trace(path)
    assert not report.ok
    assert [d.part for d in report.damaged] == ["param 'w'", "op 1", "op 3"]
    assert all("checksum mismatch" in d.message for d in report.damaged)
    missing = verify_trace(tmp_path / "absent.h5")
    assert not missing.ok and "does not exist" in missing.damaged[0].message


# ---- the boundary: what a crafted or damaged file may not do ----------------------------------

def _replace(path, name, make):
    """Replace the object `name` by `make(file, name, old_attrs)`."""
    with h5py.File(path, "r+") as f:
        attrs = dict(f[name].attrs) if name in f else {}
        del f[name]
        obj = make(f, name)
        for key, value in attrs.items():
            if isinstance(obj, h5py.Dataset):
                obj.attrs[key] = value


def test_external_links_and_external_storage_are_refused(tmp_path):
    """The old reader followed both: a "self-contained" trace read another file's values."""
    other = write_trace(tmp_path / "other.h5", outputs={1: [np.full((2, 3), 99, np.float32)]})
    path = write_trace(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        del f["ops/1/0"]
        f["ops/1/0"] = h5py.ExternalLink(str(other), "/ops/1/0")
        del f["inputs"]
        f["inputs"] = h5py.SoftLink("/params")
    with TraceReader(path) as r:
        with pytest.raises(TraceError, match="external link to another file; a trace holds its own data"):
            r.tensors.op_outputs(1)
        with pytest.raises(TraceError, match="soft link"):
            r.outline.input_names
    raw = tmp_path / "values.bin"
    np.full((2, 3), 99, np.float32).tofile(raw)
    _replace(path, "ops/2/0", lambda f, name: f.create_dataset(name, shape=(2, 3), dtype="f4",
                                                               external=[(str(raw), 0, 24)]))
    with TraceReader(path) as r, pytest.raises(TraceError, match="stored in an external file"):
        r.tensors.op_outputs(2)


def test_unknown_filters_are_refused_and_plugin_search_is_off(tmp_path):
    from h5py import h5pl

    path = write_trace(tmp_path / "t.h5")
    _replace(path, "ops/0/0", lambda f, name: f.create_dataset(name, data=np.zeros((2, 3), np.float32), chunks=True,
                                                               compression=32015, allow_unknown_filter=True))
    paths = [h5pl.get(i) for i in range(h5pl.size())]
    with TraceReader(path) as r:
        assert h5pl.size() == 0  # HDF5 has nowhere to look for a plugin while a trace is open
        with pytest.raises(TraceError, match="HDF5 filter 32015, which is not one of"):
            r.tensors.op_outputs(0)
    assert [h5pl.get(i) for i in range(h5pl.size())] == paths


def test_sizes_are_checked_before_anything_is_allocated(tmp_path):
    path = write_trace(tmp_path / "t.h5")
    _replace(path, "ops/0/0", lambda f, name: f.create_dataset(name, shape=(2**33,), dtype="f4", chunks=(2**16,)))
    with TraceReader(path) as r, pytest.raises(TraceError, match=r"declares 34359738368 bytes but stores only 0"):
        r.tensors.op_outputs(0)  # before: a 32 GiB allocation


@pytest.mark.parametrize("edit,needle", [
    (lambda f: f.create_dataset("graph/op_table", data=np.zeros(3)), "must hold UTF-8 bytes"),
    (lambda f: f.create_group("graph/op_table"), "/graph/op_table is not a dataset"),
    (lambda f: f.create_dataset("graph/op_table", data=np.array([b"ab"])), "not plain numbers"),
])
def test_a_part_of_the_wrong_kind_is_refused(tmp_path, edit, needle):
    path = write_trace(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        del f["graph/op_table"]
        edit(f)
    with TraceReader(path) as r, pytest.raises(TraceError, match=needle):
        r.outline.ops


def _write_op_table(path, text):
    with h5py.File(path, "r+") as f:
        data = np.frombuffer(text.encode(), dtype=np.uint8)
        del f["graph/op_table"]
        f.create_dataset("graph/op_table", data=data).attrs["crc32"] = np.uint32(zlib.crc32(data.tobytes()))


def _ids(cases):
    """Test ids from the expected message, not from the (possibly huge) crafted text."""
    return [f"{k}-{needle[:30]}" for k, (_, needle) in enumerate(cases)]


OP_TABLE_CASES = [
    ("[" * 100000 + "]" * 100000, "nested deeper than 64"),  # RecursionError before
    ('[[' * 40 + ']]' * 40, "nested deeper than 64"),
    ('{"index": 0}', "must be a list, not an object"),
    ('[{"index": 0}]', "op 0 has no 'name'"),
    ('[{"index": 3, "name": "a"}]', "op 0 says it is op 3"),
    ('[{"index": 0, "name": ["a"]}]', "op 0's 'name' must be a string, not a list"),
    ('[{"index": 0, "name": "a\\"; import os"}]', "not an identifier"),
    ('[{"index": 0, "name": "a", "layer": "x\\u001b[31m"}]', "not one line of text"),
    ('[{"index": 0, "name": "a", "outputs": [{"shape": [2], "dtype": "float99"}]}]', "a dtype this tapml-dbg"),
    ('[{"index": 0, "name": "a", "outputs": [{"shape": ["2"], "dtype": "float32"}]}]', "must be an integer"),
    ('[{"index": 0, "name": "a", "outputs": [null]}]', "must be an object"),
    ('[{"index": 0, "name": "a", "inputs": "b"}]', "'inputs' must be a list"),
    ('[{"index": 0, "name": "a"}, {"index": 1, "name": "a"}]', "used by an earlier op"),
    ('[{"index": 0, "name": "a"', "not valid JSON"),
]


@pytest.mark.parametrize("table,needle", OP_TABLE_CASES, ids=_ids(OP_TABLE_CASES))
def test_op_table_violations_name_the_op_and_key(tmp_path, table, needle):
    path = write_trace(tmp_path / "t.h5", n_ops=1)
    _write_op_table(path, table)
    with TraceReader(path) as r, pytest.raises(TraceError, match=re.escape(needle)) as info:
        r.outline.ops
    message = str(info.value)
    assert "\n" not in message and "the op table is corrupt" in message and "record the model again" in message


def test_op_table_keys_are_filled_and_unknown_keys_dropped(tmp_path):
    path = write_trace(tmp_path / "t.h5", n_ops=1)
    _write_op_table(path, '[{"index": 0, "name": "a", "from_a_newer_minor": {"x": 1}}]')
    with TraceReader(path) as r:
        assert r.outline.ops == [{**OP_DEFAULTS, "index": 0, "name": "a"}]


META_CASES = [
    ('{"model": 3}', "'model' must be a string"),
    ('{"versions": "1.0"}', "'versions' must be an object"),
    ('{"eager_output_max_abs_diff": "x"}', "must be a number"),
    ('{"capture": 5}', "capture must be an object"),
    ('{"capture": {"first": 0, "end": "3"}}', "'end' must be an integer"),
    ('{"capture": {"first": 0, "end": 3, "stored": [[0, 99999999999999]]}}', "run past the op table"),
    ('{"capture": {"first": 4, "end": 2}}', "before its first op"),
    ('[]', "meta must be an object"),
    ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 64"),
]


@pytest.mark.parametrize("meta,needle", META_CASES, ids=_ids(META_CASES))
def test_meta_violations_are_trace_errors(tmp_path, meta, needle):
    path = write_trace(tmp_path / "t.h5", n_ops=3)
    with h5py.File(path, "r+") as f:
        f.attrs["meta"] = schema.encode_str(meta)
    with pytest.raises(TraceError, match=re.escape(needle)):
        with TraceReader(path) as r:
            r.outline.capture


@pytest.mark.parametrize("name,value,needle", [
    ("version_major", "1", "@version_major must be an integer"),
    ("version_minor", np.int64(-1), "outside 0.."),
    ("meta", np.int32(3), "@meta must be a fixed-length string"),
    ("meta", "vlen text", "variable-length data"),
    ("format", np.array([b"tapml-trace", b"x"]), "must be a scalar"),
])
def test_header_attributes_of_the_wrong_type(tmp_path, name, value, needle):
    path = write_trace(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        del f.attrs[name]
        f.attrs[name] = value
    with pytest.raises(TraceError, match=re.escape(needle)):
        TraceReader(path)


def test_tensor_attributes_and_storage_of_the_wrong_type(tmp_path):
    path = write_trace(tmp_path / "t.h5", n_ops=3)
    with h5py.File(path, "r+") as f:
        without_index(f)
        f["ops/0/0"].attrs["dtype"] = schema.encode_str("bfloat16")
        f["ops/1/0"].attrs["stats"] = schema.encode_str('{"max": 1.0}')
        f["ops/2"].move("0", "7")
    with TraceReader(path) as r:
        with pytest.raises(TraceError, match=r"declared bfloat16 but stored as float32"):
            r.tensors.op_outputs(0)
        with pytest.raises(TraceError, match=r"op 1's recorded output 0's stats is corrupt \(stats have no 'min'"):
            r.tensors.op_stats(1)
        with pytest.raises(TraceError, match=r"op 2's outputs is corrupt \(they are named \['7'\]"):
            r.tensors.op_outputs(2)


def test_missing_op_attributes_and_objects_of_the_wrong_kind(tmp_path):
    """What the op read path (one attribute open, datasets held by their low-level id) must still refuse."""
    path = write_trace(tmp_path / "t.h5", n_ops=5)
    with h5py.File(path, "r+") as f:
        without_index(f)
        del f["ops/0/0"].attrs["dtype"]
        del f["ops/1"].attrs["done"]
        del f["ops/2/0"]
        f.create_group("ops/2/0")
        del f["ops/3"]
        f["ops/3"] = np.zeros(3, np.float32)
        f["ops/4/0"].attrs["crc32"] = np.array([1, 2], np.uint32)
    with TraceReader(path) as r:
        with pytest.raises(TraceError, match=r"op 0's recorded output 0 is corrupt \(@dtype is missing\)"):
            r.tensors.op_outputs(0)
        assert not r.recorded.has_op(1) and not r.recorded.stats_only(1)  # a missing marker: not recorded, never an error
        with pytest.raises(TraceError, match=r"op 2's recorded output 0 is corrupt \(/ops/2/0 is not a dataset\)"):
            r.tensors.op_outputs(2)
        assert not r.recorded.has_op(3)  # an op "group" that is a dataset: no marker to read
        with pytest.raises(TraceError, match=re.escape("(@crc32 must be an integer, not uint32 of shape (2,))")):
            r.tensors.op_outputs(4)
        assert r.recorded.finished_ops() == [0, 2, 4]

@pytest.mark.parametrize("edit,needle", [
    (lambda ops, inputs: ops[1].update(name="other"), r"bindings do not match the op table \(first difference at op 1"),
    (lambda ops, inputs: inputs.update(y=inputs.pop("x")), r"it reads 'x', which is neither an input nor a param"),
    (lambda ops, inputs: ops[2].update(inputs=["gv"]), r"op 2 reads 'gv', which no earlier op, input or param"),
])
def test_graph_is_checked_against_the_op_table(tmp_path, edit, needle):
    path = consistent_trace(tmp_path / "good.h5")
    with TraceReader(path) as r:
        graph = r.outline.graph()
        assert [b["name"] for b in graph["bindings"]] == ["lv", "lv1", "lv2", "gv"]
    ops = [dict(op) for op in FIXTURE_OPS]
    inputs = {"x": np.zeros((1, 3), np.float32)}
    edit(ops, inputs)
    with TraceWriter(tmp_path / "t.h5", meta={}, graph_json=json.dumps(graph), tvmscript="", ops=ops,
                     inputs=inputs, params={}):
        pass
    with TraceReader(tmp_path / "t.h5") as r, pytest.raises(TraceError, match=needle):
        r.outline.graph()


# ---- crash safety: a real SIGKILL --------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from tapml_dbg.trace import TraceWriter

    n = 5000
    order = np.random.default_rng(int(sys.argv[2])).permutation(n)  # any order, not increasing
    w = TraceWriter(sys.argv[1], meta={"model": "kill"}, graph_json="{}", tvmscript="",
                    ops=[{"index": i, "name": f"lv{i}"} for i in range(n)], inputs={"x": np.zeros(3, np.float32)},
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
        finished = r.recorded.finished_ops()
        assert set(printed) <= set(finished)
        assert len(finished) < 5000
        for i in finished:  # every op the reader calls finished round-trips, not just printed
            out = r.tensors.op_outputs(i)
            assert same_bits(out[0], np.full((i % 5 + 1, 40), i, np.float32))
            assert same_bits(out[1], np.arange(i % 37, dtype=np.int64))
            assert r.recorded.op_note(i) == f"op {i}"


# ---- frozen v1 fixture -------------------------------------------------------------------

def test_frozen_v1_fixture():
    """Reads the committed v1 file; if this fails, the reader broke v1 compatibility."""
    with TraceReader(FIXTURE) as r:
        assert r.version == (1, 0) and r.complete
        assert r.meta == {"model": "fixture.py:build", "source": "torch",
                          "created": "2025-01-01T00:00:00Z", "versions": {"tapml-dbg": "0.1.0"},
                          "elapsed_s": 0.5}
        assert r.outline.graph_json == '{"root": 1, "nodes": [{"type_key": ""}]}'
        assert r.outline.tvmscript == "# from tvm.script import relax as R\n"
        assert r.outline.ops == [{**OP_DEFAULTS, "index": 0, "name": "lv", "op": "relax.matmul", "layer": "fc"},
                         {**OP_DEFAULTS, "index": 1, "name": "lv1", "op": "relax.greater", "layer": "fc"},
                         {**OP_DEFAULTS, "index": 2, "name": "gv", "op": "relax.sum", "layer": ""}]
        assert r.outline.input_names == ["x", "mask"] and r.outline.param_names == ["w"]
        assert same_bits(r.tensors.input("x"), np.array([[1.0, -2.5], [-0.0, np.inf]], np.float32))
        assert same_bits(r.tensors.input("mask"), bits(ml_dtypes.bfloat16, [0x3FC0, 0x8000, 0x7F80, 0x7FC1]))
        assert same_bits(r.tensors.param("w"), np.array([[0.5, -1.0], [2.0, 65504.0]], np.float16))
        assert r.recorded.finished_ops() == [0, 1, 2]
        assert same_bits(r.tensors.op_outputs(0)[0], np.array([[-5.0, 2.0], [np.inf, -0.0]], np.float32))
        assert same_bits(r.tensors.op_outputs(1)[0], np.array([True, False, True]))
        out2 = r.tensors.op_outputs(2)
        assert same_bits(out2[0], np.array([7, -8], np.int64))
        assert same_bits(out2[1], np.array(3.25, np.float32))
        assert r.recorded.op_note(2) == "computed by torch"
        assert r.tensors.input_stats("mask") == {"min": -0.0, "max": 1.5, "mean": 0.75, "absmax": 1.5,
                                         "nan": 1, "inf": 1, "numel": 4,
                                         "fp16_headroom": math.log2(65504 / 1.5)}
        assert r.tensors.param_stats("w")["fp16_headroom"] == 0.0
        assert r.tensors.op_stats(2)[0] == {"min": -8.0, "max": 7.0, "mean": -0.5, "absmax": 8.0,
                                    "nan": 0, "inf": 0, "numel": 2,
                                    "fp16_headroom": math.log2(65504 / 8)}
        assert r.tensors.tensor_bytes() == 16 + 8 + 8 + 16 + 3 + 16 + 4


def test_frozen_v1_1_fixture():
    """The committed v1.1 file (capture budget, no checksums) written by the v1.1 writer still reads."""
    from tapml_dbg.trace.verify import verify_trace

    with TraceReader(FIXTURE_V1_1) as r:
        assert r.version == (1, 1) and r.complete and not r.checksummed
        assert r.outline.capture == {"window": "0:2", "max_bytes": None, "first": 0, "end": 2, "layer": None,
                             "stored": [[0, 1]], "stored_bytes": 24, "truncated": False}
        assert r.recorded.finished_ops() == [0, 1] and r.recorded.stats_only_ops() == [2, 3]
        assert [op["name"] for op in r.outline.ops] == ["lv", "lv1", "lv2", "gv"]
        assert r.outline.ops[1]["inputs"] == ["lv"] and r.outline.ops[2]["outputs"] == [{"shape": [], "dtype": "float32"}]
        assert same_bits(r.tensors.input("x"), np.array([[1.0, -2.0, 0.5]], np.float32))
        assert same_bits(r.tensors.op_outputs(0)[0], np.array([[2.0, -4.0, 1.0]], np.float32))
        assert same_bits(r.tensors.op_outputs(1)[0], np.array([[2.0, 0.0, 1.0]], np.float32))
        assert r.tensors.op_stats(3)[0]["min"] == -3.0 and r.recorded.op_note(3) == "computed by torch"
        assert [b["name"] for b in r.outline.graph()["bindings"]] == ["lv", "lv1", "lv2", "gv"]
        assert r.meta["record_seconds"] == 0.25
        with pytest.raises(TraceError, match="has only stats in this trace"):
            r.tensors.op_outputs(2)
    report = verify_trace(FIXTURE_V1_1)
    assert report.ok and not report.checksummed and report.format == "v1.1"


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
