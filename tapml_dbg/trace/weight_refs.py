"""Weights by reference (v1.4): params read from the safetensors checkpoint they were loaded from.

A model loaded with `from_pretrained` already has its weights on disk; copying them into every trace
made a 1.1B Llama's trace 9.7 GiB. A param whose bytes equal a checkpoint tensor's is stored as a
reference instead (`/graph/weight_refs`, a JSON text): the file, the tensor's name, its dtype and
shape, the SHA-256 and the CRC-32 of its bytes. Replay reads the tensor from the file with one
positioned read and checks its CRC-32 (as a stored tensor's), `info --verify` its SHA-256. A reader
keeps the params that ops transpose (a linear's weight; up to `TAPML_WEIGHT_CACHE_MIB`): the weight
and its transpose read the file once.

A checkpoint is untrusted input like a trace: its safetensors header is parsed here as data (JSON,
bounded, every offset checked against the file), nothing in it unpickled or run. A file that
moved is looked for by its name in the folders of `TAPML_WEIGHTS`; one missing or changed is a one-line error that
says what to do.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from tapml_dbg import settings
from tapml_dbg.errors import TraceError
from tapml_dbg.trace import schema as S

FORMAT = "tapml-weight-refs"
VERSION = 1
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is refused (the format's own limit)
# safetensors dtype codes -> trace dtype names
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}
WHAT_TO_DO = ("put the checkpoint back where it was recorded, or set TAPML_WEIGHTS to the folder that holds it, "
              "or record the model again")


class WeightFileError(TraceError):
    """A referenced checkpoint file is missing, unreadable or changed since the recording."""


@dataclass(frozen=True)
class TensorSpan:
    """One tensor of a safetensors file: its trace dtype, shape and byte range in the file."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """A safetensors file's header, parsed and checked as data; tensors read by name with `pread`."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise WeightFileError(f"cannot read the checkpoint {path} ({exc.strerror}); {WHAT_TO_DO}") from None
        try:
            self.size = os.fstat(self._fd).st_size
            self.tensors = self._header()
        except BaseException:
            self.close()
            raise

    def _header(self) -> dict[str, TensorSpan]:
        head = os.pread(self._fd, 8, 0)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, self.size - 8):
            raise self._bad("its header length is out of range")
        try:
            header = json.loads(os.pread(self._fd, length, 8).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise self._bad("its header is not JSON") from None
        if not isinstance(header, dict):
            raise self._bad("its header is not a JSON object")
        start = 8 + length
        return {name: self._span(name, item, start) for name, item in header.items() if name != "__metadata__"}

    def _span(self, name, item, start: int) -> TensorSpan:
        if not isinstance(item, dict) or item.get("dtype") not in SAFETENSORS_DTYPES:
            raise self._bad(f"tensor {str(name)[:80]!r} has no dtype this tool reads")
        shape, offsets = item.get("shape"), item.get("data_offsets")
        if not (_ints(shape, S.MAX_NDIM, S.MAX_DIM) and _ints(offsets, 2, 2**63) and len(offsets) == 2):
            raise self._bad(f"tensor {str(name)[:80]!r} has a malformed shape or offsets")
        dtype = SAFETENSORS_DTYPES[item["dtype"]]
        begin, end = start + offsets[0], start + offsets[1]
        if end - begin != math.prod(shape) * S.itemsize(dtype) or end > self.size:
            raise self._bad(f"tensor {str(name)[:80]!r} does not lie in the file")
        return TensorSpan(dtype, tuple(shape), begin, end)

    def _bad(self, why: str) -> WeightFileError:
        return WeightFileError(f"the checkpoint {self.path} is not a safetensors file this tool reads ({why}); "
                               f"{WHAT_TO_DO}")

    def read_bytes(self, span: TensorSpan) -> np.ndarray:
        """The tensor's bytes (uint8), read with one positioned read."""
        buffer = np.empty(span.end - span.begin, np.uint8)
        self.read_into(span, 0, buffer)
        return buffer

    def read_into(self, span: TensorSpan, offset: int, buffer: np.ndarray) -> None:
        """`buffer.size` bytes of the tensor from its byte `offset` on, with one positioned read."""
        if buffer.size and os.preadv(self._fd, [buffer], span.begin + offset) != buffer.size:
            raise WeightFileError(f"the checkpoint {self.path} is shorter than its header says; {WHAT_TO_DO}")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def as_tensor(data: np.ndarray, dtype: str, shape) -> np.ndarray:
    """A tensor's little-endian bytes (as safetensors stores them) as the trace dtype, bit exact."""
    stored = S.storage_dtype(dtype).newbyteorder("<")
    return S.from_stored(data.view(stored).reshape(tuple(shape)), dtype)


def digests(data: np.ndarray) -> tuple[str, int]:
    """The SHA-256 (hex) and CRC-32 of a tensor's bytes."""
    return hashlib.sha256(data).hexdigest(), S.checksum(data)


# ---- the format: /graph/weight_refs -------------------------------------------------------------
@dataclass(frozen=True)
class WeightRef:
    """One referenced param: the file (an index into the files) and the tensor it reads."""

    file: int
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str
    crc32: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * S.itemsize(self.dtype)

    def to_json(self) -> dict:
        return {"file": self.file, "tensor": self.tensor, "dtype": self.dtype, "shape": list(self.shape),
                "sha256": self.sha256, "crc32": self.crc32}


@dataclass(frozen=True)
class WeightFile:
    """A checkpoint file as recorded: its absolute path and size in bytes."""

    path: str
    bytes: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def refs_json(files: list[WeightFile], params: dict[str, WeightRef]) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION,
                       "files": [{"path": f.path, "bytes": f.bytes} for f in files],
                       "params": {name: ref.to_json() for name, ref in params.items()}})


def parse_refs(data, part: str) -> tuple[list[WeightFile], dict[str, WeightRef]]:
    """The parsed JSON of /graph/weight_refs, checked: raises a SchemaError-like TraceError on any violation."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("version"), int):
        raise TraceError(f"{part} is not a weight-reference table; record the model again")
    if data["version"] > VERSION:
        raise TraceError(f"{part} is of a newer version ({data['version']}); upgrade tapml-dbg")
    files_json, params_json = data.get("files"), data.get("params")
    if not isinstance(files_json, list) or not isinstance(params_json, dict):
        raise TraceError(f"{part} is corrupt (files or params missing); record the model again")
    files = []
    for item in files_json:
        if not (isinstance(item, dict) and isinstance(item.get("path"), str) and _count(item.get("bytes"), 2**63)):
            raise TraceError(f"{part} is corrupt (a file entry is malformed); record the model again")
        files.append(WeightFile(item["path"], item["bytes"]))
    return files, {name: _ref(name, item, len(files), part) for name, item in params_json.items()}


def _ref(name: str, item, files: int, part: str) -> WeightRef:
    ok = (isinstance(item, dict) and _count(item.get("file"), files) and isinstance(item.get("tensor"), str)
          and item.get("dtype") in S.SUPPORTED_DTYPES and _ints(item.get("shape"), S.MAX_NDIM, S.MAX_DIM)
          and isinstance(item.get("sha256"), str) and len(item["sha256"]) == 64 and _count(item.get("crc32"), 2**32))
    if not ok:
        raise TraceError(f"{part} is corrupt (param {name[:80]!r}'s entry is malformed); record the model again")
    return WeightRef(item["file"], item["tensor"], item["dtype"], tuple(item["shape"]), item["sha256"], item["crc32"])


def _ints(value, length: int, limit: int) -> bool:
    return isinstance(value, list) and len(value) <= length and all(_count(n, limit) for n in value)


def _count(value, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit


# ---- reading them back --------------------------------------------------------------------------
@dataclass
class FileStatus:
    """Where a referenced file is now: `found` (the path it was found at, None: missing) and whether its
    size is still the recorded one."""

    path: str
    bytes: int
    params: int
    found: str | None
    same_size: bool

    @property
    def ok(self) -> bool:
        return self.found is not None and self.same_size

    def problem(self) -> str:
        if self.found is None:
            return f"the checkpoint {self.path} the trace reads its weights from does not exist; {WHAT_TO_DO}"
        return (f"the checkpoint {self.found} changed since the recording (it holds {os.path.getsize(self.found)} "
                f"bytes, not {self.bytes}); {WHAT_TO_DO}")


def _cache_bytes() -> int:
    return int(settings.value(settings.WEIGHT_CACHE_MIB) * 2**20)


@dataclass
class WeightRefs:
    """The referenced params of one open trace; opens their files on first use (one reader's life).
    The params that ops transpose are kept once read (read-only, least recently used first out) while
    they fit in `max_bytes` (`TAPML_WEIGHT_CACHE_MIB`): a weight and its transpose read the file once."""

    files: list[WeightFile]
    params: dict[str, WeightRef]
    max_bytes: int = field(default_factory=_cache_bytes)
    file_reads: int = 0  # tensors read from the files (a kept one is not read again)
    _open: dict[int, SafetensorsFile] = field(default_factory=dict)
    _verified: set[WeightRef] = field(default_factory=set)  # tensors whose CRC-32 matched in this reader
    _kept: OrderedDict = field(default_factory=OrderedDict)  # WeightRef -> its array, read-only
    _kept_bytes: int = 0
    _stream: np.ndarray | None = None  # the buffer a streamed transpose reads into (STREAM_BYTES)
    # a worker's read-ahead thread may still be in a read when the worker reads: the buffer, the kept
    # weights and the checks are one thread's at a time
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def status(self) -> list[FileStatus]:
        counts = [0] * len(self.files)
        for ref in self.params.values():
            counts[ref.file] += 1
        result = []
        for number, recorded in enumerate(self.files):
            found = locate(recorded)
            same = found is not None and os.path.getsize(found) == recorded.bytes
            result.append(FileStatus(recorded.path, recorded.bytes, counts[number], found, same))
        return result

    def require(self) -> None:
        """Raise the one-line error of the first referenced file that is missing or of another size."""
        for status in self.status():
            if not status.ok:
                raise WeightFileError(status.problem())

    def read(self, name: str, keep: bool = True) -> np.ndarray:
        """Param `name` from its checkpoint, its CRC-32 checked (once per reader). Where `keep` (a param
        that ops transpose), it is kept while it fits and handed to every caller, read-only."""
        with self._lock:
            return self._param(name, keep)

    def transposed(self, name: str, axes: tuple[int, ...]) -> np.ndarray:
        """Param `name` transposed (an op's value that is a view of it), C-contiguous: made from the
        kept param where there is one (or room to keep it), else a linear's weight is streamed from
        the file through a small buffer, transposed as it comes (no copy of the weight held)."""
        with self._lock:
            return self._transposed(name, axes)

    def _param(self, name: str, keep: bool) -> np.ndarray:
        ref = self.params[name]
        value = self._kept.get(ref)  # (a tied param's other name has an equal ref: shared too)
        if value is not None:
            self._kept.move_to_end(ref)
            return value
        value = self._read(name, ref)
        if keep and value.nbytes <= self.max_bytes:
            value.flags.writeable = False
            self._keep(ref, value)
        return value

    def _transposed(self, name: str, axes: tuple[int, ...]) -> np.ndarray:
        ref = self.params[name]
        if ref in self._kept or ref.nbytes <= self.max_bytes:
            return transposed(self._param(name, True), axes)
        if len(ref.shape) != 2 or tuple(axes) != (1, 0):
            return transposed(self._read(name, ref), axes)
        return self._streamed_transpose(name, ref)

    def _read(self, name: str, ref: WeightRef) -> np.ndarray:
        data = self._bytes(name, ref)
        self.file_reads += 1
        if ref not in self._verified:
            if S.checksum(data) != ref.crc32:
                raise self._changed(name, ref)
            self._verified.add(ref)
        return as_tensor(data, ref.dtype, ref.shape)

    def _streamed_transpose(self, name: str, ref: WeightRef) -> np.ndarray:
        """A 2-D weight transposed, read by blocks of rows into a buffer that stays in cache (a re-read
        from the OS's page cache costs less than holding the weight: figures in docs/perf.md); its
        CRC-32 checked on the way where this reader has not checked it yet."""
        source, span = self._span_of(name, ref)
        rows, cols = ref.shape
        stored = S.storage_dtype(ref.dtype).newbyteorder("<")
        row_bytes = cols * stored.itemsize
        step = max(1, STREAM_BYTES // max(row_bytes, 1))
        if self._stream is None or self._stream.size < step * row_bytes:
            self._stream = np.empty(step * row_bytes, np.uint8)
        out = np.empty((cols, rows), stored)
        crc = 0
        for start in range(0, rows, step):
            chunk = self._stream[:min(step, rows - start) * row_bytes]
            source.read_into(span, start * row_bytes, chunk)
            crc = zlib.crc32(chunk, crc) if ref not in self._verified else crc
            transpose_rows_into(out, chunk.view(stored).reshape(-1, cols), start)
        self.file_reads += 1
        if ref not in self._verified:
            if crc & 0xFFFFFFFF != ref.crc32:
                raise self._changed(name, ref)
            self._verified.add(ref)
        return S.from_stored(out, ref.dtype)

    def _keep(self, ref: WeightRef, value: np.ndarray) -> None:
        self._kept[ref] = value
        self._kept_bytes += value.nbytes
        while self._kept_bytes > self.max_bytes:
            _key, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= dropped.nbytes

    def verify(self, name: str) -> None:
        """Read param `name` and check its SHA-256 (`info --verify`)."""
        ref = self.params[name]
        if hashlib.sha256(self._bytes(name, ref)).hexdigest() != ref.sha256:
            raise self._changed(name, ref)

    def _bytes(self, name: str, ref: WeightRef) -> np.ndarray:
        source, span = self._span_of(name, ref)
        return source.read_bytes(span)

    def _span_of(self, name: str, ref: WeightRef) -> tuple[SafetensorsFile, TensorSpan]:
        source = self._file(ref.file)
        span = source.tensors.get(ref.tensor)
        if span is None or span.dtype != ref.dtype or span.shape != ref.shape:
            raise self._changed(name, ref, "no longer holds")
        return source, span

    def _file(self, number: int) -> SafetensorsFile:
        if number not in self._open:
            status = self.status()[number]
            if not status.ok:
                raise WeightFileError(status.problem())
            self._open[number] = SafetensorsFile(status.found)
        return self._open[number]

    def _changed(self, name: str, ref: WeightRef, how: str = "holds other bytes for") -> WeightFileError:
        path = self._open[ref.file].path if ref.file in self._open else self.files[ref.file].path
        return WeightFileError(f"the checkpoint {path} changed since the recording: it {how} tensor "
                               f"{ref.tensor!r} (param {name!r}); {WHAT_TO_DO}")

    def close(self) -> None:
        for source in self._open.values():
            source.close()
        self._open.clear()
        self._kept.clear()
        self._kept_bytes = 0
        self._stream = None


def locate(recorded: WeightFile) -> str | None:
    """Where a referenced file is now: its recorded path, else its name in a folder of TAPML_WEIGHTS."""
    if os.path.isfile(recorded.path):
        return recorded.path
    for folder in settings.value(settings.WEIGHTS):
        candidate = os.path.join(folder, recorded.name)
        if os.path.isfile(candidate):
            return candidate
    return None


# ---- weight views: op values that are a referenced param, transposed ------------------------------
# A linear layer decomposes into `permute(weight)` then `mm`: the permute's recorded value is the weight
# again, as large. An op that only transposes a referenced param is stored as that view (written on a
# clean close as /graph/weight_views: {"<op index>": {"param": name, "axes": [int]}}), not as a copy.
PERMUTE_OPS = frozenset({"relax.permute_dims"})
MAX_VIEW_NDIM = 4  # permutations tried (by shape first): 4! at most


def view_of(op: dict, outputs: list, params: dict[str, np.ndarray]) -> dict | None:
    """{"param", "axes"} when op's one output is exactly a referenced param transposed, else None."""
    inputs = op.get("inputs") or []
    if op.get("relax_op") not in PERMUTE_OPS or len(outputs) != 1 or len(inputs) != 1 or inputs[0] not in params:
        return None
    param, value = params[inputs[0]], np.asarray(outputs[0])
    if param.ndim != value.ndim or param.ndim > MAX_VIEW_NDIM or param.dtype != value.dtype or value.size == 0:
        return None
    for axes in itertools.permutations(range(param.ndim)):
        view = param.transpose(axes)
        if view.shape == value.shape and np.array_equal(S.storage_view(S.normalized(view))[0],
                                                        S.storage_view(S.normalized(value))[0]):
            return {"param": inputs[0], "axes": list(axes)}
    return None


def parse_views(data, ops: int, params: dict[str, WeightRef], part: str) -> dict[int, tuple[str, tuple[int, ...]]]:
    """The parsed JSON of /graph/weight_views, checked against the op table's size and the referenced params."""
    if not isinstance(data, dict):
        raise TraceError(f"{part} is corrupt (not a JSON object); record the model again")
    views = {}
    for key, item in data.items():
        ok = (isinstance(key, str) and key.isdigit() and int(key) < ops and isinstance(item, dict)
              and item.get("param") in params and isinstance(item.get("axes"), list)
              and sorted(item["axes"]) == list(range(len(params[item["param"]].shape))))
        if not ok:
            raise TraceError(f"{part} is corrupt (op {str(key)[:20]}'s entry is malformed); record the model again")
        views[int(key)] = (item["param"], tuple(item["axes"]))
    return views


TRANSPOSE_BLOCK_BYTES = 64  # one cache line of each output row per block (figures: docs/perf.md)
STREAM_BYTES = 2**20  # a streamed transpose reads this much of the weight at a time (it stays in L2)


def transposed(value: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """`value.transpose(axes)`, C-contiguous; a 2-D weight copied by blocks of rows, each block writing
    one cache line of every output row (numpy's plain transposed copy strides across the whole output)."""
    if value.ndim != 2 or tuple(axes) != (1, 0):
        return np.ascontiguousarray(value.transpose(axes))
    out = np.empty(value.shape[::-1], value.dtype)
    transpose_rows_into(out, value, 0)
    return out


def transpose_rows_into(out: np.ndarray, rows: np.ndarray, start: int) -> None:
    """out[:, start:start + len(rows)] = rows.T, by blocks of rows (see TRANSPOSE_BLOCK_BYTES)."""
    block = max(1, TRANSPOSE_BLOCK_BYTES // max(rows.itemsize, 1))
    for first in range(0, rows.shape[0], block):
        last = min(first + block, rows.shape[0])
        out[:, start + first:start + last] = rows[first:last].T
