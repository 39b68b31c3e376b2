"""Which ops a trace holds values for, and how: all its tensors (the `done` marker or the tensor
index), stats only (a capture budget, v1.1), a view of a referenced param (v1.4), or nothing (the
recording stopped before it). A killed recorder's half-written op is "not recorded", never an error."""

from __future__ import annotations

import re

import h5py
import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.trace import h5safe
from tapml_dbg.trace import schema as S
from tapml_dbg.trace import validate as V
from tapml_dbg.trace import weight_refs as W
from tapml_dbg.trace.capture import missing_values_message
from tapml_dbg.trace.h5safe import FILE_ERRORS
from tapml_dbg.trace.indexed_reads import IndexedReads
from tapml_dbg.trace.outline import Outline
from tapml_dbg.trace.trace_file import TraceFile
from tapml_dbg.trace.validate import SchemaError
from tapml_dbg.trace.weights import Weights

_INDEX_NAME = re.compile(r"0|[1-9][0-9]*")  # an op group's name: a canonical ASCII index


def output_part(index: int, k: int) -> str:
    return f"op {index}'s recorded output {k}"


class Recorded:
    """What the recording holds of each op of the op table."""

    def __init__(self, file: TraceFile, outline: Outline, indexed: IndexedReads, weights: Weights):
        self._file = file
        self._outline = outline
        self._indexed = indexed
        self._weights = weights
        self._op_groups: dict[int, h5py.Group] = {}  # op index -> its group, checked once
        self._op_markers: dict[tuple[int, str], bool] = {}
        self._views: dict[int, tuple] | None = None  # v1.4: ops whose value is a referenced param transposed
        self._viewed_params: set[str] | None = None  # v1.4: the referenced params those ops are views of

    def has_op(self, index: int) -> bool:
        """True only when op `index`'s outputs were completely written (its `done` marker, or its
        entry in the tensor index, written after every marker, its datasets where it says)."""
        if isinstance(index, (int, np.integer)) and (self._indexed.op(int(index)) is not None
                                                     or int(index) in self.weight_views()):
            return True
        return self._marker_of(index, S.ATTR_DONE)

    def has_stats(self, index: int) -> bool:
        """True when op `index`'s stats are in the trace (with its tensors, or alone: v1.1)."""
        return self.has_op(index) or self.stats_only(index)

    def stats_only(self, index: int) -> bool:
        """True when a capture budget kept op `index`'s stats but not its tensors (v1.1)."""
        return not self.has_op(index) and self._marker_of(index, S.ATTR_STATS_DONE)

    def finished_ops(self) -> list[int]:
        """Ops of the op table whose values (tensors) are in the trace."""
        return [i for i in self._op_indices() if self.has_op(i)]

    def stats_only_ops(self) -> list[int]:
        if self._outline.capture is None:
            return []
        return [i for i in self._op_indices() if self.stats_only(i)]

    def op_group_names(self) -> list[str]:
        """Names under /ops (each should be an op index of the op table)."""
        return self._file.names(S.GROUP_OPS)

    def missing_values_message(self, index: int, needed_by: int | None = None) -> str:
        """Why op `index` has no values here and how to get them (one line, for errors and verdicts)."""
        index = int(index)
        ops = self._outline.ops
        if self.stats_only(index) or (self._outline.capture is not None and self._file.complete):
            return missing_values_message(ops, self._file.meta, index, needed_by)
        name = ops[index]["name"] if 0 <= index < len(ops) else "?"
        return f"op {index} ({name}) has no recorded values (the recording stopped before it; record again)"

    def op_note(self, index: int) -> str:
        group = self.op_group(index, stats_ok=True)
        part = f"op {index}'s note"
        file = self._file
        return file.guard(part, lambda: h5safe.attr_str(group, S.ATTR_NOTE, part, file.file_size, default=""))

    def weight_views(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        """Ops whose value is a referenced param transposed (v1.4, a complete trace): {index: (param, axes)}."""
        if self._views is None:
            self._views = {}
            file = self._file
            weights = self._weights.refs
            present = weights is not None and file.complete and file.has(S.DS_WEIGHT_VIEWS)
            if present:
                part = f"/{S.DS_WEIGHT_VIEWS}"
                self._views = file.guard(part, lambda: W.parse_views(
                    V.parse_json(file.text(S.DS_WEIGHT_VIEWS), part), len(self._outline.ops), weights.params,
                    f"{file.path}: {part}"))
        return self._views

    def viewed_params(self) -> set[str]:
        """The referenced params some op's value is a view of: those the reader keeps once read."""
        if self._viewed_params is None:
            self._viewed_params = {param for param, _axes in self.weight_views().values()}
        return self._viewed_params

    # ---- the op groups ---------------------------------------------------------------------
    def _op_indices(self) -> list[int]:
        count = len(self._outline.ops)
        names = self.op_group_names()
        return sorted(int(n) for n in names if _INDEX_NAME.fullmatch(n) and int(n) < count)

    def _marker_of(self, index: int, name: str) -> bool:
        """An op group's marker (`done`, `stats_done`), each read once and only when asked (a search
        asks for `done` of every op it runs); False where absent or unreadable (the group of an op a
        killed recorder was writing), never an error."""
        index = int(index)
        if not 0 <= index < len(self._outline.ops):  # a damaged op table is an error, not "nothing recorded"
            return False
        if (index, name) not in self._op_markers:
            self._op_markers[(index, name)] = self._marker(index, name)
        return self._op_markers[(index, name)]

    def _marker(self, index: int, name: str) -> bool:
        try:
            group = self.op_group_or_none(index)
            return group is not None and h5safe.attr_int(group, name, f"op {index}", default=0, high=1) == 1
        except (TraceError, SchemaError, *FILE_ERRORS):
            return False

    def op_group_or_none(self, index: int) -> h5py.Group | None:
        """Op `index`'s group, None where the op table has no such op or the file no such group."""
        if not 0 <= index < len(self._outline.ops):
            return None
        if index not in self._op_groups:  # asked for its markers, its note and its outputs: looked up once
            group = h5safe.child(self._file.group(S.GROUP_OPS), str(index), h5py.Group, f"op {index}",
                                 missing_ok=True)
            if group is None:
                return None  # (not kept: a recorder still writing may add it)
            self._op_groups[index] = group
        return self._op_groups[index]

    def op_group(self, index: int, stats_ok: bool = False) -> h5py.Group:
        """Op `index`'s group, or the one-line error of an op without values (or stats, `stats_ok`)."""
        if not self.has_op(index) and not (stats_ok and self.stats_only(index)):
            if self.stats_only(index):
                raise TraceError(self.missing_values_message(index))
            raise TraceError(f"op {index} has no recorded values "
                             f"(the recording stopped before it; record again)")
        return self._file.guard(f"op {index}", lambda: self.op_group_or_none(int(index)))

    def op_datasets(self, index: int) -> list[h5safe.DatasetRef]:
        """Op `index`'s output datasets, named 0..n-1 (each there, and no other)."""
        group = self.op_group(index)
        part = f"op {index}'s outputs"

        def load():
            count = group.id.get_num_objs()  # named 0..count-1: each of those there, and no other
            found = [h5safe.child(group, str(k), h5py.Dataset, output_part(index, k), missing_ok=True)
                     for k in range(count)]
            if any(ds is None for ds in found):
                names = list(group)
                raise SchemaError(part, f"they are named {sorted(names)[:8]}, not 0..{len(names) - 1}")
            return found
        return self._file.guard(part, load)

    def close(self) -> None:
        self._op_groups.clear()
