"""A trace's tensors and their stats: inputs, params (stored, or read from a checkpoint by
reference: v1.4) and each recorded op's outputs; through the tensor index where it can be used
(v1.3), else through HDF5; every one checked and verified against its checksum."""

from __future__ import annotations

import h5py
import numpy as np

from tapml_dbg.trace import h5safe
from tapml_dbg.trace import schema as S
from tapml_dbg.trace import validate as V
from tapml_dbg.trace.indexed_reads import IndexedReads
from tapml_dbg.trace.outline import Outline
from tapml_dbg.trace.recorded import Recorded, output_part
from tapml_dbg.trace.stats import tensor_stats
from tapml_dbg.trace.trace_file import TraceFile
from tapml_dbg.trace.weights import Weights


class Tensors:
    """The values a trace recorded, read on request."""

    def __init__(self, file: TraceFile, outline: Outline, recorded: Recorded, indexed: IndexedReads,
                 weights: Weights):
        self._file = file
        self._outline = outline
        self._recorded = recorded
        self._indexed = indexed
        self._weights = weights

    def input(self, name: str) -> np.ndarray:
        found = self._indexed.named(S.GROUP_INPUTS, name)
        return found[0] if found is not None else self._file.tensor(self._file.named(S.GROUP_INPUTS, name),
                                                                    f"input {name!r}")

    def param(self, name: str) -> np.ndarray:
        weights = self._weights.refs
        if weights is not None and name in weights.params:  # v1.4: read from its checkpoint, CRC-32 checked
            return weights.read(name, keep=name in self._recorded.viewed_params())
        found = self._indexed.named(S.GROUP_PARAMS, name)
        return found[0] if found is not None else self._file.tensor(self._file.named(S.GROUP_PARAMS, name),
                                                                    f"param {name!r}")

    def input_stats(self, name: str) -> dict:
        return self._file.stats(self._file.named(S.GROUP_INPUTS, name), f"input {name!r}")

    def param_stats(self, name: str) -> dict:
        weights = self._weights.refs
        if weights is not None and name in weights.params:  # computed when asked: recording stays fast
            return self._weights.stats(name)
        return self._file.stats(self._file.named(S.GROUP_PARAMS, name), f"param {name!r}")

    def op_outputs(self, index: int) -> list[np.ndarray]:
        view = self._recorded.weight_views().get(int(index))
        if view is not None:  # v1.4: a referenced param transposed, made from the checkpoint's tensor
            return [self._weights.refs.transposed(view[0], view[1])]
        items = self._indexed.op(int(index))
        found = self._indexed.read(items) if items is not None else None
        if found is not None:
            return found
        return [self._file.tensor(ds, output_part(index, k)) for k, ds in enumerate(self._recorded.op_datasets(index))]

    def op_stats(self, index: int) -> list[dict]:
        recorded = self._recorded
        if int(index) in recorded.weight_views():
            return [tensor_stats(value) for value in self.op_outputs(index)]
        if not recorded.has_op(index) and recorded.stats_only(index):
            part = f"op {index}'s stats"
            file = self._file

            def load():
                group = recorded.op_group_or_none(int(index))
                text = h5safe.attr_str(group, S.ATTR_OP_STATS, part, file.file_size)
                return V.validate_stats_list(V.parse_json(text, part), part)
            return file.guard(part, load)
        return [self._file.stats(ds, output_part(index, k)) for k, ds in enumerate(recorded.op_datasets(index))]

    def tensor_bytes(self) -> int:
        """Raw (uncompressed) bytes of all stored tensors: inputs, params, finished ops (each once)."""
        file = self._file
        stored_params = file.names(S.GROUP_PARAMS)  # not referenced ones
        datasets = [file.named(g, n) for g in (S.GROUP_INPUTS, S.GROUP_PARAMS)
                    for n in (self._outline.input_names if g == S.GROUP_INPUTS else stored_params)]
        for index in self._recorded.finished_ops():
            datasets.extend(self._recorded.op_datasets(index))

        def count():
            # a tied param hard-linked under two names counts once; h5py's own size (an empty dataspace's included)
            unique = {ds.id: h5py.Dataset(ds.id) for ds in datasets}
            return sum(int(ds.size) * ds.dtype.itemsize for ds in unique.values())
        return file.guard("the tensors", count)
