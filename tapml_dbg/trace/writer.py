"""Streaming, crash-safe trace writer.

Crash safety (a SIGKILL at any moment leaves a readable trace with every op whose
`write_op` returned) rests on three rules, see docs/trace-format.md:

1. Everything shared is created and flushed in the constructor, including one empty
   group per op of the op table. Afterwards `write_op` only touches its own op's group,
   so an interrupted write can damage nothing but the op being written.
2. An op's `done` attribute exists from the start (0) and is overwritten in place (1)
   only after its data and metadata were flushed; then the file is flushed again.
3. Strings are fixed-length (no global heap); meta and `complete` are overwritten in place.

SWMR mode is not used: it forbids creating datasets after it is switched on, and op
output shapes are only known when the op runs.

Every dataset carries `@crc32` (v1.2), the CRC-32 of the bytes written, computed from the same
buffer HDF5 writes, so a reader can tell a damaged tensor from a recorded one.

Params given as `weight_refs` (v1.4, trace/weight_refs.py: the JSON of params that stay in the checkpoint
files they were loaded from) are not in `params`: the trace holds the reference, not a copy. An op whose
value is one of them transposed (`weight_views`: their values) is kept as that view (`/graph/weight_views`
on a clean close), not written.

On a clean close the writer stores where each uncompressed tensor lies (`/graph/tensor_index`, v1.3,
trace/tensor_index.py), so that a reader reads an op with one positioned read.

A trace recorded with a capture budget (`capture=True`, format v1.1) also pre-creates
`stats_done` (0) in every op group: `write_op_stats` stores an op's stats without its tensors
and overwrites that marker in place (1), under the same rules as `done`.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from tapml_dbg.trace import schema as S
from tapml_dbg.trace import tensor_index
from tapml_dbg.trace.stats import tensor_stats
from tapml_dbg.trace.weight_refs import view_of

COMPRESSIONS = (None, "lzf", "gzip")
META_MIN_CAPACITY = 1024  # bytes reserved for the meta JSON, so set_meta rewrites in place


def _json(obj) -> str:
    return json.dumps(obj, default=_json_default)


def _json_default(obj):
    if isinstance(obj, (np.generic, np.ndarray)):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _memory_key(value) -> tuple | None:
    """Identity of an array's memory and layout: equal keys mean the very same tensor (tied
    weights such as GPT-2's wte / lm_head), so it can be stored once and hard-linked."""
    if not isinstance(value, np.ndarray) or value.size == 0:
        return None
    return (value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str)


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ValueError(f"bad {what} name {name!r}: must be a non-empty string without '/'")
    return name


class TraceWriter:
    """Write one trace file: graph, inputs and params up front, then op outputs as they come."""

    def __init__(self, path, *, meta: dict, graph_json: str, tvmscript: str, ops: list[dict],
                 inputs: dict[str, np.ndarray], params: dict[str, np.ndarray],
                 compression: str | None = None, capture: bool = False, source_graph: str | None = None,
                 weight_refs: str | None = None, weight_views: dict[str, np.ndarray] | None = None):
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
        self.path = os.fspath(path)
        self.compression = compression
        self.capture = capture
        self._meta = dict(meta)
        self._index = tensor_index.new()  # written on a clean close
        self._ops = ops
        self._view_params = weight_views or {}  # the referenced params' own values (trace/weight_refs.py)
        self._views: dict[str, dict] = {}  # op index -> the referenced param it transposes (written on close)
        self._file = h5py.File(self.path, "w", libver=S.LIBVER)
        try:
            self._write_header(graph_json, tvmscript, ops, inputs, params)
            if source_graph is not None:  # v1.2: the FX graph as data (trace/source_graph.py)
                self._write_text(S.DS_SOURCE_GRAPH, source_graph)
            if weight_refs is not None:  # v1.4: params read from their checkpoint (trace/weight_refs.py)
                self._write_text(S.DS_WEIGHT_REFS, weight_refs)
            self._file.flush()
        except BaseException:
            self._file.close()
            raise

    # ---- setup -------------------------------------------------------------------------
    def _write_header(self, graph_json, tvmscript, ops, inputs, params) -> None:
        f = self._file
        f.attrs[S.ATTR_FORMAT] = S.encode_str(S.FORMAT_NAME)
        f.attrs[S.ATTR_VERSION_MAJOR] = np.int32(S.FORMAT_VERSION[0])
        f.attrs[S.ATTR_VERSION_MINOR] = np.int32(S.FORMAT_VERSION[1])
        f.attrs[S.ATTR_COMPLETE] = np.uint8(0)
        meta_json = _json(self._meta)
        f.attrs[S.ATTR_META] = S.encode_str(meta_json, max(META_MIN_CAPACITY, 2 * len(meta_json)))
        f.create_group(S.GROUP_GRAPH)
        self._write_text(S.DS_IR_JSON, graph_json)
        self._write_text(S.DS_TVMSCRIPT, tvmscript)
        self._write_text(S.DS_OP_TABLE, _json(list(ops)))
        written: dict[tuple, tuple] = {}  # tied tensors (same memory) are stored once
        for group_name, tensors in ((S.GROUP_INPUTS, inputs), (S.GROUP_PARAMS, params)):
            group = f.create_group(group_name, track_order=True)  # keeps positional order
            for name, value in tensors.items():
                name = _check_name(name, group_name[:-1])
                key = _memory_key(value)
                if key is not None and key in written:
                    group[name] = written[key][0]  # an HDF5 hard link: one dataset, two names
                    self._indexed(group_name, name, written[key][1])
                    continue
                found = self._write_tensor(group, name, value)
                self._indexed(group_name, name, found)
                if key is not None:
                    written[key] = (group[name], found)
        ops_group = f.create_group(S.GROUP_OPS)
        for index in range(len(ops)):
            self._new_op_group(ops_group, index, self.capture)

    def _write_text(self, path: str, text: str) -> None:
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        ds = self._file.create_dataset(path, data=data, **self._layout(data))
        ds.attrs[S.ATTR_CHECKSUM] = np.uint32(S.checksum(data))

    def _layout(self, data: np.ndarray) -> dict:
        if self.compression is None or data.ndim == 0 or data.size == 0:
            return {}
        return {"compression": self.compression, "chunks": True}

    def _write_tensor(self, group: h5py.Group, name: str, value, normalized=None) -> list | None:
        """Write one tensor; its tensor-index entry (None: not one contiguous run of bytes)."""
        arr = normalized if normalized is not None else S.normalized(value)
        data, dtype_name = S.storage_view(arr)
        ds = group.create_dataset(name, data=data, **self._layout(data))
        crc = S.checksum(data)
        ds.attrs[S.ATTR_DTYPE] = S.encode_str(dtype_name)
        ds.attrs[S.ATTR_STATS] = S.encode_str(_json(tensor_stats(arr)))
        ds.attrs[S.ATTR_CHECKSUM] = np.uint32(crc)
        return tensor_index.entry(ds, data, dtype_name, crc)

    def _indexed(self, kind: str, name: str, item: list | None) -> None:
        if item is not None:
            self._index[kind][name] = item

    @staticmethod
    def _new_op_group(ops_group: h5py.Group, index: int, capture: bool = False) -> None:
        group = ops_group.create_group(str(index))
        group.attrs[S.ATTR_DONE] = np.uint8(0)  # overwritten in place by write_op
        if capture:
            group.attrs[S.ATTR_STATS_DONE] = np.uint8(0)  # overwritten in place by write_op_stats

    # ---- streaming ---------------------------------------------------------------------
    def write_op(self, index: int, outputs: list[np.ndarray], *, note: str = "") -> None:
        """Store op `index`'s outputs as /ops/<index>/<k>; the op counts only once this returns.

        `index` must be in the op table: creating an op group now would modify the shared
        /ops group, which a kill could corrupt (seen in kill tests: the reader then segfaulted).
        """
        group = self._unwritten_group(index)
        view = view_of(self._ops[int(index)], outputs, self._view_params) if self._view_params else None
        if view is not None:  # a referenced weight transposed: kept as that view (`done` stays 0 for older readers)
            group.attrs[S.ATTR_NOTE] = S.encode_str(note)
            self._views[str(int(index))] = view
            return
        # convert everything first so a bad dtype fails before anything is written
        arrays = [S.normalized(value) for value in outputs]
        for name in list(group):  # leftovers of an earlier write_op that raised
            del group[name]
        items = [self._write_tensor(group, str(k), value, arr) for k, (value, arr) in enumerate(zip(outputs, arrays))]
        group.attrs[S.ATTR_NOTE] = S.encode_str(note)
        self._file.flush()
        group.attrs.modify(S.ATTR_DONE, np.uint8(1))  # in place: one header chunk rewrite
        self._file.flush()
        if items and all(item is not None for item in items):
            self._index["ops"][str(int(index))] = items

    def write_op_stats(self, index: int, outputs: list[np.ndarray], *, note: str = "") -> None:
        """Store only the stats of op `index`'s outputs (a capture budget left its tensors out).

        The op then has stats but no values: `done` stays 0 (so a v1.0 reader sees an op that
        was not recorded) and `stats_done` becomes 1. Needs a writer made with `capture=True`.
        """
        group = self._unwritten_group(index)
        if S.ATTR_STATS_DONE not in group.attrs:
            raise ValueError("write_op_stats needs a writer made with capture=True")
        stats = [tensor_stats(S.normalized(value)) for value in outputs]
        group.attrs[S.ATTR_OP_STATS] = S.encode_str(_json(stats))
        group.attrs[S.ATTR_NOTE] = S.encode_str(note)
        self._file.flush()
        group.attrs.modify(S.ATTR_STATS_DONE, np.uint8(1))
        self._file.flush()

    def _unwritten_group(self, index: int) -> h5py.Group:
        index = int(index)
        group = self._open_file()[S.GROUP_OPS].get(str(index))
        if group is None:
            raise ValueError(f"op {index} is not in the op table given to the writer "
                             f"(it has {len(self._file[S.GROUP_OPS])} ops)")
        if group.attrs[S.ATTR_DONE] or group.attrs.get(S.ATTR_STATS_DONE, 0):
            raise ValueError(f"op {index} was already written to {self.path}")
        return group

    def set_meta(self, key: str, value) -> None:
        """Update one meta entry; rewritten in place while it fits the reserved capacity."""
        f = self._open_file()
        meta_json = _json({**self._meta, key: value})  # a non-JSON value changes nothing
        self._meta[key] = value
        capacity = f.attrs.get_id(S.ATTR_META).dtype.itemsize
        if len(meta_json.encode("utf-8")) <= capacity:
            f.attrs.modify(S.ATTR_META, S.encode_str(meta_json, capacity))
        else:
            f.attrs[S.ATTR_META] = S.encode_str(meta_json, 2 * len(meta_json))
        f.flush()

    @property
    def meta(self) -> dict:
        return dict(self._meta)

    def close(self, complete: bool = True) -> None:
        """Close the file; `complete=True` marks the trace as holding every op."""
        if self._file is None:
            return
        try:
            if complete:
                self._write_text(S.DS_TENSOR_INDEX, json.dumps(self._index, separators=(",", ":")))
                if self._views:
                    self._write_text(S.DS_WEIGHT_VIEWS, json.dumps(self._views, separators=(",", ":")))
                self._file.flush()
                self._file.attrs.modify(S.ATTR_COMPLETE, np.uint8(1))
        finally:
            self._file.close()
            self._file = None

    def _open_file(self) -> h5py.File:
        if self._file is None:
            raise ValueError(f"trace writer for {self.path} is closed")
        return self._file

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)
