"""Flip one bit in each named dataset of a trace, as a bad disk would: `python tests/damage_trace.py T.h5 NAME...`.

docs/reliability.md's `info --verify` transcript is made on a trace damaged this way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import h5py


def flip_dataset_bit(path: Path, name: str, byte: int = 3, bit: int = 2) -> None:
    with h5py.File(path, "r") as handle:
        offset = handle[name].id.get_offset()
    data = bytearray(path.read_bytes())
    data[offset + byte] ^= 1 << bit
    path.write_bytes(bytes(data))


if __name__ == "__main__":
    for dataset in sys.argv[2:]:
        flip_dataset_bit(Path(sys.argv[1]), dataset)
