"""Names, dtype rules and limits of the trace format (v1); see docs/trace-format.md.

Everything the writer and the reader must agree on lives here, so a format change is
one visible diff. Strings are stored as fixed-length UTF-8 (never variable-length):
variable-length data goes to HDF5's shared global heap, which is both "object-typed"
and a structure every write would mutate, which is bad for crash safety.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import h5py

FORMAT_NAME = "tapml-trace"
FORMAT_VERSION = (1, 4)  # (major, minor): readers refuse a newer major, accept a newer minor
# 1.1 adds capture budgets: ops recorded with stats only (@stats_done, @stats) and meta["capture"]
# 1.2 adds a checksum (@crc32) on every dataset: each tensor and each text of /graph
# 1.3 adds /graph/tensor_index on a clean close: where each uncompressed tensor lies (trace/tensor_index.py)
# 1.4 adds /graph/weight_refs: params read from the safetensors checkpoint they came from (trace/weight_refs.py)

# HDF5 file-format bounds: 1.8-era objects (checksummed metadata, readable by any
# HDF5 >= 1.8), nothing newer, so a trace written here opens on older h5py builds.
LIBVER = ("v108", "v108")

# root attributes
ATTR_FORMAT = "format"
ATTR_VERSION_MAJOR = "version_major"
ATTR_VERSION_MINOR = "version_minor"
ATTR_COMPLETE = "complete"
ATTR_META = "meta"

# groups and datasets
GROUP_GRAPH = "graph"
DS_IR_JSON = "graph/ir_json"
DS_TVMSCRIPT = "graph/tvmscript"
DS_OP_TABLE = "graph/op_table"
DS_TENSOR_INDEX = "graph/tensor_index"  # v1.3, optional: JSON {"inputs"|"params": {name: entry}, "ops": {index: [entry]}}
TENSOR_INDEX_SINCE = (1, 3)
DS_WEIGHT_REFS = "graph/weight_refs"  # v1.4, optional: JSON, params stored as references to checkpoint files
WEIGHT_REFS_SINCE = (1, 4)
DS_WEIGHT_VIEWS = "graph/weight_views"  # v1.4, optional, on a clean close: ops whose value is a referenced param transposed
GROUP_INPUTS = "inputs"
GROUP_PARAMS = "params"
GROUP_OPS = "ops"

# attributes of a tensor dataset
ATTR_DTYPE = "dtype"
ATTR_STATS = "stats"
# attribute of every dataset (tensors and /graph texts), v1.2: CRC-32 (zlib) of its stored bytes
ATTR_CHECKSUM = "crc32"
CHECKSUM_SINCE = (1, 2)  # traces of this version or newer must carry it; older ones are read without

# attributes of an /ops/<index> group
ATTR_DONE = "done"
ATTR_NOTE = "note"
# what @note says of an op whose recorded value is not torch's own value for its FX node
HELPER_NOTE = "computed by tvm:llvm from recorded inputs (no FX node of its own)"
HOST_NOTE = "computed on the host (numpy, or torch for a matmul) from recorded inputs (no FX node of its own)"
CAST_NOTE_PREFIX = "cast:"  # "cast:float16": torch's value had this dtype; compare at its precision
# v1.1, only in traces recorded with a capture budget (--window / --max-bytes):
ATTR_STATS_DONE = "stats_done"  # uint8: 1 once the op's stats (and no tensors) are written
ATTR_OP_STATS = "stats"  # str: JSON list, one stats object per output, on stats-only ops

# meta key describing the capture budget (absent: every op's tensors are stored)
META_CAPTURE = "capture"
# meta key of the stock-import comparison (absent: not made, e.g. no import fix changes any node):
# {"fixes": [str], "nodes": int, "changed_ops": [op name], "error": str | null, "error_node": str | null,
#  "error_op": op name | null, "reason": str | null, "seconds": float}; "error" is the stock importer's
# one-line error when it fails outright (an import-error finding), "reason" the converter's own part of it
META_STOCK_IMPORT = "stock_import"
STOCK_ERROR_MAX_CHARS = 1000  # an import error is one line, cut to this length
# meta key of the ops TVM cannot import, run on the host in every replay (docs/host-only-ops.md):
# [{"index": int, "name": op name, "op": source op, "reason": one line}]; absent: none
META_HOST_ONLY = "host_only"
HOST_ONLY_REASON_MAX_CHARS = 200
# meta key saying the model was an unwrapped transformers causal LM, driven as generate() runs a prefill
# ({"class", "batch", "positions", "mask", "position_ids"}; absent: the model ran as build() returned it)
META_CAUSAL_LM = "causal_lm"
CAUSAL_LM_TEXT_MAX_CHARS = 200  # its "class" and "mask" texts: one line each
# meta key of a generation trace (`record --generate N`, frontend/generation.py): {"class": str,
# "prompt": int, "input": "tokens", "steps": [{"step": int, "kind": "prefill"|"decode",
# "positions": [start, end), "token": int}, ...]}; absent: one forward. Each op then has its "step".
META_GENERATION = "generation"

# dtypes stored as themselves (TVM spelling == numpy spelling)
NATIVE_DTYPES = frozenset(
    ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
# ml_dtypes float types with no HDF5 equivalent: stored as raw bits (uint of same width)
_BITS_CANDIDATES = (
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
)
BITS_DTYPES = {
    n: np.dtype(getattr(ml_dtypes, n)) for n in _BITS_CANDIDATES if hasattr(ml_dtypes, n)
}
_UINT_OF_SIZE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16)}

SUPPORTED_DTYPES = frozenset(NATIVE_DTYPES | set(BITS_DTYPES) | {"bool"})


# ---- limits the reader checks before it believes (or allocates) anything read from a file ----
MAX_JSON_DEPTH = 64  # nesting of any JSON text in a trace; the writer's deepest is ~10 (the graph)
MAX_NDIM = 32  # HDF5's (and TVM's) largest rank
MAX_DIM = 2**62  # one dimension of a declared shape (an op-table output, a graph type)
# A filtered (compressed) dataset may declare at most this many bytes per stored byte: deflate's
# best case is 1032:1, lzf's about 90:1. Bounds what a crafted header can make the reader allocate.
MAX_COMPRESSION_RATIO = 1100
# HDF5 filters a trace may use: the writer's (lzf, deflate) and HDF5's built-in shuffle/fletcher32.
# Any other is refused before it is read: HDF5 would search its plugin path for a shared library.
ALLOWED_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 32000: "lzf"}

# The op table: one JSON object per op. Keys and their types (see validate.py); readers fill the
# defaults of missing optional keys and drop keys they do not know (a newer minor may add some).
OP_REQUIRED_FIELDS = ("index", "name")
OP_OPTIONAL_FIELDS = {"op": "", "relax_op": "", "layer": "", "fx_node": "", "inputs": [], "outputs": [],
                      "is_tuple": False, "source_location": None, "stock_outputs": [], "step": None}
# An op's "step" (null, or an int >= 0): the generation step it belongs to (0 = the prefill), null outside
# a generation trace.
# An op's "stock_outputs" (a list of {"output": int, "shape": [int], "dtype": str}, default []): the outputs
# TVM's stock importer declares another type for than "outputs" (an import fix changed it; absent in traces
# recorded before it existed). The engine judges each as a type verdict (frontend/stock_import.py).
# Names (an op's, and the values it reads) are Relax / FX identifiers; the other op-table words
# (op, relax_op, layer, fx_node: "aten.add.Tensor", "<built-in function getitem>") are one line of
# text without quotes or backslashes. Nothing else is accepted, so a crafted op table cannot smuggle
# quotes, newlines or terminal escapes into a repro file, a message or the screen.
OP_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,255}"
OP_TEXT_PATTERN = r"[^\x00-\x1f\x7f-\x9f\"'\\\u2028\u2029\u202a-\u202e\u2066-\u2069]{0,256}"
# An op's "source_location" (null, or {"file": str, "line": int >= 1, "code": str}): the user's model line
# it came from; or a library's line (transformers' modeling_llama.py) with "library": the package's name
# and "user": the user's innermost frame above it in the same form, or null. Code holds quotes and
# backslashes, so its texts may too; never a control, line-break or
# bidi character (every renderer escapes the rest), and at most these many characters.
SOURCE_UNPRINTABLE = r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
SOURCE_FILE_MAX_CHARS = 4096
SOURCE_CODE_MAX_CHARS = 240


def checksum(data) -> int:
    """CRC-32 (zlib) of an array's bytes in C order: what `@crc32` holds. A CRC-32 detects every
    error burst of up to 32 bits, so every single-bit flip."""
    flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # no copy for a C-contiguous array
    return zlib.crc32(flat) & 0xFFFFFFFF


def itemsize(dtype_name: str) -> int:
    """Bytes per element of a trace dtype (bool: 1, float8_*: 1, bfloat16: 2, ...)."""
    if dtype_name == "bool":
        return 1
    if dtype_name in BITS_DTYPES:
        return BITS_DTYPES[dtype_name].itemsize
    if dtype_name in NATIVE_DTYPES:
        return np.dtype(dtype_name).itemsize
    raise DtypeError(f"unknown tensor dtype {dtype_name!r} in trace; upgrade tapml-dbg")


def spec_nbytes(spec: dict) -> int:
    """Bytes of a tensor described as {"shape": [...], "dtype": name} (an op table's outputs)."""
    count = 1
    for dim in spec["shape"]:
        count *= int(dim)
    return count * itemsize(spec["dtype"])


class DtypeError(ValueError):
    """A tensor's dtype cannot be stored in, or read from, a v1 trace."""


def to_storable(array) -> tuple[np.ndarray, str]:
    """Return (contiguous native-endian array HDF5 can hold, TVM dtype name). Bit exact."""
    return storage_view(normalized(array))


def normalized(array) -> np.ndarray:
    """The array C-contiguous and native-endian in its own dtype (a copy only when needed).

    Stats are computed on this form, so they do not depend on the layout the source produced
    (a transposed view sums in another order than its contiguous copy).
    """
    arr = np.asarray(array)
    if arr.dtype.name not in SUPPORTED_DTYPES:
        raise DtypeError(f"dtype {arr.dtype} cannot be stored in a trace (supported: "
                         f"{', '.join(sorted(SUPPORTED_DTYPES))})")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return _c_contiguous(arr)


def storage_view(arr: np.ndarray) -> tuple[np.ndarray, str]:
    """A `normalized` array as the dataset HDF5 holds (a view, no copy), and its dtype name."""
    name = arr.dtype.name
    if name == "bool":
        return arr.view(np.uint8), name
    if name in BITS_DTYPES:
        return arr.view(_UINT_OF_SIZE[arr.dtype.itemsize]), name
    return arr, name


def storage_dtype(dtype_name: str) -> np.dtype:
    """The numpy dtype a tensor of `dtype_name` is stored as (what its dataset must hold)."""
    if dtype_name == "bool":
        return np.dtype(np.uint8)
    if dtype_name in BITS_DTYPES:
        return _UINT_OF_SIZE[BITS_DTYPES[dtype_name].itemsize]
    if dtype_name in NATIVE_DTYPES:
        return np.dtype(dtype_name)
    raise DtypeError(f"unknown tensor dtype {dtype_name!r} in trace; upgrade tapml-dbg")


def from_stored(array, dtype_name: str) -> np.ndarray:
    """Invert `to_storable`: turn the stored array back into `dtype_name`, bit exact."""
    arr = np.asarray(array)
    if dtype_name == "bool":
        _expect(arr, np.dtype(np.uint8), dtype_name)
        return arr != 0
    if dtype_name in BITS_DTYPES:
        want = BITS_DTYPES[dtype_name]
        _expect(arr, _UINT_OF_SIZE[want.itemsize], dtype_name)
        return _c_contiguous(arr).view(want)
    if dtype_name in NATIVE_DTYPES:
        want = np.dtype(dtype_name)
        _expect(arr, want, dtype_name)
        return arr if arr.dtype.isnative else arr.astype(want)
    raise DtypeError(f"unknown tensor dtype {dtype_name!r} in trace; upgrade tapml-dbg")


def _c_contiguous(arr: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _expect(arr: np.ndarray, storage: np.dtype, dtype_name: str) -> None:
    if arr.dtype.newbyteorder("=") != storage:
        raise DtypeError(f"tensor declared {dtype_name!r} is stored as {arr.dtype} "
                         f"(expected {storage}); the trace is corrupt")


def encode_str(text: str, capacity: int = 0) -> np.ndarray:
    """A scalar fixed-length UTF-8 string of at least `capacity` bytes (NUL padded)."""
    data = text.encode("utf-8")
    size = max(1, len(data), capacity)
    return np.array(data, dtype=h5py.string_dtype("utf-8", size))


def decode_str(value) -> str:
    """Read back an `encode_str` attribute (h5py gives bytes for fixed-length strings)."""
    if isinstance(value, np.ndarray):
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).rstrip(b"\0").decode("utf-8")
    return str(value)


# ---- the source graph (v1.2; owned by the source-reference work: trace/source_graph.py) ----------
# A torch source's decomposed FX graph as data-only JSON (docs/trace-format.md "The source graph").
# Absent in v1.0/1.1 traces and in traces recorded with --source tvm:TARGET.
DS_SOURCE_GRAPH = "graph/source_graph"
SOURCE_GRAPH_SINCE = (1, 2)  # the format version that adds it
# @note of an op whose imported type differs from the source's value (the value stored is the source's)
TYPE_NOTE_PREFIX = "source type:"  # "source type: float32 (2, 3); the import declares int64 (2, 3)"


TVM_SOURCE_PREFIX = "tvm:"  # meta "source" of a trace recorded on a TVM target: tvm:TARGET


def tvm_source_target(source: str) -> str | None:
    """The TVM target a trace's source names (`tvm:llvm` -> `llvm`); None for torch."""
    return source[len(TVM_SOURCE_PREFIX):] if source.startswith(TVM_SOURCE_PREFIX) else None
