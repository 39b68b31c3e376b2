"""The h5py side of the trace boundary: what the reader may follow, read and allocate.

Every object, attribute and dataset the reader touches goes through these functions, which check
what the file declares before h5py acts on it:

- links: only hard links inside the file. An external link (a "self-contained" trace reading
  another file's values into a verdict) or a soft link is refused, one path level at a time;
- datasets: contiguous, chunked or compact storage inside this file (no external raw storage, no
  virtual dataset), only the filters of `schema.ALLOWED_FILTERS`, a plain numeric type, and a
  declared size the file can actually hold, all checked before a byte is read or allocated;
- attributes: a scalar of the expected kind (fixed-length string, integer) and a size bounded by
  the file's, checked before reading;
- HDF5's plugin search is off while any trace is open (`plugin_search_off`), so no filter named in
  a file can make HDF5 load a shared library.

Failures raise `SchemaError(part, detail)`; h5py's own exceptions (KeyError on a bad metadata
checksum, RuntimeError from a damaged link table, OSError, ...) are the reader's to translate,
through `FILE_ERRORS`.
"""

from __future__ import annotations

import math
import threading

import h5py
import numpy as np
from h5py import h5a, h5d, h5g, h5i, h5l, h5o, h5pl, h5s

from tapml_dbg.trace import schema as S
from tapml_dbg.trace.validate import SchemaError

# What h5py and numpy raise on a damaged or crafted file. Reading is guarded with these, not with
# `Exception`, so a bug in tapml-dbg itself still surfaces as one.
FILE_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError, IndexError, LookupError,
               OverflowError, MemoryError, RecursionError, SystemError, AttributeError)

INT_KINDS = "iu"
STRING_KIND = "S"  # fixed-length byte strings: the only strings a trace holds (no global heap)
_LAYOUTS = {h5d.CONTIGUOUS: "contiguous", h5d.CHUNKED: "chunked", h5d.COMPACT: "compact"}
COMPACT_MAX_BYTES = 64 * 1024  # HDF5 keeps a compact dataset inside its 64 KiB object header


# ---- plugins ---------------------------------------------------------------------------------

class _PluginSearch:
    """HDF5's plugin path table, emptied while at least one trace is open and restored after."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._saved: list[bytes] = []

    def acquire(self) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = [h5pl.get(i) for i in range(h5pl.size())]
                while h5pl.size():
                    h5pl.remove(0)
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for path in self._saved:
                    h5pl.append(path)
                self._saved = []


plugin_search = _PluginSearch()


# ---- links and objects -----------------------------------------------------------------------

def child(group: h5py.Group, name: str, kind: type, part: str, missing_ok: bool = False):
    """`group[name]` when it is a hard link to a `kind` (h5py.Group or h5py.Dataset), else SchemaError:
    an h5py.Group, or for a dataset a `DatasetRef`.

    One level only: "a/b" must be walked as two calls, so no intermediate link is followed unchecked.
    (h5py's low-level calls: a search reads thousands of ops, and the high-level ones cost 3x more.)
    With `missing_ok`, a name not in the group gives None (one lookup where the caller would check first).
    """
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise SchemaError(part, f"{name!r} is not the name of one object")
    key = name.encode()
    try:
        link = group.id.links.get_info(key).type  # (one lookup where the name is there, as it nearly always is)
    except (KeyError, RuntimeError):
        if group.id.links.exists(key):  # there, yet unreadable: the damaged file's own error
            raise
        if missing_ok:
            return None
        raise SchemaError(part, f"{_where(group, name)} is missing") from None
    if link != h5l.TYPE_HARD:
        what = "an external link to another file" if link == h5l.TYPE_EXTERNAL else "a soft link"
        raise SchemaError(part, f"{_where(group, name)} is {what}; a trace holds its own data only")
    oid = h5o.open(group.id, key)  # (a named datatype is neither kind)
    if kind is h5py.Group and isinstance(oid, h5g.GroupID):
        return h5py.Group(oid)
    if kind is h5py.Dataset and isinstance(oid, h5d.DatasetID):
        return DatasetRef(oid)
    want = "a group" if kind is h5py.Group else "a dataset"
    raise SchemaError(part, f"{_where(group, name)} is not {want}")


class DatasetRef:
    """A checked dataset as the reader holds it: the low-level id that every function here works on,
    and its path. Not an h5py.Dataset, which creates a transfer property list per object that
    nothing here uses: a search holds thousands of op outputs."""

    __slots__ = ("id",)

    def __init__(self, dataset_id: h5d.DatasetID):
        self.id = dataset_id

    @property
    def name(self) -> str:
        """The dataset's path in the file ("/ops/12/0"), as h5py's `.name` gives it."""
        return h5i.get_name(self.id).decode("utf-8", "surrogateescape")


def _where(group: h5py.Group, name: str) -> str:
    base = group.name.rstrip("/")
    return f"{base}/{name}"


# ---- attributes ------------------------------------------------------------------------------

def attr_str(obj, name: str, part: str, file_size: int, default: str | None = None) -> str:
    """A fixed-length UTF-8 string attribute (NUL padding stripped)."""
    attr = _attr_id(obj, name, part, default is not None)
    if attr is None:
        return default
    ftype = attr.get_type()
    dtype = ftype.dtype
    if dtype.kind != STRING_KIND:
        raise SchemaError(part, f"@{name} must be a fixed-length string, not {_dtype_text(dtype)}")
    shape = attr.shape
    _check_attr_size(attr, shape, name, part, file_size)
    try:
        return S.decode_str(_attr_value(attr, shape, ftype, dtype)[()])
    except UnicodeDecodeError:
        raise SchemaError(part, f"@{name} is not UTF-8 text") from None


def attr_int(obj, name: str, part: str, default: int | None = None, low: int = 0, high: int = 2**32 - 1) -> int:
    """A scalar integer attribute within [low, high]."""
    attr = _attr_id(obj, name, part, default is not None)
    if attr is None:
        return default
    ftype = attr.get_type()
    dtype, shape = ftype.dtype, attr.shape
    if dtype.kind not in INT_KINDS or shape not in ((), (1,)):
        raise SchemaError(part, f"@{name} must be an integer, not {_dtype_text(dtype)} of shape {shape}")
    value = int(_attr_value(attr, shape, ftype, dtype).reshape(()))
    if not low <= value <= high:
        raise SchemaError(part, f"@{name} is {value}, outside {low}..{high}")
    return value


def _attr_id(obj, name: str, part: str, optional: bool):
    """The attribute, opened in one call (it is there in the common case, and an op's attributes are
    read thousands of times in a search); a KeyError from the open means "missing" only where HDF5
    confirms the attribute is absent, otherwise it is the damaged file's error and propagates."""
    key = name.encode()
    try:
        return h5a.open(obj.id, key)
    except KeyError:
        if h5a.exists(obj.id, key):
            raise
    if optional:
        return None
    raise SchemaError(part, f"@{name} is missing")


def _attr_value(attr, shape, ftype, dtype) -> np.ndarray:
    """The attribute's value (its kind and shape checked by the caller), read in the file's own type
    `ftype` (whose numpy form is `dtype`): passed in, as each query creates an HDF5 object."""
    value = np.empty(shape, dtype=dtype)
    attr.read(value, mtype=ftype)
    return value


def _check_attr_size(attr, shape, name: str, part: str, file_size: int) -> None:
    if shape != ():
        raise SchemaError(part, f"@{name} must be a scalar, not of shape {shape}")
    if attr.get_storage_size() > file_size:
        raise SchemaError(part, f"@{name} declares {attr.get_storage_size()} bytes, more than the whole file")


def _dtype_text(dtype) -> str:
    if h5py.check_vlen_dtype(dtype) is not None or dtype.kind == "O":
        return "variable-length data"
    return str(dtype)


# ---- datasets --------------------------------------------------------------------------------

def check_storage(ds: DatasetRef, part: str, file_size: int) -> tuple[int, ...]:
    """Refuse, before reading, a dataset stored outside the file, filtered by anything but the
    allowed filters, of a non-numeric type, or declaring more bytes than the file can hold.
    Returns the shape it checked (each `.shape` query reads the dataspace again)."""
    plist = ds.id.get_create_plist()  # (the low-level calls: a search checks thousands of datasets)
    layout = plist.get_layout()
    if layout == h5d.VIRTUAL:
        raise SchemaError(part, "it is a virtual dataset (data mapped from other files); a trace holds its own data")
    if plist.get_external_count():
        raise SchemaError(part, "its data is stored in an external file; a trace holds its own data")
    if layout not in _LAYOUTS:
        raise SchemaError(part, f"it has storage layout {layout}, which a trace does not use")
    nfilters = plist.get_nfilters()
    for k in range(nfilters):
        code = plist.get_filter(k)[0]
        if code not in S.ALLOWED_FILTERS:
            raise SchemaError(part, f"it is filtered by HDF5 filter {code}, which is not one of "
                                    f"{', '.join(S.ALLOWED_FILTERS.values())}; refusing to load a plugin for it")
    dtype = ds.id.dtype
    if dtype.kind not in "iuf" or dtype.itemsize not in (1, 2, 4, 8):
        raise SchemaError(part, f"it holds {_dtype_text(dtype)}, not plain numbers")
    shape = ds.id.shape
    if shape is None:
        raise SchemaError(part, "it has no dataspace (an empty HDF5 dataset)")
    if len(shape) > S.MAX_NDIM:
        raise SchemaError(part, f"it has {len(shape)} dimensions")
    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow on a crafted shape
    stored = ds.id.get_storage_size()
    if stored > file_size:
        raise SchemaError(part, f"it declares {stored} stored bytes in a file of {file_size}")
    filtered = nfilters > 0
    if layout == h5d.CONTIGUOUS:
        if declared and stored != declared:
            raise SchemaError(part, f"it declares {declared} bytes but stores {stored}")
        offset = ds.id.get_offset()
        if declared and (offset is None or offset + declared > file_size):
            raise SchemaError(part, "its data lies past the end of the file (the file is truncated)")
    elif layout == h5d.COMPACT:
        if declared > COMPACT_MAX_BYTES:
            raise SchemaError(part, f"it declares {declared} bytes in compact storage")
    elif declared > max(stored, 1) * (S.MAX_COMPRESSION_RATIO if filtered else 1):
        raise SchemaError(part, f"it declares {declared} bytes but stores only {stored}")
    return shape


def read_array(ds: DatasetRef, part: str, file_size: int) -> np.ndarray:
    """The dataset's values, after `check_storage`, as a C-contiguous array in the file's byte order."""
    shape = check_storage(ds, part, file_size)
    dataset = ds.id
    array = np.empty(shape, dataset.dtype)  # the file's dtype, byte order included
    if array.size:
        dataset.read(h5s.ALL, h5s.ALL, array)
    return array


def stored_checksum(ds: DatasetRef, part: str, required: bool) -> int | None:
    """The dataset's `@crc32`; None when it has none and the format version needs none (v1.0, v1.1)."""
    if not required and not h5a.exists(ds.id, S.ATTR_CHECKSUM.encode()):
        return None
    return attr_int(ds, S.ATTR_CHECKSUM, part)


def verify_checksum(array: np.ndarray, expected: int | None, part: str) -> None:
    if expected is not None and S.checksum(array) != expected:
        raise SchemaError(part, "checksum mismatch")
