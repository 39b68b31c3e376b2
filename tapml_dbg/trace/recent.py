"""Op outputs read from a trace, the most recent kept up to a byte budget (least recently used first out).

Readers that ask for the same recorded values again read and checksum them once: a target
worker's sweep reads an op's value as the next op's input and again as its own screen's
reference; a session's source runner feeds an op's recorded inputs to the next ones.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class RecentOpOutputs:
    """`reader.tensors.op_outputs(index)`, the last ones read kept while they fit in `max_bytes` (a value
    larger than that on its own is read every time)."""

    def __init__(self, reader, max_bytes: int):
        self.reader = reader
        self.max_bytes = max_bytes
        self._kept: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._bytes = 0

    def __contains__(self, index: int) -> bool:
        return index in self._kept

    def get(self, index: int) -> list[np.ndarray]:
        if index in self._kept:
            self._kept.move_to_end(index)
            return self._kept[index]
        values = self.reader.tensors.op_outputs(index)
        self.keep(index, values)
        return values

    def keep(self, index: int, values: list[np.ndarray]) -> None:
        """Keep op `index`'s values read elsewhere (read ahead) as if `get` had read them."""
        if index in self._kept:
            return
        size = values_nbytes(values)
        if size <= self.max_bytes:
            self._kept[index] = values
            self._bytes += size
            while self._bytes > self.max_bytes:
                _index, dropped = self._kept.popitem(last=False)
                self._bytes -= values_nbytes(dropped)


def values_nbytes(values: list) -> int:
    """The bytes a list of arrays holds (what the byte budgets of trace/ count)."""
    return sum(int(getattr(value, "nbytes", 0)) for value in values)
