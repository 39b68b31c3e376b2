"""Tensors of a finished v1.3 trace read through its tensor index (trace/tensor_index.py): one
positioned read a tensor, its bytes verified against its checksum. Any doubt (no index, an entry
not where it says, bytes that do not match) sends the read back through HDF5, as for older traces."""

from __future__ import annotations

import os

import numpy as np
from h5py import h5o

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import schema as S
from tapml_dbg.trace import tensor_index
from tapml_dbg.trace import validate as V
from tapml_dbg.trace.h5safe import FILE_ERRORS
from tapml_dbg.trace.outline import Outline
from tapml_dbg.trace.trace_file import TraceFile


class IndexedReads:
    """The tensor index of one open trace, loaded on the first tensor read."""

    def __init__(self, file: TraceFile, outline: Outline):
        self._file = file
        self._outline = outline
        self._index: dict | None = None  # the tensor index, loaded on the first tensor read ({}: none to use)
        self._fd: int | None = None  # the file opened for the index's positioned reads
        self._fileno: int | None = None
        self._verified: set[int] = set()  # offsets whose bytes matched their entry's checksum
        self._ops: dict[int, list | None] = {}  # op index -> its entries, found in place (None: none)

    def _tensor_index(self) -> dict:
        """The trace's tensor index; an empty one where there is none or it cannot be used (the
        HDF5 path then reads everything, as for older traces)."""
        if self._index is None:
            self._index = tensor_index.new()
            file = self._file
            if file.version >= S.TENSOR_INDEX_SINCE and file.complete:
                part = S.DS_TENSOR_INDEX
                try:  # missing or damaged: the values themselves may be fine
                    self._index = file.guard(part, lambda: tensor_index.usable(V.parse_json(file.text(part), part)))
                except TraceError:
                    pass
        return self._index

    def op(self, index: int) -> list | None:
        """Op `index`'s entries in the tensor index, once its datasets are found where they say (one
        lookup each, once per reader: an op replaced, moved or deleted since the recording is read
        through HDF5); None where the op has no usable entry."""
        if index in self._ops:
            return self._ops[index]
        items = self._tensor_index()["ops"].get(str(index)) if 0 <= index < len(self._outline.ops) else None
        if not (isinstance(items, list) and items and all(self._in_place(S.GROUP_OPS, f"{index}/{k}", item)
                                                           for k, item in enumerate(items))):
            items = None
        self._ops[index] = items
        return items

    def named(self, group: str, name: str) -> list[np.ndarray] | None:
        """An input or param through the tensor index (None: read it through HDF5)."""
        item = self._tensor_index()[group].get(name) if isinstance(name, str) else None
        return self.read([item]) if item is not None and self._in_place(group, name, item) else None

    def _in_place(self, group: str, path: str, item) -> bool:
        """Whether the dataset at `path` under `group` is where the entry says (`tensor_index.in_place`)."""
        try:
            return tensor_index.in_place(h5o.open(self._file.group(group).id, path.encode()), item, self._file_number())
        except (TraceError, ValueError, *FILE_ERRORS):  # (not there, not a dataset: read through HDF5)
            return False

    def _file_number(self) -> int:
        """HDF5's number of this open file (an object opened through an external link has another)."""
        if self._fileno is None:
            self._fileno = h5o.get_info(self._file.open_file().id).fileno
        return self._fileno

    def read(self, items: list) -> list[np.ndarray] | None:
        """The tensors of index entries (in place), each verified against its checksum; None when
        one fails a check (the index is then set aside for good: the file is not as recorded)."""
        try:
            if self._fd is None:
                self._fd = os.open(self._file.path, os.O_RDONLY)
            arrays = [tensor_index.read(self._fd, item, self._file.file_size, self._verified) for item in items]
        except OSError:
            arrays = [None]
        if any(array is None for array in arrays):
            self._index = tensor_index.new()
            self._ops.clear()
            return None
        return arrays

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
