"""The tensor index (v1.3): reads through it equal the HDF5 path's bit for bit, and an index that is
missing, damaged, crafted or stale never returns a wrong value, never crashes, never allocates what
the file cannot hold."""

import json

import h5py
import ml_dtypes
import numpy as np
import pytest

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import TraceReader, TraceWriter, h5safe
from tapml_dbg.trace import schema as S

OUTPUTS = {
    0: [np.arange(6, dtype=np.float32).reshape(2, 3)],
    1: [np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16), np.array([[True, False]])],
    2: [np.array(-0.0, dtype=np.float16), np.arange(4, dtype=np.int64)],
    3: [np.zeros((0, 3), np.float32)],  # empty: no bytes to index, read through HDF5
}


def write(path, compression=None, complete=True):
    weight = np.eye(3, dtype=np.float32)
    writer = TraceWriter(path, meta={"model": "m"}, graph_json="{}", tvmscript="", compression=compression,
                         ops=[{"index": i, "name": f"lv{i}"} for i in range(len(OUTPUTS))],
                         inputs={"x": np.ones((1, 3), np.float32)}, params={"w": weight, "tied": weight})
    for index, values in OUTPUTS.items():
        writer.write_op(index, values)
    writer.close(complete=complete)
    return path


def index_of(path) -> dict:
    with h5py.File(path, "r") as f:
        return json.loads(f[S.DS_TENSOR_INDEX][()].tobytes())


def set_index(path, index) -> None:
    """Replace the index with `index` (any JSON), its checksum made to match: a crafted index."""
    data = np.frombuffer(json.dumps(index).encode(), np.uint8)
    with h5py.File(path, "r+") as f:
        del f[S.DS_TENSOR_INDEX]
        f[S.DS_TENSOR_INDEX] = data
        f[S.DS_TENSOR_INDEX].attrs[S.ATTR_CHECKSUM] = np.uint32(S.checksum(data))


def everything(reader):
    return ([reader.tensors.input("x"), reader.tensors.param("w"), reader.tensors.param("tied")]
            + [value for index in OUTPUTS for value in reader.tensors.op_outputs(index)])


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def hdf5_values(path):
    with h5py.File(path, "r+") as f:
        del f[S.DS_TENSOR_INDEX]
    with TraceReader(path) as reader:
        return everything(reader)


def test_a_finished_trace_is_read_through_its_index_bit_for_bit(tmp_path, monkeypatch):
    path = write(tmp_path / "t.h5")
    index = index_of(path)
    assert set(index["ops"]) == {"0", "1", "2"} and set(index["params"]) == {"w", "tied"}  # op 3 is empty
    assert index["params"]["w"][0] == index["params"]["tied"][0]  # a tied tensor: one dataset, one offset
    with TraceReader(path) as reader:
        read_ahead = [reader.tensors.op_outputs(index) for index in (0, 1, 2)] + [reader.tensors.input("x"), reader.tensors.param("w")]
        monkeypatch.setattr(h5safe, "read_array", lambda *a, **k: pytest.fail("read through HDF5"))
        assert [reader.recorded.has_op(i) for i in range(4)] == [True] * 4
        assert reader.tensors.op_outputs(1)[0].dtype == ml_dtypes.bfloat16 and reader.tensors.op_outputs(1)[1].dtype == np.bool_
        assert read_ahead
    monkeypatch.undo()
    with TraceReader(path) as reader:
        through_index = everything(reader)
    expected = hdf5_values(path)
    assert all(same(a, b) for a, b in zip(through_index, expected)) and len(through_index) == len(expected)
    assert same(through_index[3], OUTPUTS[0][0])


@pytest.mark.parametrize("how", ["incomplete", "lzf"])
def test_no_index_where_the_bytes_are_not_one_run_or_the_recording_stopped(tmp_path, how):
    path = write(tmp_path / "t.h5", compression="lzf" if how == "lzf" else None, complete=how != "incomplete")
    with h5py.File(path, "r") as f:
        if how == "incomplete":
            assert S.DS_TENSOR_INDEX not in f
        else:
            assert json.loads(f[S.DS_TENSOR_INDEX][()].tobytes())["ops"] == {}
    with TraceReader(path) as reader:
        assert same(reader.tensors.op_outputs(0)[0], OUTPUTS[0][0]) and reader.recorded.has_op(2)


def test_a_flipped_bit_in_an_indexed_value_is_the_op_s_checksum_error(tmp_path):
    path = write(tmp_path / "t.h5")
    offset = index_of(path)["ops"]["0"][0][0]
    with open(path, "r+b") as f:
        f.seek(offset + 5)
        byte = f.read(1)
        f.seek(offset + 5)
        f.write(bytes([byte[0] ^ 0x10]))
    with TraceReader(path) as reader:
        with pytest.raises(TraceError, match=r"op 0's recorded output 0 is corrupt \(checksum mismatch\)"):
            reader.tensors.op_outputs(0)
        assert same(reader.tensors.op_outputs(2)[1], OUTPUTS[2][1])  # the others still read (through HDF5 now)


def crafted_entries(entry, file_size):
    offset, stored, shape, crc, dtype = entry
    return {
        "past the end": [file_size - 4, stored, shape, crc, dtype],
        "huge shape": [offset, stored, [2**40, 2**20], crc, dtype],
        "negative offset": [-8, stored, shape, crc, dtype],
        "object dtype": [offset, "|O", shape, crc, dtype],
        "another dtype": [offset, "<i4", shape, crc, dtype],
        "another dtype, its name too": [offset, "<i4", shape, crc, "int32"],
        "unknown dtype name": [offset, stored, shape, crc, "float128"],
        "wrong checksum": [offset, stored, shape, (crc + 1) % 2**32, dtype],
        "other shape": [offset, stored, [3, 2], crc, dtype],
        "not a list": {"offset": offset},
        "too short": [offset, stored],
        "bool offset": [True, stored, shape, crc, dtype],
    }


@pytest.mark.parametrize("case", sorted(crafted_entries([0, "<f4", [2, 3], 0, "float32"], 0)))
def test_a_crafted_entry_is_never_trusted(tmp_path, case):
    path = write(tmp_path / "t.h5")
    index = index_of(path)
    index["ops"]["0"] = [crafted_entries(index["ops"]["0"][0], (tmp_path / "t.h5").stat().st_size)[case]]
    index["params"]["w"] = index["ops"]["0"][0]
    set_index(path, index)
    with TraceReader(path) as reader:
        assert same(reader.tensors.op_outputs(0)[0], OUTPUTS[0][0]) and same(reader.tensors.param("w"), np.eye(3, dtype=np.float32))
        assert reader.recorded.has_op(0) and same(reader.tensors.op_outputs(2)[1], OUTPUTS[2][1])


@pytest.mark.parametrize("index", [[], {"ops": []}, {"ops": {}, "inputs": {}}, "text", None,
                                   {"ops": {"0": "x", "99": [[0, "<f4", [1], 0, "float32"]]}, "inputs": {}, "params": {}}])
def test_an_index_of_the_wrong_outline_reads_through_hdf5(tmp_path, index):
    path = write(tmp_path / "t.h5")
    set_index(path, index)
    with TraceReader(path) as reader:
        assert same(reader.tensors.op_outputs(0)[0], OUTPUTS[0][0]) and not reader.recorded.has_op(99)


def test_a_damaged_index_reads_through_hdf5(tmp_path):
    path = write(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        f[S.DS_TENSOR_INDEX].attrs[S.ATTR_CHECKSUM] = np.uint32(0)
    with TraceReader(path) as reader:
        assert same(reader.tensors.op_outputs(0)[0], OUTPUTS[0][0])


def test_a_value_replaced_after_the_recording_is_read_as_it_is_now(tmp_path):
    """The old bytes are still in the file, with their checksum: the index must not read them."""
    path = write(tmp_path / "t.h5")
    new = np.full((2, 3), 7, np.float32)
    with h5py.File(path, "r+") as f:
        del f["ops/0/0"]
        f["ops/0/0"] = new
        f["ops/0/0"].attrs[S.ATTR_DTYPE] = S.encode_str("float32")
        f["ops/0/0"].attrs[S.ATTR_CHECKSUM] = np.uint32(S.checksum(new))
        del f["params/w"]
        f["params/w"] = np.zeros((3, 3), np.float32)
        f["params/w"].attrs[S.ATTR_DTYPE] = S.encode_str("float32")
        f["params/w"].attrs[S.ATTR_CHECKSUM] = np.uint32(S.checksum(np.zeros((3, 3), np.float32)))
    with TraceReader(path) as reader:
        assert same(reader.tensors.op_outputs(0)[0], new) and not reader.tensors.param("w").any()
        assert same(reader.tensors.param("tied"), np.eye(3, dtype=np.float32))


def test_without_a_vectored_positioned_read_the_index_reads_the_same(tmp_path, monkeypatch):
    path = write(tmp_path / "t.h5")
    with TraceReader(path) as reader:
        expected = everything(reader)
    monkeypatch.delattr("os.preadv")
    with TraceReader(path) as reader:
        assert reader.recorded.has_op(0)  # the op table and the index are texts, read through HDF5 first
        monkeypatch.setattr(h5safe, "read_array", lambda *a, **k: pytest.fail("read through HDF5"))
        assert all(same(a, b) for a, b in zip([reader.tensors.op_outputs(i)[k] for i in (0, 1, 2) for k in range(len(OUTPUTS[i]))],
                                               expected[3:]))
