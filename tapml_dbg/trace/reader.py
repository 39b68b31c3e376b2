"""Lazy trace reader: opening reads root attributes only; tensors load on request.

The reader is the trace boundary. A trace is untrusted input (a file passed around, attached to
bug reports, kept for months, possibly damaged or crafted): everything it returns was checked
first, by `h5safe` (links, attributes, dataset storage, sizes; HDF5's plugin search off) and by
`validate` (every JSON part against the schema), and every tensor and text is verified against
its checksum (v1.2). A finished v1.3 trace's tensor index (trace/tensor_index.py) reads a tensor
with one positioned read, its bytes verified the same way. Any violation, and any exception h5py or
the JSON parser raises on the way, becomes a `TraceError` that names the part and says what to do.

Data only: strings are decoded and JSON-parsed, tensors are plain numeric arrays; nothing read
from the file is ever unpickled, evaluated or imported.
"""

from __future__ import annotations

import os
import re

import h5py
import numpy as np
from h5py import h5o

from tapml_dbg.errors import TraceError
from tapml_dbg.model.serialize import GraphFormatError, check_graph
from tapml_dbg.trace import h5safe
from tapml_dbg.trace import schema as S
from tapml_dbg.trace import tensor_index
from tapml_dbg.trace import validate as V
from tapml_dbg.trace import weight_refs as W
from tapml_dbg.trace.capture import missing_values_message
from tapml_dbg.trace.h5safe import FILE_ERRORS
from tapml_dbg.trace.stats import tensor_stats
from tapml_dbg.trace.validate import SchemaError

RECORD_AGAIN = "record the model again with `tapml-dbg record`"
HEADER_PART = "the trace header"
_INDEX_NAME = re.compile(r"0|[1-9][0-9]*")  # an op group's name: a canonical ASCII index


class TraceReader:
    """Read a trace written by `TraceWriter` (any v1.x)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = None
        self._ops = None
        self._verified: set[str] = set()  # datasets whose checksum already matched in this reader
        self._groups: dict[str, h5py.Group] = {}  # top-level groups, checked once (the file is read-only)
        self._op_groups: dict[int, h5py.Group] = {}  # op index -> its group, checked once
        self._op_markers: dict[tuple[int, str], bool] = {}
        self._index: dict | None = None  # the tensor index, loaded on the first tensor read ({}: none to use)
        self._fd: int | None = None  # the file opened for the index's positioned reads
        self._fileno: int | None = None
        self._indexed_verified: set[int] = set()  # offsets whose bytes matched their entry's checksum
        self._indexed_ops: dict[int, list | None] = {}  # op index -> its entries, found in place (None: none)
        self._weights: W.WeightRefs | None | bool = False  # v1.4's referenced params (False: not loaded yet)
        self._weight_stats: dict[str, dict] = {}
        self._views: dict[int, tuple] | None = None  # v1.4: ops whose value is a referenced param transposed
        self._viewed_params: set[str] | None = None  # v1.4: the referenced params those ops are views of
        h5safe.plugin_search.acquire()
        self._plugins_off = True
        try:
            self._file = _open(self.path)
            self.file_size = os.path.getsize(self.path)
            self._guard(HEADER_PART, self._read_header)
        except BaseException:
            self.close()
            raise

    def _read_header(self) -> None:
        root = self._file
        fmt = h5safe.attr_str(root, S.ATTR_FORMAT, HEADER_PART, self.file_size, default="")
        if fmt != S.FORMAT_NAME:
            raise TraceError(f"{self.path} is an HDF5 file but not a tapml trace; "
                             f"pass a file written by `tapml-dbg record`")
        major = h5safe.attr_int(root, S.ATTR_VERSION_MAJOR, HEADER_PART, high=2**31 - 1)
        minor = h5safe.attr_int(root, S.ATTR_VERSION_MINOR, HEADER_PART, high=2**31 - 1)
        self.version = (major, minor)
        reads = S.FORMAT_VERSION[0]
        if major > reads:
            raise TraceError(f"trace format v{major}.{minor} is newer than this tapml-dbg "
                             f"(reads v{reads}); upgrade tapml-dbg")
        if major < reads:
            raise TraceError(f"trace format v{major}.{minor} is older than this tapml-dbg "
                             f"supports (reads v{reads}); {RECORD_AGAIN}")
        self.checksummed = self.version >= S.CHECKSUM_SINCE
        self.complete = bool(h5safe.attr_int(root, S.ATTR_COMPLETE, HEADER_PART, default=0, high=1))
        meta_text = h5safe.attr_str(root, S.ATTR_META, V.META_PART, self.file_size)
        self.meta = V.validate_meta(V.parse_json(meta_text, V.META_PART))

    # ---- graph -------------------------------------------------------------------------
    @property
    def graph_json(self) -> str:
        """The stored graph as text (model/serialize's data-only JSON); `graph()` parses and checks it."""
        return self._text(S.DS_IR_JSON)

    def graph(self) -> dict:
        """The graph as a checked dict: valid JSON of bounded depth in model/serialize's format,
        whose bindings are the op table's ops and whose params the trace's inputs and params."""
        def load():
            data = V.parse_json(self.graph_json, V.GRAPH_PART)
            try:
                check_graph(data)
            except GraphFormatError as exc:
                raise SchemaError(V.GRAPH_PART, str(exc)) from None
            V.check_graph_matches(data, self.ops, set(self.input_names) | set(self.param_names))
            return data
        return self._guard(V.GRAPH_PART, load)

    @property
    def source_graph_json(self) -> str | None:
        """The source graph as text (v1.2, torch sources; trace/source_graph.py parses it), None without one."""
        present = self._guard(f"/{S.DS_SOURCE_GRAPH}", lambda: S.DS_SOURCE_GRAPH.rsplit("/", 1)[1] in self._group(S.GROUP_GRAPH))
        return self._text(S.DS_SOURCE_GRAPH) if present else None

    def text_names(self) -> list[str]:
        """The texts under /graph: the graph, its TVMScript, the op table (and what a newer minor adds)."""
        return self._guard(f"/{S.GROUP_GRAPH}", lambda: list(self._group(S.GROUP_GRAPH)))

    def text(self, name: str) -> str:
        """One text under /graph by name, checked and verified."""
        return self._text(f"{S.GROUP_GRAPH}/{name}")

    @property
    def tvmscript(self) -> str:
        """Human-readable TVMScript; for display only, never to be parsed or executed."""
        return self._text(S.DS_TVMSCRIPT)

    @property
    def ops(self) -> list[dict]:
        """The op table, checked (`validate.validate_op_table`; cached, do not mutate)."""
        if self._ops is None:
            def load():
                ops = V.validate_op_table(V.parse_json(self._text(S.DS_OP_TABLE), V.OP_TABLE_PART))
                V.check_capture_ops(self.meta.get(S.META_CAPTURE), len(ops))
                return ops
            self._ops = self._guard(V.OP_TABLE_PART, load)
        return self._ops

    def _text(self, path: str) -> str:
        """A UTF-8 text dataset such as "graph/op_table", checked and verified."""
        part = f"/{path}"

        def load():
            ds = self._dataset(path, part)
            shape = h5safe.check_storage(ds, part, self.file_size)
            if ds.id.dtype != np.uint8 or len(shape) != 1:
                raise SchemaError(part, f"it must hold UTF-8 bytes (uint8[n]), not {ds.id.dtype}{list(shape)}")
            data = self._verified_array(ds, part)
            try:
                return data.tobytes().decode("utf-8")
            except UnicodeDecodeError:
                raise SchemaError(part, "it is not UTF-8 text") from None
        return self._guard(part, load)

    # ---- inputs and params ---------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return self._guard(f"/{S.GROUP_INPUTS}", lambda: list(self._group(S.GROUP_INPUTS)))

    @property
    def param_names(self) -> list[str]:
        """Every param: those stored under /params, then those read from checkpoint files (v1.4)."""
        stored = self._guard(f"/{S.GROUP_PARAMS}", lambda: list(self._group(S.GROUP_PARAMS)))
        weights = self.weight_refs
        return stored if weights is None else stored + [name for name in weights.params if name not in stored]

    def input(self, name: str) -> np.ndarray:
        found = self._indexed(S.GROUP_INPUTS, name)
        return found[0] if found is not None else self._tensor(self._named(S.GROUP_INPUTS, name), f"input {name!r}")

    def param(self, name: str) -> np.ndarray:
        weights = self.weight_refs
        if weights is not None and name in weights.params:  # v1.4: read from its checkpoint, CRC-32 checked
            return weights.read(name, keep=name in self._viewed())
        found = self._indexed(S.GROUP_PARAMS, name)
        return found[0] if found is not None else self._tensor(self._named(S.GROUP_PARAMS, name), f"param {name!r}")

    def input_stats(self, name: str) -> dict:
        return self._stats(self._named(S.GROUP_INPUTS, name), f"input {name!r}")

    def param_stats(self, name: str) -> dict:
        weights = self.weight_refs
        if weights is not None and name in weights.params:  # computed when asked: recording stays fast
            if name not in self._weight_stats:
                self._weight_stats[name] = tensor_stats(weights.read(name))
            return self._weight_stats[name]
        return self._stats(self._named(S.GROUP_PARAMS, name), f"param {name!r}")

    @property
    def weight_refs(self) -> W.WeightRefs | None:
        """The params this trace reads from checkpoint files (v1.4, trace/weight_refs.py); None when it
        stores every param itself. Opening the trace never opens those files."""
        if self._weights is False:
            present = self.version >= S.WEIGHT_REFS_SINCE and self._guard(
                f"/{S.GROUP_GRAPH}", lambda: S.DS_WEIGHT_REFS.rsplit("/", 1)[1] in self._group(S.GROUP_GRAPH))
            part = f"/{S.DS_WEIGHT_REFS}"
            self._weights = W.WeightRefs(*self._guard(part, lambda: W.parse_refs(
                V.parse_json(self._text(S.DS_WEIGHT_REFS), part), f"{self.path}: {part}"))) if present else None
        return self._weights

    def weight_views(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        """Ops whose value is a referenced param transposed (v1.4, a complete trace): {index: (param, axes)}."""
        if self._views is None:
            self._views = {}
            weights = self.weight_refs
            present = weights is not None and self.complete and self._guard(
                f"/{S.GROUP_GRAPH}", lambda: S.DS_WEIGHT_VIEWS.rsplit("/", 1)[1] in self._group(S.GROUP_GRAPH))
            if present:
                part = f"/{S.DS_WEIGHT_VIEWS}"
                self._views = self._guard(part, lambda: W.parse_views(
                    V.parse_json(self._text(S.DS_WEIGHT_VIEWS), part), len(self.ops), weights.params,
                    f"{self.path}: {part}"))
        return self._views

    def _viewed(self) -> set[str]:
        """The referenced params some op's value is a view of: those the reader keeps once read."""
        if self._viewed_params is None:
            self._viewed_params = {param for param, _axes in self.weight_views().values()}
        return self._viewed_params

    def require_weights(self) -> None:
        """Raise the one-line error of a referenced checkpoint file that is missing or changed size (a
        replay needs them; `info` only lists them)."""
        if self.weight_refs is not None:
            self.weight_refs.require()

    def _named(self, group: str, name: str) -> h5safe.DatasetRef:
        kind = group[:-1]

        def load():
            folder = self._group(group)
            if not isinstance(name, str) or name not in folder:
                known = ", ".join(folder) or "none"
                raise TraceError(f"no {kind} named {name!r} in the trace (known: {known})")
            return h5safe.child(folder, name, h5py.Dataset, f"{kind} {name!r}")
        return self._guard(f"{kind} {name!r}", load)

    # ---- ops ---------------------------------------------------------------------------
    def has_op(self, index: int) -> bool:
        """True only when op `index`'s outputs were completely written (its `done` marker, or its
        entry in the tensor index, written after every marker, its datasets where it says)."""
        if isinstance(index, (int, np.integer)) and (self._indexed_op(int(index)) is not None
                                                     or int(index) in self.weight_views()):
            return True
        return self._marker_of(index, S.ATTR_DONE)

    def _marker_of(self, index: int, name: str) -> bool:
        """An op group's marker (`done`, `stats_done`), each read once and only when asked (a search
        asks for `done` of every op it runs); False where absent or unreadable (the group of an op a
        killed recorder was writing), never an error."""
        index = int(index)
        if not 0 <= index < len(self.ops):  # a damaged op table is an error, not "nothing recorded"
            return False
        if (index, name) not in self._op_markers:
            self._op_markers[(index, name)] = self._marker(index, name)
        return self._op_markers[(index, name)]

    def _marker(self, index: int, name: str) -> bool:
        try:
            group = self._op_group_or_none(index)
            return group is not None and h5safe.attr_int(group, name, f"op {index}", default=0, high=1) == 1
        except (TraceError, SchemaError, *FILE_ERRORS):
            return False

    def _op_group_or_none(self, index: int) -> h5py.Group | None:
        if not 0 <= index < len(self.ops):
            return None
        if index not in self._op_groups:  # asked for its markers, its note and its outputs: looked up once
            group = h5safe.child(self._group(S.GROUP_OPS), str(index), h5py.Group, f"op {index}", missing_ok=True)
            if group is None:
                return None  # (not kept: a recorder still writing may add it)
            self._op_groups[index] = group
        return self._op_groups[index]

    def op_group_names(self) -> list[str]:
        """Names under /ops (each should be an op index of the op table)."""
        return self._guard(f"/{S.GROUP_OPS}", lambda: list(self._group(S.GROUP_OPS)))

    def _op_indices(self) -> list[int]:
        count = len(self.ops)
        names = self.op_group_names()
        return sorted(int(n) for n in names if _INDEX_NAME.fullmatch(n) and int(n) < count)

    def finished_ops(self) -> list[int]:
        """Ops of the op table whose values (tensors) are in the trace."""
        return [i for i in self._op_indices() if self.has_op(i)]

    def has_stats(self, index: int) -> bool:
        """True when op `index`'s stats are in the trace (with its tensors, or alone: v1.1)."""
        return self.has_op(index) or self.stats_only(index)

    def stats_only(self, index: int) -> bool:
        """True when a capture budget kept op `index`'s stats but not its tensors (v1.1)."""
        return not self.has_op(index) and self._marker_of(index, S.ATTR_STATS_DONE)

    def stats_only_ops(self) -> list[int]:
        if self.capture is None:
            return []
        return [i for i in self._op_indices() if self.stats_only(i)]

    @property
    def capture(self) -> dict | None:
        """The capture budget the trace was recorded with (meta `capture`, checked against the op
        table), None for a full trace."""
        if self.meta.get(S.META_CAPTURE) is None:
            return None
        _ = self.ops  # loading the op table checks the capture's ranges against it
        return self.meta[S.META_CAPTURE]

    def missing_values_message(self, index: int, needed_by: int | None = None) -> str:
        """Why op `index` has no values here and how to get them (one line, for errors and verdicts)."""
        index = int(index)
        if self.stats_only(index) or (self.capture is not None and self.complete):
            return missing_values_message(self.ops, self.meta, index, needed_by)
        name = self.ops[index]["name"] if 0 <= index < len(self.ops) else "?"
        return f"op {index} ({name}) has no recorded values (the recording stopped before it; record again)"

    def op_outputs(self, index: int) -> list[np.ndarray]:
        view = self.weight_views().get(int(index))
        if view is not None:  # v1.4: a referenced param transposed, made from the checkpoint's tensor
            return [self.weight_refs.transposed(view[0], view[1])]
        items = self._indexed_op(int(index))
        found = self._read_indexed(items) if items is not None else None
        if found is not None:
            return found
        return [self._tensor(ds, _output_part(index, k)) for k, ds in enumerate(self._op_datasets(index))]

    # ---- the tensor index (v1.3) ---------------------------------------------------------
    def _tensor_index(self) -> dict:
        """The trace's tensor index; an empty one where there is none or it cannot be used (the
        HDF5 path then reads everything, as for older traces)."""
        if self._index is None:
            self._index = tensor_index.new()
            if self.version >= S.TENSOR_INDEX_SINCE and self.complete:
                part = S.DS_TENSOR_INDEX
                try:  # missing or damaged: the values themselves may be fine
                    self._index = self._guard(part, lambda: tensor_index.usable(V.parse_json(self._text(part), part)))
                except TraceError:
                    pass
        return self._index

    def _indexed_op(self, index: int) -> list | None:
        """Op `index`'s entries in the tensor index, once its datasets are found where they say (one
        lookup each, once per reader: an op replaced, moved or deleted since the recording is read
        through HDF5); None where the op has no usable entry."""
        if index in self._indexed_ops:
            return self._indexed_ops[index]
        items = self._tensor_index()["ops"].get(str(index)) if 0 <= index < len(self.ops) else None
        if not (isinstance(items, list) and items and all(self._in_place(S.GROUP_OPS, f"{index}/{k}", item)
                                                           for k, item in enumerate(items))):
            items = None
        self._indexed_ops[index] = items
        return items

    def _indexed(self, group: str, name: str) -> list[np.ndarray] | None:
        """An input or param through the tensor index (None: read it through HDF5)."""
        item = self._tensor_index()[group].get(name) if isinstance(name, str) else None
        return self._read_indexed([item]) if item is not None and self._in_place(group, name, item) else None

    def _in_place(self, group: str, path: str, item) -> bool:
        """Whether the dataset at `path` under `group` is where the entry says (`tensor_index.in_place`)."""
        try:
            return tensor_index.in_place(h5o.open(self._group(group).id, path.encode()), item, self._file_number())
        except (TraceError, ValueError, *FILE_ERRORS):  # (not there, not a dataset: read through HDF5)
            return False

    def _file_number(self) -> int:
        """HDF5's number of this open file (an object opened through an external link has another)."""
        if self._fileno is None:
            self._fileno = h5o.get_info(self._open_file().id).fileno
        return self._fileno

    def _read_indexed(self, items: list) -> list[np.ndarray] | None:
        """The tensors of index entries (in place), each verified against its checksum; None when
        one fails a check (the index is then set aside for good: the file is not as recorded)."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            arrays = [tensor_index.read(self._fd, item, self.file_size, self._indexed_verified) for item in items]
        except OSError:
            arrays = [None]
        if any(array is None for array in arrays):
            self._index = tensor_index.new()
            self._indexed_ops.clear()
            return None
        return arrays

    def op_stats(self, index: int) -> list[dict]:
        if int(index) in self.weight_views():
            return [tensor_stats(value) for value in self.op_outputs(index)]
        if not self.has_op(index) and self.stats_only(index):
            part = f"op {index}'s stats"

            def load():
                group = self._op_group_or_none(int(index))
                text = h5safe.attr_str(group, S.ATTR_OP_STATS, part, self.file_size)
                return V.validate_stats_list(V.parse_json(text, part), part)
            return self._guard(part, load)
        return [self._stats(ds, _output_part(index, k)) for k, ds in enumerate(self._op_datasets(index))]

    def op_note(self, index: int) -> str:
        group = self._op_group(index, stats_ok=True)
        part = f"op {index}'s note"
        return self._guard(part, lambda: h5safe.attr_str(group, S.ATTR_NOTE, part, self.file_size, default=""))

    def _op_group(self, index: int, stats_ok: bool = False) -> h5py.Group:
        if not self.has_op(index) and not (stats_ok and self.stats_only(index)):
            if self.stats_only(index):
                raise TraceError(self.missing_values_message(index))
            raise TraceError(f"op {index} has no recorded values "
                             f"(the recording stopped before it; record again)")
        return self._guard(f"op {index}", lambda: self._op_group_or_none(int(index)))

    def _op_datasets(self, index: int) -> list[h5safe.DatasetRef]:
        group = self._op_group(index)
        part = f"op {index}'s outputs"

        def load():
            count = group.id.get_num_objs()  # named 0..count-1: each of those there, and no other
            found = [h5safe.child(group, str(k), h5py.Dataset, _output_part(index, k), missing_ok=True)
                     for k in range(count)]
            if any(ds is None for ds in found):
                names = list(group)
                raise SchemaError(part, f"they are named {sorted(names)[:8]}, not 0..{len(names) - 1}")
            return found
        return self._guard(part, load)

    # ---- tensors -----------------------------------------------------------------------
    def _tensor(self, ds: h5safe.DatasetRef, part: str) -> np.ndarray:
        def load():
            dtype = h5safe.attr_str(ds, S.ATTR_DTYPE, part, self.file_size)
            V.validate_dtype(dtype, part, "@dtype")
            want = S.storage_dtype(dtype)
            stored = ds.id.dtype
            if stored.newbyteorder("=") != want:
                raise SchemaError(part, f"it is declared {dtype} but stored as {stored} (expected {want})")
            return S.from_stored(self._verified_array(ds, part), dtype)
        return self._guard(part, load)

    def _verified_array(self, ds: h5safe.DatasetRef, part: str) -> np.ndarray:
        """The dataset's values after its storage checks; its checksum verified (once per reader)."""
        data = h5safe.read_array(ds, part, self.file_size)
        expected = h5safe.stored_checksum(ds, part, self.checksummed)
        if ds.name not in self._verified:
            h5safe.verify_checksum(data, expected, part)
            self._verified.add(ds.name)
        return data

    def _stats(self, ds: h5safe.DatasetRef, part: str) -> dict:
        def load():
            text = h5safe.attr_str(ds, S.ATTR_STATS, part, self.file_size)
            return V.validate_stats(V.parse_json(text, f"{part}'s stats"), f"{part}'s stats")
        return self._guard(part, load)

    def tensor_bytes(self) -> int:
        """Raw (uncompressed) bytes of all stored tensors: inputs, params, finished ops (each once)."""
        stored_params = self._guard(f"/{S.GROUP_PARAMS}", lambda: list(self._group(S.GROUP_PARAMS)))  # not referenced ones
        datasets = [self._named(g, n) for g in (S.GROUP_INPUTS, S.GROUP_PARAMS)
                    for n in (self.input_names if g == S.GROUP_INPUTS else stored_params)]
        for index in self.finished_ops():
            datasets.extend(self._op_datasets(index))

        def count():
            # a tied param hard-linked under two names counts once; h5py's own size (an empty dataspace's included)
            unique = {ds.id: h5py.Dataset(ds.id) for ds in datasets}
            return sum(int(ds.size) * ds.dtype.itemsize for ds in unique.values())
        return self._guard("the tensors", count)

    # ---- plumbing ----------------------------------------------------------------------
    def _group(self, name: str) -> h5py.Group:
        """A top-level group (/inputs, /params, /ops, /graph), as a hard link inside this file."""
        if name not in self._groups:
            self._groups[name] = h5safe.child(self._open_file(), name, h5py.Group, f"/{name}")
        return self._groups[name]

    def _dataset(self, path: str, part: str) -> h5safe.DatasetRef:
        """A dataset by its path ("graph/op_table"), walked one checked link at a time."""
        *folders, name = path.split("/")
        group = self._open_file()
        for folder in folders:
            group = h5safe.child(group, folder, h5py.Group, part)
        return h5safe.child(group, name, h5py.Dataset, part)

    def _open_file(self) -> h5py.File:
        if self._file is None:
            raise TraceError(f"the trace reader for {self.path} is closed")
        return self._file

    def _guard(self, part: str, load):
        """Run a read, turning a schema violation or any h5py / JSON failure into one TraceError
        that names the file and the part, and says what to do."""
        try:
            return load()
        except TraceError:
            raise
        except SchemaError as exc:
            raise TraceError(f"{self.path}: {exc.part} is corrupt ({exc.detail}); {RECORD_AGAIN}") from None
        except S.DtypeError as exc:
            raise TraceError(f"{self.path}: {part}: {exc}") from None
        except FILE_ERRORS as exc:
            raise TraceError(f"{self.path}: cannot read {part} ({_first_line(exc)}); the trace is "
                             f"corrupt; {RECORD_AGAIN}") from None

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except FILE_ERRORS:
                pass  # a damaged file may fail to release its (read-only) caches; nothing to lose
            self._file = None
            self._groups.clear()
            self._op_groups.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._weights:
            self._weights.close()
        if self._plugins_off:
            self._plugins_off = False
            h5safe.plugin_search.release()

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def _output_part(index: int, k: int) -> str:
    return f"op {index}'s recorded output {k}"


def _open(path: str) -> h5py.File:
    """Open read-only, mapping every way a path can fail to one TraceError line."""
    if not os.path.exists(path):
        raise TraceError(f"trace file {path} does not exist; check the path or "
                         f"record one with `tapml-dbg record`")
    if os.path.isdir(path):
        raise TraceError(f"{path} is a directory, not a trace file; pass the .h5 file")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as e:
        raise TraceError(f"cannot read trace file {path} ({e}); check its permissions")
    if not is_hdf5:
        raise TraceError(f"{path} is not a tapml trace (not an HDF5 file); "
                         f"pass a file written by `tapml-dbg record`")
    try:
        # locking=False: a trace whose recorder still runs (or was killed) stays readable
        return h5py.File(path, "r", locking=False)
    except FILE_ERRORS as e:
        raise TraceError(f"{path} is truncated or corrupt and cannot be opened "
                         f"({_first_line(e)}); {RECORD_AGAIN}")


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
