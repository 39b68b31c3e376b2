"""The source graph of a trace as data: read and validated, never evaluated (trace format v1.2).

A torch source's decomposed FX graph is stored as JSON (`/graph/source_graph`, documented in
docs/trace-format.md "The source graph"): for every FX node its target by name and its args and
kwargs, where references to other nodes, inputs and params are tagged objects and torch values
(dtypes, memory formats, layouts, devices) are names. This module turns that text into plain
dataclasses and refuses anything it does not know: a target outside `ALLOWED_TARGETS`, an
unknown tag, a reference to a node that is not defined before it, structures deeper or larger
than the limits below. Nothing here imports torch, evaluates text or unpickles: the source
runner (`host/source_runner.py`) maps the validated names onto `torch.ops.aten` itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field

import ml_dtypes  # a dependency of tvm: the float types numpy lacks (bfloat16, float8)
import numpy as np

from tapml_dbg.errors import TraceError
from tapml_dbg.model.graph import TensorSpec

FORMAT = "tapml-source-graph"
VERSION = 1
MAX_JSON_BYTES = 256 * 2**20  # a source graph larger than this is refused unread
MAX_NODES = 1_000_000
MAX_DEPTH = 12  # nesting of lists / tuples / tagged objects inside one argument
MAX_ITEMS = 1 << 20  # elements of one list argument
MAX_NAME_CHARS = 512

# core ATen (torch.Tag.core, torch 2.13) plus the non-core ops torch.export's decomposition
# leaves in a graph; backward and symbolic-shape ops are left out
ALLOWED_ATEN_OPS = frozenset("""
_adaptive_avg_pool2d _adaptive_avg_pool3d _cdist_forward _embedding_bag _fft_c2r _fft_r2c _log_softmax
_native_batch_norm_legit _native_batch_norm_legit_no_training _pdist_forward _softmax _to_copy abs acos
acosh add addmm alias amax amin any arange argmax argmin as_strided asin asinh atan atan2 atanh
avg_pool2d avg_pool3d bitwise_and bitwise_not bitwise_or bitwise_xor bmm cat ceil clamp clone col2im
constant_pad_nd convolution copy cos cosh cumsum diagonal div elu embedding empty empty_strided eq erf
exp expand expm1 fill flip floor fmod full full_like gather ge gelu grid_sampler_2d gt hardtanh histc index
index_put index_select isinf isnan le leaky_relu log log10 log1p log2 logical_and logical_not logical_or
logical_xor lt masked_scatter max max_pool2d_with_indices max_pool3d_with_indices maximum mean min
minimum mm mul native_dropout native_group_norm native_layer_norm ne neg nonzero permute pow prod rand
randn randperm reciprocal reflection_pad1d reflection_pad2d reflection_pad3d relu remainder repeat
replication_pad2d replication_pad3d round rsqrt scalar_tensor scatter scatter_add scatter_reduce select
select_scatter sigmoid sign sin sinh slice slice_scatter sort split_with_sizes sqrt squeeze sub sum tan
tanh topk trunc unsqueeze upsample_bilinear2d upsample_nearest2d var view where
_assert_tensor_metadata _unsafe_view lift_fresh_copy detach t empty_like new_empty empty_permuted
zeros zeros_like ones ones_like new_zeros new_ones new_full reshape contiguous unbind split
""".split())
GETITEM = "operator.getitem"  # tuple indexing, the one non-aten target the recorder emits
# custom ops (torch.library) a model's export may hold, each with the module whose import registers
# it: the host runs them (docs/host-only-ops.md), resolved by name on torch.ops, never evaluated
ALLOWED_CUSTOM_OPS = {"transformers.grouped_mm_fallback.default": "transformers.integrations.moe"}
ALLOWED_TARGETS_TEXT = ("torch.ops.aten overloads of core ATen ops, operator.getitem, and the custom ops "
                        + ", ".join(sorted(ALLOWED_CUSTOM_OPS)))
_KEYWORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_ATEN_TARGET = re.compile(r"^aten\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")

# torch values an argument may name (the runner maps each onto torch's own object)
DTYPES = frozenset(["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                    "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32",
                    "uint64"])
CONSTANT_DTYPES = {"bool": "bool", "uint8": "u1", "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
                   "float16": "f2", "float32": "f4", "float64": "f8",
                   # dtypes numpy lacks (ml_dtypes, a dependency of tvm): their raw bits, as in /ops
                   "bfloat16": "u2", "float8_e4m3fn": "u1", "float8_e5m2": "u1"}
RAW_BITS_CONSTANTS = frozenset(["bfloat16", "float8_e4m3fn", "float8_e5m2"])
MEMORY_FORMATS = frozenset(["contiguous_format", "channels_last", "channels_last_3d", "preserve_format"])
LAYOUTS = frozenset(["strided"])
_DEVICE = re.compile(r"^(cpu|cuda|meta|mps|xpu)(:[0-9]{1,4})?$")
NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

# what a placeholder is in the trace. constant: a buffer the import folded into the IR (batch-norm
# running stats), its value stored in the source graph itself; absent: one the trace holds no value of
INPUT, PARAM, CONSTANT, ABSENT = "input", "param", "constant", "absent"
PLACEHOLDER_KINDS = (INPUT, PARAM, CONSTANT, ABSENT)
MAX_CONSTANT_BYTES = 16 * 2**20  # constants stored in a source graph, in all (larger ones stay absent)

# ops whose value is uninitialised memory: no reference, never judged (docs/tolerance.md)
UNDEFINED_OPS = frozenset(["empty", "empty_strided", "empty_like", "new_empty", "empty_permuted"])
RANDOM_OPS = frozenset(["rand", "randn", "randperm", "native_dropout"])


@dataclass(frozen=True)
class Ref:
    """A reference to a value: another node (`node`) or a placeholder (`input` / `param`), by name."""

    kind: str
    name: str


@dataclass(frozen=True)
class TorchName:
    """A torch value named by a string: kind is dtype | memory_format | layout | device."""

    kind: str
    name: str


@dataclass(frozen=True)
class Opaque:
    """An argument the recorder could not express as data (a symbolic int, say): the node cannot run."""

    what: str


@dataclass
class SourceNode:
    """One FX node: `target` by name (None for a node that cannot be re-executed, see `opaque`)."""

    name: str
    target: str | None
    args: list
    kwargs: dict
    val: object = None  # TensorMeta, a list of them (a tuple value), or None
    opaque: str = ""  # why the node cannot be re-executed ("" when it can)

    @property
    def aten_name(self) -> str:
        """`view` for `aten.view.default`; "" for getitem or an opaque node."""
        match = _ATEN_TARGET.match(self.target or "")
        return match.group(1) if match else ""

    @property
    def undefined(self) -> bool:
        """Its value is uninitialised memory (torch.empty and friends) or random."""
        return self.aten_name in UNDEFINED_OPS or self.aten_name in RANDOM_OPS


@dataclass(frozen=True)
class TensorMeta:
    """What torch.export says of a node's tensor value: dtype, shape and memory layout (strides)."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None  # None: not stored (contiguous assumed)

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype)


@dataclass(frozen=True)
class OpValue:
    """Which FX node value an op of the op table holds: the node's value, or a path into its tuple."""

    node: str
    index: tuple[int, ...] | None


@dataclass(frozen=True)
class TypeChange:
    """An op output whose declared (imported) type differs from what the source computed.

    `stock`: the import fixes that hide it (frontend/fixes.py): TVM's stock importer declares
    `declared` where the recorded import declares `imported`; "" for a change of the recorded import
    itself (the target computes in `declared`, and replay casts the recorded value to it)."""

    op: str
    output: int
    declared: TensorSpec
    source: TensorSpec
    stock: str = ""
    imported: TensorSpec | None = None

    @property
    def widens(self) -> bool:
        """Only the float width grows (float16 -> float32): every source value is held exactly."""
        return (self.declared.shape == self.source.shape and self.declared.dtype in _WIDER_FLOATS.get(
            self.source.dtype, ()))

    @property
    def what(self) -> str:
        """"dtype", "shape" or "dtype and shape"."""
        parts = [name for name, differs in (("dtype", self.declared.dtype != self.source.dtype),
                                            ("shape", self.declared.shape != self.source.shape)) if differs]
        return " and ".join(parts)

    def describe(self) -> str:
        if self.stock:
            same_shape = self.declared.shape == self.source.shape == (self.imported or self.source).shape
            text = (lambda spec: spec.dtype) if same_shape else spec_text
            return (f"the stock import declares {text(self.declared)} where the source computed "
                    f"{text(self.source)} (tapml-dbg's {self.stock} workaround imports it as "
                    f"{text(self.imported or self.source)})")
        return (f"the import declares {spec_text(self.declared)} but the source computed "
                f"{spec_text(self.source)}")


_WIDER_FLOATS = {"float16": ("float32", "float64"), "bfloat16": ("float32", "float64"), "float32": ("float64",)}


def stock_type_changes(ops, changes: list[TypeChange], fixes: list[str]) -> list[TypeChange]:
    """The type changes TVM's stock importer makes where the recorded import does not (ops' `stock_outputs`,
    frontend/stock_import.py), against what the source computed: an output the recorded import changes
    already (`changes`) is that change's; one whose stock type is the source's is no change.
    `fixes`: the import fixes that hide them (meta `stock_import`)."""
    changed = {(c.op, c.output): c for c in changes}
    found = []
    for op in ops:
        for output, stock in op.stock_outputs:
            if (op.name, output) in changed or output >= len(op.outputs):
                continue
            imported = op.outputs[output]
            if stock != imported:
                found.append(TypeChange(op.name, output, stock, imported, ", ".join(fixes) or "import", imported))
    return found


@dataclass
class SourceGraph:
    """The validated source graph of one trace."""

    placeholders: dict[str, tuple[str, str]]  # FX placeholder name -> (kind, trace input/param name)
    nodes: list[SourceNode]
    outputs: list
    op_values: dict[str, OpValue]  # op name -> the FX value it holds
    type_changes: list[TypeChange] = field(default_factory=list)
    placeholder_meta: dict[str, object] = field(default_factory=dict)  # FX placeholder -> TensorMeta or None
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # FX placeholder -> its stored value
    by_name: dict[str, SourceNode] = field(default_factory=dict)

    def __post_init__(self):
        self.by_name = {node.name: node for node in self.nodes}

    def type_changes_of(self, op: str) -> list[TypeChange]:
        return [change for change in self.type_changes if change.op == op]


def spec_text(spec: TensorSpec) -> str:
    return f"{spec.dtype} {tuple(spec.shape)}"


# ---------------------------------------------------------------------------- reading
def parse_source_graph(text: str, where: str = "the trace") -> SourceGraph:
    """Validate and decode a stored source graph; a TraceError that says what is wrong otherwise."""
    if len(text) > MAX_JSON_BYTES:
        raise _bad(where, f"it is larger than {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise _bad(where, f"it is not valid JSON ({exc})") from exc
    return _Decoder(where).graph(data)


def _refuse_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def _bad(where: str, why: str) -> TraceError:
    return TraceError(f"{where}: the source graph is refused: {why}; the trace was not written by "
                      f"`tapml-dbg record` or is corrupt (record it again)")


class _Decoder:
    def __init__(self, where: str):
        self.where = where
        self.defined: set[str] = set()
        self.placeholders: dict[str, tuple[str, str]] = {}
        self.placeholder_meta: dict[str, object] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.constant_bytes = 0

    def fail(self, why: str) -> TraceError:
        return _bad(self.where, why)

    def graph(self, data) -> SourceGraph:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise self.fail(f"its format is not {FORMAT!r}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise self.fail("it has no version")
        if version > VERSION:
            raise TraceError(f"{self.where}: the source graph is version {version}, newer than this "
                             f"tapml-dbg reads ({VERSION}); upgrade tapml-dbg")
        for item in self.items(data.get("placeholders"), "placeholders"):
            name = self.name(self.field(item, "name"))
            kind = self.field(item, "kind")
            if not isinstance(kind, str) or kind not in PLACEHOLDER_KINDS:
                raise self.fail(f"placeholder {name!r} has an unknown kind {kind!r}")
            self.placeholders[name] = (kind, self.name(self.field(item, "trace_name")))
            self.placeholder_meta[name] = self.val(item.get("val"), 0)
            if kind == CONSTANT:
                self.constants[name] = self.constant(self.field(item, "value"))
            self.defined.add(name)
        nodes = [self.node(item) for item in self.items(data.get("nodes"), "nodes", MAX_NODES)]
        outputs = self.value(data.get("outputs", []), 0)
        op_values = {}
        ops = data.get("ops", {})
        if not isinstance(ops, dict):
            raise self.fail("its op map is not an object")
        for op, entry in ops.items():
            node = self.name(self.field(entry, "node"))
            if node not in self.defined:
                raise self.fail(f"op {op!r} names an unknown node {node!r}")
            index = entry.get("index")
            if index is not None:
                if not isinstance(index, list) or len(index) > MAX_DEPTH or \
                        not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in index):
                    raise self.fail(f"op {op!r} has a bad tuple index {index!r}")
                index = tuple(index)
            op_values[self.name(op)] = OpValue(node, index)
        changes = [self.type_change(item) for item in self.items(data.get("type_changes", []), "type_changes")]
        return SourceGraph(self.placeholders, nodes, outputs, op_values, changes, self.placeholder_meta,
                           self.constants)

    def node(self, item) -> SourceNode:
        name = self.name(self.field(item, "name"))
        if name in self.defined:
            raise self.fail(f"node {name!r} is defined twice")
        target = item.get("target")
        opaque = item.get("opaque", "")
        if not isinstance(opaque, str) or len(opaque) > MAX_NAME_CHARS:
            raise self.fail(f"node {name!r} has a bad opaque marker")
        if target is not None:
            self.check_target(name, target)
        elif not opaque:
            raise self.fail(f"node {name!r} has no target")
        args, kwargs = item.get("args", []), item.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise self.fail(f"node {name!r}: args must be a list and kwargs an object")
        for key in kwargs:
            if not isinstance(key, str) or not _KEYWORD.match(key):
                raise self.fail(f"node {name!r} has a bad keyword {key!r}")
        args = self.value(args, 0)
        kwargs = {key: self.value(value, 1) for key, value in kwargs.items()}
        val = self.val(item.get("val"), 0)
        self.defined.add(name)
        if not opaque and any(isinstance(v, Opaque) for v in _walk([args, kwargs])):
            opaque = "an argument is not expressible as data"
        return SourceNode(name, target, args, kwargs, val, opaque)

    def check_target(self, node: str, target) -> None:
        if not isinstance(target, str) or len(target) > MAX_NAME_CHARS:
            raise self.fail(f"node {node!r} has a bad target")
        if target == GETITEM or target in ALLOWED_CUSTOM_OPS:
            return
        match = _ATEN_TARGET.match(target)
        if match is None:
            raise self.fail(f"node {node!r} calls {target!r}, which is not one of the "
                            f"{ALLOWED_TARGETS_TEXT}")
        if match.group(1) not in ALLOWED_ATEN_OPS:
            raise self.fail(f"node {node!r} calls {target!r}, an aten op outside the allowlist "
                            f"({ALLOWED_TARGETS_TEXT})")

    def value(self, value, depth: int):
        """Decode one argument: JSON scalars stand for themselves, lists for lists, tagged objects for the rest."""
        if depth > MAX_DEPTH:
            raise self.fail(f"an argument is nested deeper than {MAX_DEPTH}")
        if value is None or isinstance(value, (bool, int, str)):
            if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
                raise self.fail("a string argument is too long")
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self.fail("a float argument is not finite (non-finite floats are tagged)")
            return value
        if isinstance(value, list):
            if len(value) > MAX_ITEMS:
                raise self.fail(f"a list argument holds more than {MAX_ITEMS} items")
            return [self.value(item, depth + 1) for item in value]
        if isinstance(value, dict):
            return self.tagged(value, depth)
        raise self.fail(f"an argument has an unknown JSON type {type(value).__name__}")

    def tagged(self, value: dict, depth: int):
        if len(value) != 1:
            raise self.fail(f"an argument object must have exactly one tag, not {sorted(value)}")
        (tag, payload), = value.items()
        if tag in ("node", "input", "param", "constant"):
            name = self.name(payload)
            if name not in self.defined:
                raise self.fail(f"an argument refers to {name!r}, which is not defined before it")
            if tag != "node" and self.placeholders.get(name, ("",))[0] != tag:
                raise self.fail(f"an argument refers to {tag} {name!r}, which is not one")
            return Ref(tag, name)
        if tag == "tuple":
            if not isinstance(payload, list) or len(payload) > MAX_ITEMS:
                raise self.fail("a tuple argument is not a list")
            return tuple(self.value(item, depth + 1) for item in payload)
        if tag == "float":
            if not isinstance(payload, str) or payload not in NON_FINITE:
                raise self.fail(f"a float argument {payload!r} is not inf, -inf or nan")
            return NON_FINITE[payload]
        if tag == "dtype":
            return TorchName(tag, self.choice(payload, DTYPES, tag))
        if tag == "memory_format":
            return TorchName(tag, self.choice(payload, MEMORY_FORMATS, tag))
        if tag == "layout":
            return TorchName(tag, self.choice(payload, LAYOUTS, tag))
        if tag == "device":
            if not isinstance(payload, str) or not _DEVICE.match(payload):
                raise self.fail(f"a device argument {payload!r} is not a device name")
            return TorchName(tag, payload)
        if tag == "opaque":
            return Opaque(self.name(payload))
        raise self.fail(f"an argument has an unknown tag {tag!r} (a reference to a Python object?)")

    def constant(self, value) -> np.ndarray:
        """A stored constant: {"dtype", "shape", "data": base64 of its little-endian bytes}."""
        dtype = self.field(value, "dtype")
        if not isinstance(dtype, str) or dtype not in CONSTANT_DTYPES:
            raise self.fail(f"a constant has an unstorable dtype {dtype!r}")
        shape = self.spec({"dtype": "float32", "shape": self.field(value, "shape")}).shape
        data = self.field(value, "data")
        if not isinstance(data, str) or len(data) > 2 * MAX_CONSTANT_BYTES:
            raise self.fail("a constant's data is not a string of bounded size")
        try:
            raw = base64.b64decode(data, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise self.fail(f"a constant's data is not base64 ({exc})") from exc
        self.constant_bytes += len(raw)
        want = np.dtype(CONSTANT_DTYPES[dtype]).newbyteorder("<")
        count = int(np.prod(shape, dtype=np.int64))
        if self.constant_bytes > MAX_CONSTANT_BYTES or len(raw) != count * want.itemsize:
            raise self.fail("a constant's data does not match its shape, or constants are too large")
        array = np.frombuffer(raw, dtype=want).astype(want.newbyteorder("="))
        return _from_bits(array, dtype).reshape(shape)

    def choice(self, payload, allowed: frozenset, tag: str) -> str:
        if not isinstance(payload, str) or payload not in allowed:
            raise self.fail(f"{tag} {payload!r} is not one of {', '.join(sorted(allowed))}")
        return payload

    def val(self, value, depth: int):
        """A node's value meta: {"dtype", "shape"}, a list of such (a tuple value), or null."""
        if value is None:
            return None
        if depth > MAX_DEPTH:
            raise self.fail("a value meta is nested too deep")
        if isinstance(value, list):
            if len(value) > MAX_ITEMS:
                raise self.fail("a value meta holds too many items")
            return [self.val(item, depth + 1) for item in value]
        if isinstance(value, dict):
            spec = self.spec(value)
            stride = value.get("stride")
            if stride is not None and (not isinstance(stride, list) or len(stride) != len(spec.shape) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**62 for d in stride)):
                raise self.fail(f"a tensor meta has a bad stride {stride!r}")
            return TensorMeta(spec.dtype, spec.shape, tuple(stride) if stride is not None else None)
        raise self.fail("a value meta is neither a tensor spec, a list nor null")

    def spec(self, value) -> TensorSpec:
        dtype, shape = self.field(value, "dtype"), self.field(value, "shape")
        if not isinstance(dtype, str) or (dtype not in DTYPES and dtype != "opaque"):
            raise self.fail(f"a tensor spec has an unknown dtype {dtype!r}")
        if not isinstance(shape, list) or len(shape) > 64 or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise self.fail(f"a tensor spec has a bad shape {shape!r}")
        return TensorSpec(tuple(shape), dtype)

    def type_change(self, item) -> TypeChange:
        output = self.field(item, "output")
        if not isinstance(output, int) or isinstance(output, bool) or output < 0:
            raise self.fail("a type change has a bad output index")
        return TypeChange(self.name(self.field(item, "op")), output, self.spec(self.field(item, "declared")),
                          self.spec(self.field(item, "source")))

    def items(self, value, what: str, limit: int = MAX_ITEMS) -> list:
        if not isinstance(value, list):
            raise self.fail(f"its {what} are not a list")
        if len(value) > limit:
            raise self.fail(f"it has more than {limit} {what}")
        return value

    def field(self, item, key: str):
        if not isinstance(item, dict) or key not in item:
            raise self.fail(f"an entry lacks {key!r}")
        return item[key]

    def name(self, value) -> str:
        if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
            raise self.fail(f"{value!r} is not a name")
        return value


def _walk(value):
    """Every leaf of a decoded argument structure."""
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    else:
        yield value


def encode_constant(array: np.ndarray) -> dict:
    """A small tensor as data: dtype, shape, and its little-endian bytes in base64 (what `constant` reads)."""
    name = array.dtype.name
    if name not in CONSTANT_DTYPES:
        raise ValueError(f"a constant of dtype {name} cannot be stored")
    stored = np.dtype(CONSTANT_DTYPES[name])
    if name in RAW_BITS_CONSTANTS:  # bfloat16 / float8 (ml_dtypes): their raw bits
        array = np.ascontiguousarray(array).view(stored)
    data = np.ascontiguousarray(array, dtype=stored.newbyteorder("<"))
    return {"dtype": name, "shape": list(array.shape), "data": base64.b64encode(data.tobytes()).decode("ascii")}


def _from_bits(array: np.ndarray, dtype: str) -> np.ndarray:
    """A constant read as its stored dtype, viewed as `dtype` where that is an ml_dtypes float (raw bits)."""
    return array.view(getattr(ml_dtypes, dtype)) if dtype in RAW_BITS_CONSTANTS else array


def refs_of(value) -> list[Ref]:
    """The references inside a decoded argument structure, in order."""
    return [leaf for leaf in _walk(value) if isinstance(leaf, Ref)]
