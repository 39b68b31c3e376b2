"""The tensor index (v1.3): where each tensor of a finished trace lies in the file.

A search reads the recorded value of every op it runs, and a generation's decode steps are
thousands of tiny ops: through HDF5 each read is ~10 object and attribute lookups (the op's group
and marker, the dataset, its storage, dtype and checksum), ~0.5 ms an op, most of a warm search
of a 16-step generation. With the index, a read is one positioned read of the bytes and a CRC-32.

The writer records each uncompressed tensor's entry as it writes it, `[offset, stored dtype, shape,
crc32, dtype]`, and stores them on close as the text `/graph/tensor_index` (a complete trace only).
The index only speeds reads up: an entry is used after its own checks (a stored dtype of plain
numbers that its declared dtype is stored as, a shape within the format's bounds, bytes that lie in
the file) and its bytes verified against its CRC-32; a missing, damaged or stale index (a file
repacked after recording), or one entry that fails, sends the reader back to the HDF5 path, which
checks everything as before and says what is wrong. Data only: numbers and dtype names.
"""

from __future__ import annotations

import math
import os

import numpy as np
from h5py import h5d, h5o

from tapml_dbg.trace import schema as S

KINDS = ("inputs", "params", "ops")
# the stored dtypes a tensor may have (plain numbers, either byte order), spelled as numpy's `.str`
STORED_DTYPES = frozenset(np.dtype(f"{order}{kind}{size}").str
                          for order in "<>" for kind in "iuf" for size in (1, 2, 4, 8) if (kind, size) != ("f", 1))


def entry(dataset, data: np.ndarray, dtype_name: str, crc: int) -> list | None:
    """A tensor's entry, from the dataset the writer just created with `data`; None when its bytes
    do not lie in one contiguous run of the file (compressed, compact or empty storage)."""
    offset = dataset.id.get_offset()
    if offset is None or data.size == 0 or dataset.compression is not None:
        return None
    return [int(offset), data.dtype.str, [int(n) for n in data.shape], int(crc), dtype_name]


def new() -> dict:
    return {kind: {} for kind in KINDS}


def usable(data) -> dict:
    """The parsed index when it has the expected outline ({kind: {name: entry or [entries]}}), else
    an empty one (each entry is checked where it is used)."""
    if not isinstance(data, dict) or not all(isinstance(data.get(kind), dict) for kind in KINDS):
        return new()
    return data


def in_place(dataset_id, item, file_number: int) -> bool:
    """Whether the object opened at the entry's path (h5py's low-level id) is a dataset and what the entry says: one
    run of bytes at its offset, of its shape and stored dtype, in the file numbered `file_number` (an
    object opened through an external link is in another)."""
    return isinstance(dataset_id, h5d.DatasetID) and _outline(item) and dataset_id.get_offset() == item[0] \
        and list(dataset_id.shape or ()) == item[2] and dataset_id.dtype.str == item[1] \
        and h5o.get_info(dataset_id).fileno == file_number


def read(fd: int, item, file_size: int, verified: set) -> np.ndarray | None:
    """The tensor an entry describes, its bytes verified against the entry's CRC-32 (once per
    `verified` set, by offset); None when the entry fails a check."""
    if not _outline(item):
        return None
    offset, stored, shape, crc, dtype_name = item
    if not (_count(offset, 2**63) and _count(crc, 2**32) and stored in STORED_DTYPES
            and isinstance(shape, list) and len(shape) <= S.MAX_NDIM and all(_count(n, S.MAX_DIM) for n in shape)
            and dtype_name in S.SUPPORTED_DTYPES):
        return None
    dtype = np.dtype(stored)
    if dtype.newbyteorder("=") != S.storage_dtype(dtype_name):
        return None
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow on a crafted shape
    if nbytes == 0 or offset + nbytes > file_size:
        return None
    array = np.empty(shape, dtype)
    if not _read_into(fd, array.reshape(-1).view(np.uint8), offset):
        return None
    if offset not in verified:
        if S.checksum(array) != crc:
            return None
        verified.add(offset)
    return S.from_stored(array, dtype_name)


def _outline(item) -> bool:
    return isinstance(item, list) and len(item) == 5


def _read_into(fd: int, buffer: np.ndarray, offset: int) -> bool:
    """Fill `buffer` with the file's bytes from `offset`; False on a short read or where the platform
    has no positioned read (the HDF5 path then reads)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buffer], offset) == buffer.size
    if hasattr(os, "pread"):
        data = os.pread(fd, buffer.size, offset)
        buffer[:len(data)] = np.frombuffer(data, np.uint8)
        return len(data) == buffer.size
    return False


def _count(value, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit
