"""The open trace file: its header, and every read of it checked and turned into one `TraceError`.

A trace is untrusted input (a file passed around, attached to bug reports, kept for months,
possibly damaged or crafted). Everything read through `TraceFile` is checked first, by `h5safe`
(links, attributes, dataset storage, sizes; HDF5's plugin search off) and by `validate` (every
JSON part against the schema), and every tensor and text is verified against its checksum
(v1.2). Any violation, and any exception h5py or the JSON parser raises on the way, becomes a
`TraceError` that names the part and says what to do. The reader's parts (outline, recorded,
tensors, weights, indexed reads) all read through it.

Data only: strings are decoded and JSON-parsed, tensors are plain numeric arrays; nothing read
from the file is ever unpickled, evaluated or imported.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import h5safe
from tapml_dbg.trace import schema as S
from tapml_dbg.trace import validate as V
from tapml_dbg.trace.h5safe import FILE_ERRORS
from tapml_dbg.trace.validate import SchemaError

RECORD_AGAIN = "record the model again with `tapml-dbg record`"
HEADER_PART = "the trace header"


class TraceFile:
    """A trace opened read-only, its header read (format, version, `complete`, meta); opening reads
    nothing else."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = None
        self._verified: set[str] = set()  # datasets whose checksum already matched in this reader
        self._groups: dict[str, h5py.Group] = {}  # top-level groups, checked once (the file is read-only)
        h5safe.plugin_search.acquire()
        self._plugins_off = True
        try:
            self._file = _open(self.path)
            self.file_size = os.path.getsize(self.path)
            self.guard(HEADER_PART, self._read_header)
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

    # ---- checked reads -----------------------------------------------------------------
    def text(self, path: str) -> str:
        """A UTF-8 text dataset such as "graph/op_table", checked and verified."""
        part = f"/{path}"

        def load():
            ds = self.dataset(path, part)
            shape = h5safe.check_storage(ds, part, self.file_size)
            if ds.id.dtype != np.uint8 or len(shape) != 1:
                raise SchemaError(part, f"it must hold UTF-8 bytes (uint8[n]), not {ds.id.dtype}{list(shape)}")
            data = self._verified_array(ds, part)
            try:
                return data.tobytes().decode("utf-8")
            except UnicodeDecodeError:
                raise SchemaError(part, "it is not UTF-8 text") from None
        return self.guard(part, load)

    def tensor(self, ds: h5safe.DatasetRef, part: str) -> np.ndarray:
        """A dataset's values as its declared dtype, checked and verified."""
        def load():
            dtype = h5safe.attr_str(ds, S.ATTR_DTYPE, part, self.file_size)
            V.validate_dtype(dtype, part, "@dtype")
            want = S.storage_dtype(dtype)
            stored = ds.id.dtype
            if stored.newbyteorder("=") != want:
                raise SchemaError(part, f"it is declared {dtype} but stored as {stored} (expected {want})")
            return S.from_stored(self._verified_array(ds, part), dtype)
        return self.guard(part, load)

    def _verified_array(self, ds: h5safe.DatasetRef, part: str) -> np.ndarray:
        """The dataset's values after its storage checks; its checksum verified (once per reader)."""
        data = h5safe.read_array(ds, part, self.file_size)
        expected = h5safe.stored_checksum(ds, part, self.checksummed)
        if ds.name not in self._verified:
            h5safe.verify_checksum(data, expected, part)
            self._verified.add(ds.name)
        return data

    def stats(self, ds: h5safe.DatasetRef, part: str) -> dict:
        """A dataset's recorded stats (its `stats` attribute), checked."""
        def load():
            text = h5safe.attr_str(ds, S.ATTR_STATS, part, self.file_size)
            return V.validate_stats(V.parse_json(text, f"{part}'s stats"), f"{part}'s stats")
        return self.guard(part, load)

    def named(self, group: str, name: str) -> h5safe.DatasetRef:
        """An input or param dataset by name; a name the trace lacks is an error listing those it has."""
        kind = group[:-1]

        def load():
            folder = self.group(group)
            if not isinstance(name, str) or name not in folder:
                known = ", ".join(folder) or "none"
                raise TraceError(f"no {kind} named {name!r} in the trace (known: {known})")
            return h5safe.child(folder, name, h5py.Dataset, f"{kind} {name!r}")
        return self.guard(f"{kind} {name!r}", load)

    # ---- plumbing ----------------------------------------------------------------------
    def names(self, group: str) -> list[str]:
        """The names under a top-level group (/inputs, /params, /ops, /graph)."""
        return self.guard(f"/{group}", lambda: list(self.group(group)))

    def has(self, path: str, part: str | None = None) -> bool:
        """Whether the dataset at `path` ("graph/source_graph") is there (its group checked)."""
        folder, name = path.rsplit("/", 1)
        return self.guard(part or f"/{folder}", lambda: name in self.group(folder))

    def group(self, name: str) -> h5py.Group:
        """A top-level group (/inputs, /params, /ops, /graph), as a hard link inside this file."""
        if name not in self._groups:
            self._groups[name] = h5safe.child(self.open_file(), name, h5py.Group, f"/{name}")
        return self._groups[name]

    def dataset(self, path: str, part: str) -> h5safe.DatasetRef:
        """A dataset by its path ("graph/op_table"), walked one checked link at a time."""
        *folders, name = path.split("/")
        group = self.open_file()
        for folder in folders:
            group = h5safe.child(group, folder, h5py.Group, part)
        return h5safe.child(group, name, h5py.Dataset, part)

    def open_file(self) -> h5py.File:
        if self._file is None:
            raise TraceError(f"the trace reader for {self.path} is closed")
        return self._file

    def guard(self, part: str, load):
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
        if self._plugins_off:
            self._plugins_off = False
            h5safe.plugin_search.release()


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
