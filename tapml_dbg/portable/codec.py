"""Arrays as npz can hold them without pickle: bfloat16/float8 travel as raw bits, bit exact."""

from __future__ import annotations

import zipfile

import numpy as np

from .errors import PortableError

NATIVE_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                           "uint64", "float16", "float32", "float64"])
_BITS_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32}  # itemsize -> the unsigned type holding its bits


def contiguous(array) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them shape (1,))."""
    return np.require(np.asarray(array), requirements="C")


def dtype_name(array) -> str:
    return str(np.asarray(array).dtype) if not hasattr(array, "dtype") else str(array.dtype)


def encode_array(array) -> tuple[np.ndarray, str]:
    """(array npz can hold without pickle, logical dtype name). bfloat16/float8 become raw bits."""
    array = contiguous(array)
    name = dtype_name(array)
    if name in NATIVE_DTYPES:
        return array, name
    bits = _BITS_OF_SIZE.get(array.dtype.itemsize)
    if bits is None:
        raise ValueError(f"cannot store dtype {name} in a repro")
    return array.view(bits), name


def decode_array(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Invert `encode_array`, bit exact."""
    if dtype_name(stored) == dtype:
        return stored
    if dtype in NATIVE_DTYPES:
        raise PortableError(f"array stored as {dtype_name(stored)} but declared {dtype}; the data is corrupt")
    try:
        import ml_dtypes  # a dependency of tvm
    except ImportError as exc:
        raise PortableError(f"decoding {dtype} data needs the ml_dtypes package (pip install ml_dtypes)") from exc
    want = np.dtype(getattr(ml_dtypes, dtype))
    if stored.dtype.itemsize != want.itemsize:
        raise PortableError(f"array stored as {dtype_name(stored)} cannot hold {dtype}; the data is corrupt")
    return contiguous(stored).view(want)


def write_npz(path: str, arrays) -> None:
    """Stream `(key, array)` pairs into an npz (what np.savez writes), one array in memory at a time."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays:
            with archive.open(key + ".npy", "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, contiguous(array), allow_pickle=False)
