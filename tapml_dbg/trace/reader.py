"""Lazy trace reader: opening reads root attributes only; tensors load on request.

Data only: strings are decoded and JSON-parsed, tensors are plain numeric arrays; nothing
read from the file is ever unpickled, evaluated or imported.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.trace.capture import missing_values_message
from tapml_dbg.trace import schema as S

_RECORD_AGAIN = "record the model again with `tapml-dbg record`"


class TraceReader:
    """Read a trace written by `TraceWriter` (any v1.x)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = _open(self.path)
        try:
            self._read_header()
        except BaseException:
            self._file.close()
            raise
        self._ops = None

    def _read_header(self) -> None:
        attrs = self._file.attrs
        try:
            fmt = S.decode_str(attrs[S.ATTR_FORMAT]) if S.ATTR_FORMAT in attrs else None
        except (OSError, UnicodeDecodeError, TypeError) as e:
            raise TraceError(f"{self.path}: the trace header is corrupt ({e}); {_RECORD_AGAIN}")
        if fmt != S.FORMAT_NAME:
            raise TraceError(f"{self.path} is an HDF5 file but not a tapml trace; "
                             f"pass a file written by `tapml-dbg record`")
        try:
            major = int(attrs[S.ATTR_VERSION_MAJOR])
            minor = int(attrs[S.ATTR_VERSION_MINOR])
            self.complete = bool(attrs.get(S.ATTR_COMPLETE, 0))
            self.meta = json.loads(S.decode_str(attrs[S.ATTR_META]))
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise TraceError(f"{self.path}: the trace header is corrupt ({e}); {_RECORD_AGAIN}")
        self.version = (major, minor)
        reads = S.FORMAT_VERSION[0]
        if major > reads:
            raise TraceError(f"trace format v{major}.{minor} is newer than this tapml-dbg "
                             f"(reads v{reads}); upgrade tapml-dbg")
        if major < reads:
            raise TraceError(f"trace format v{major}.{minor} is older than this tapml-dbg "
                             f"supports (reads v{reads}); {_RECORD_AGAIN}")

    # ---- graph -------------------------------------------------------------------------
    @property
    def graph_json(self) -> str:
        """TVM's JSON serialization of the IRModule (data only)."""
        return self._text(S.DS_IR_JSON)

    @property
    def tvmscript(self) -> str:
        """Human-readable TVMScript; for display only, never to be parsed or executed."""
        return self._text(S.DS_TVMSCRIPT)

    @property
    def ops(self) -> list[dict]:
        """The op table (cached; do not mutate)."""
        if self._ops is None:
            try:
                self._ops = json.loads(self._text(S.DS_OP_TABLE))
            except ValueError as e:
                raise TraceError(f"{self.path}: the op table is corrupt ({e}); {_RECORD_AGAIN}")
        return self._ops

    def _text(self, path: str) -> str:
        ds = self._guard(path, lambda: self._file[path][()])
        return np.asarray(ds, dtype=np.uint8).tobytes().decode("utf-8")

    # ---- inputs and params ---------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return list(self._group(S.GROUP_INPUTS))

    @property
    def param_names(self) -> list[str]:
        return list(self._group(S.GROUP_PARAMS))

    def input(self, name: str) -> np.ndarray:
        return self._tensor(self._named(S.GROUP_INPUTS, name))

    def param(self, name: str) -> np.ndarray:
        return self._tensor(self._named(S.GROUP_PARAMS, name))

    def input_stats(self, name: str) -> dict:
        return self._stats(self._named(S.GROUP_INPUTS, name))

    def param_stats(self, name: str) -> dict:
        return self._stats(self._named(S.GROUP_PARAMS, name))

    def _named(self, group: str, name: str) -> h5py.Dataset:
        ds = self._group(group).get(name)
        if not isinstance(ds, h5py.Dataset):
            known = ", ".join(self._group(group)) or "none"
            raise TraceError(f"no {group[:-1]} named {name!r} in the trace (known: {known})")
        return ds

    # ---- ops ---------------------------------------------------------------------------
    def has_op(self, index: int) -> bool:
        """True only when op `index`'s outputs were completely written (its `done` marker)."""
        try:
            group = self._group(S.GROUP_OPS).get(str(int(index)))
            return isinstance(group, h5py.Group) and bool(group.attrs.get(S.ATTR_DONE, 0))
        except (OSError, KeyError, ValueError, RuntimeError):
            return False  # a group the killed recorder was writing: not finished

    def finished_ops(self) -> list[int]:
        """Ops whose values (tensors) are in the trace."""
        names = [n for n in self._group(S.GROUP_OPS) if n.isdigit()]
        return sorted(i for i in map(int, names) if self.has_op(i))

    def has_stats(self, index: int) -> bool:
        """True when op `index`'s stats are in the trace (with its tensors, or alone: v1.1)."""
        return self.has_op(index) or self.stats_only(index)

    def stats_only(self, index: int) -> bool:
        """True when a capture budget kept op `index`'s stats but not its tensors (v1.1)."""
        try:
            group = self._group(S.GROUP_OPS).get(str(int(index)))
            return isinstance(group, h5py.Group) and bool(group.attrs.get(S.ATTR_STATS_DONE, 0)) \
                and not bool(group.attrs.get(S.ATTR_DONE, 0))
        except (OSError, KeyError, ValueError, RuntimeError):
            return False

    def stats_only_ops(self) -> list[int]:
        if self.capture is None:
            return []
        names = [n for n in self._group(S.GROUP_OPS) if n.isdigit()]
        return sorted(i for i in map(int, names) if self.stats_only(i))

    @property
    def capture(self) -> dict | None:
        """The capture budget the trace was recorded with (meta `capture`), None for a full trace."""
        capture = self.meta.get(S.META_CAPTURE)
        return capture if isinstance(capture, dict) else None

    def missing_values_message(self, index: int, needed_by: int | None = None) -> str:
        """Why op `index` has no values here and how to get them (one line, for errors and verdicts)."""
        index = int(index)
        if self.stats_only(index) or (self.capture is not None and self.complete):
            return missing_values_message(self.ops, self.meta, index, needed_by)
        name = self.ops[index].get("name", "?") if 0 <= index < len(self.ops) else "?"
        return f"op {index} ({name}) has no recorded values (the recording stopped before it; record again)"

    def op_outputs(self, index: int) -> list[np.ndarray]:
        return [self._tensor(ds) for ds in self._op_datasets(index)]

    def op_stats(self, index: int) -> list[dict]:
        if not self.has_op(index) and self.stats_only(index):
            group = self._group(S.GROUP_OPS)[str(int(index))]
            return self._guard(f"op {index}", lambda: json.loads(S.decode_str(group.attrs[S.ATTR_OP_STATS])))
        return [self._stats(ds) for ds in self._op_datasets(index)]

    def op_note(self, index: int) -> str:
        group = self._op_group(index, stats_ok=True)
        return self._guard(f"op {index}", lambda: S.decode_str(group.attrs.get(S.ATTR_NOTE, b"")))

    def _op_group(self, index: int, stats_ok: bool = False) -> h5py.Group:
        if not self.has_op(index) and not (stats_ok and self.stats_only(index)):
            if self.stats_only(index):
                raise TraceError(self.missing_values_message(index))
            raise TraceError(f"op {index} has no recorded values "
                             f"(the recording stopped before it; record again)")
        return self._group(S.GROUP_OPS)[str(int(index))]

    def _op_datasets(self, index: int) -> list[h5py.Dataset]:
        group = self._op_group(index)

        def load():
            keys = sorted(int(k) for k in group)
            if keys != list(range(len(keys))):
                raise ValueError(f"outputs {keys} are not numbered 0..n-1")
            return [group[str(k)] for k in keys]
        return self._guard(f"op {index}", load)

    # ---- tensors -----------------------------------------------------------------------
    def _tensor(self, ds: h5py.Dataset) -> np.ndarray:
        def load():
            dtype = S.decode_str(ds.attrs[S.ATTR_DTYPE])
            return S.from_stored(np.asarray(ds[()]), dtype)
        return self._guard(ds.name, load)

    def _stats(self, ds: h5py.Dataset) -> dict:
        return self._guard(ds.name, lambda: json.loads(S.decode_str(ds.attrs[S.ATTR_STATS])))

    def tensor_bytes(self) -> int:
        """Raw (uncompressed) bytes of all stored tensors: inputs, params, finished ops (each once)."""
        datasets = [self._group(g)[n] for g in (S.GROUP_INPUTS, S.GROUP_PARAMS)
                    for n in self._group(g)]
        for index in self.finished_ops():
            datasets.extend(self._op_datasets(index))
        unique = {ds.id: ds for ds in datasets}  # a tied param hard-linked under two names counts once
        return sum(int(ds.size) * ds.dtype.itemsize for ds in unique.values())

    @property
    def file_size(self) -> int:
        return os.path.getsize(self.path)

    # ---- plumbing ----------------------------------------------------------------------
    def _group(self, name: str) -> h5py.Group:
        group = self._guard(name, lambda: self._file.get(name))
        if not isinstance(group, h5py.Group):
            raise TraceError(f"{self.path}: group /{name} is missing; {_RECORD_AGAIN}")
        return group

    def _guard(self, what: str, load):
        """Run an h5py read, turning corruption into a TraceError that says what to do."""
        try:
            return load()
        except TraceError:
            raise
        except S.DtypeError as e:
            raise TraceError(f"{self.path}: {what}: {e}") from e
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            raise TraceError(f"{self.path}: cannot read {what} ({_first_line(e)}); the trace is "
                             f"corrupt; {_RECORD_AGAIN}") from e

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


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
    except OSError as e:
        raise TraceError(f"{path} is truncated or corrupt and cannot be opened "
                         f"({_first_line(e)}); {_RECORD_AGAIN}")


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
