"""`tapml-dbg diff TRACE_A TRACE_B`: two recordings of one model compared op by op and layer by layer.

Ops pair by name, and by generation step where both traces have steps: one model recorded twice (two
torch versions, `--source torch` and `--source tvm:llvm`, float32 and bfloat16) keeps its op names
wherever its graph is the same. Each pair is judged by the project's one compare rule
(`judge.compare.compare_arrays`), B against A: A's values are the reference, A's largest magnitude
the scale of the relative error. Values of two dtypes are compared in float64, and the result says
so. At every layer boundary (a layer's last op, its nested layers' ops included) the two recordings
are compared too, so a user sees at which layer they part. Both traces are only read: no target, no
TVM, nothing run.

The tolerance (docs/diff.md): by default the judge's fixed rule at the lower-precision dtype of the
two (float32 rtol 1e-4, bfloat16 4e-2: docs/tolerance.md's table), not loosened for propagation: a
tenth's error at one op is what a user diffing two recordings wants to see, and the figures say how
far each op is when they want to loosen it; `rtol` (and `atol`) set one rule for every float op.
Integers and bools must match exactly either way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

import numpy as np

from tapml_dbg.errors import UsageError
from tapml_dbg.judge.compare import EXACT, Metrics, Tolerance, TolerancePolicy, compare_arrays, dtype_name, worst
from tapml_dbg.model.select import LAYER_SEP, OpTable
from tapml_dbg.trace.reader import TraceReader

Progress = Callable[..., None]
NAMES_LISTED = 20  # ops only in one trace: this many named in the result, the rest counted


def _noop(*_args, **_kwargs) -> None:
    return None


class DiffStatus(StrEnum):
    """What one pair of ops (or of layer boundaries) came to."""

    IDENTICAL = "identical"  # the same dtype and the same values (NaNs in the same places)
    CLOSE = "close"  # within the tolerance
    DIFFERS = "differs"  # beyond the tolerance
    SHAPE = "shape differs"  # an output's shape, or the number of outputs, differs: no figures
    NOT_COMPARED = "not compared"  # a side has no values for it (a recording cut short, a capture budget)


DIFFERENT = (DiffStatus.DIFFERS, DiffStatus.SHAPE)  # what counts as the recordings parting


@dataclass(frozen=True)
class DiffTolerance:
    """The rule a pair is judged by. `rtol` None: the judge's fixed tolerance of the lower-precision
    dtype of the two (docs/tolerance.md's table); else `atol + rtol * absmax(A)` for every float pair
    (`atol` 0 unless given)."""

    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self):
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UsageError(f"--{name} must be a number >= 0, not {value}")
        if self.atol is not None and self.rtol is None:
            raise UsageError("--atol goes with --rtol (without --rtol each dtype has the judge's tolerance)")

    def for_dtypes(self, a: str, b: str, floors: tuple[str, ...] = ()) -> tuple[Tolerance, str]:
        """The tolerance of a pair of outputs of dtypes `a` and `b`, and the dtype whose it is: exact for
        integers and bools; else the loosest of `a`, `b` and `floors` (the lowest precision each op is
        computed from, `precision_floors`), or the fixed rule."""
        own = loosest((a, b))
        if TolerancePolicy().for_value(own) == EXACT:
            return EXACT, own
        if self.rtol is not None:
            return Tolerance(rtol=self.rtol, atol=self.atol or 0.0), ""
        dtype = loosest((a, b, *floors))
        return TolerancePolicy().for_value(dtype), dtype

    def to_json(self) -> dict:
        policy = TolerancePolicy()
        if self.rtol is None:
            return {"rule": "by dtype", "by_dtype": {dtype: {"rtol": tol.rtol, "atol": tol.atol}
                                                     for dtype, tol in policy.by_dtype.items()}}
        return {"rule": "fixed", "rtol": self.rtol, "atol": self.atol or 0.0}


def loosest(dtypes) -> str:
    """The dtype of the loosest tolerance among `dtypes` (bfloat16 over float16 over float32 over float64
    over the exact integers and bools)."""
    policy = TolerancePolicy()
    return max(dtypes, key=lambda dtype: (policy.for_value(dtype).rtol, policy.for_value(dtype).atol), default="")


def precision_floors(graph: dict, ops: list[dict]) -> dict[str, str]:
    """{op name: the lowest-precision dtype among its outputs and everything it is computed from (the ops
    upstream, params, constants)}. A bfloat16 model computes some ops in float32 (RoPE, a norm's upcast,
    a softmax) from bfloat16 values: compared with the float32 model's, they are bfloat16-accurate, not
    float32-accurate, and are judged so."""
    floors = {param["name"]: param.get("dtype", "") for param in graph["params"]}
    declared = {op["name"]: [spec.get("dtype", "") for spec in op.get("outputs") or []] for op in ops}
    for binding in graph["bindings"]:
        floors[binding["name"]] = loosest([*declared.get(binding["name"], []), *_read_dtypes(binding["value"], floors)])
    return floors


def _read_dtypes(expr, floors: dict[str, str]) -> list[str]:
    """The dtypes an expression of the stored graph reads: its variables' floors and its constants'."""
    found, stack = [], [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if isinstance(item.get("var"), str):
                found.append(floors.get(item["var"], ""))
            if isinstance(item.get("const"), dict):
                found.append(str(item["const"].get("dtype", "")))
            stack.extend(value for key, value in item.items() if key not in ("var", "const", "attrs"))
    return found


@dataclass
class Side:
    """One trace of the two: what `diff` says about it."""

    path: str
    source: str
    model: str
    ops: int
    steps: bool  # a generation trace (its ops have steps)

    def to_json(self) -> dict:
        return {"path": self.path, "source": self.source, "model": self.model, "ops": self.ops, "steps": self.steps}


@dataclass
class Comparison:
    """Two ops' outputs compared: the status, the worst output's metrics and how it was judged."""

    status: DiffStatus
    a_types: list[str]  # "float32[4, 32]" per output
    b_types: list[str]
    metrics: Metrics | None = None
    output: int | None = None  # the output `metrics` are of
    cast: str = ""  # "float32 vs bfloat16": compared in float64
    tolerance: Tolerance | None = None
    precision: str = ""  # the dtype whose tolerance it is ("" under --rtol)
    note: str = ""  # why there are no figures

    def to_json(self) -> dict:
        return {"status": str(self.status), "a_outputs": self.a_types, "b_outputs": self.b_types,
                "output": self.output, "cast": self.cast or None,
                "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol} if self.tolerance else None,
                "precision": self.precision or None,
                "metrics": self.metrics.to_json() if self.metrics else None, "note": self.note or None}


@dataclass
class OpDiff:
    """One op found in both traces (by name, and step)."""

    name: str
    step: int | None
    op: str  # the source operator (A's op table)
    layer: str  # A's
    a: int  # the op's index in A
    b: int  # ... and in B
    compared: Comparison
    b_op: str = ""  # B's source operator: another than A's where the two graphs differ at this name

    @property
    def status(self) -> DiffStatus:
        return self.compared.status

    def to_json(self) -> dict:
        return {"name": self.name, "step": self.step, "op": self.op, "b_op": self.b_op, "layer": self.layer, "a": self.a,
                "b": self.b, **self.compared.to_json()}


@dataclass
class LayerDiff:
    """A layer's boundary (its last op, nested layers included) in each trace, compared."""

    layer: str
    step: int | None
    a: int
    a_name: str
    b: int
    b_name: str
    compared: Comparison

    @property
    def status(self) -> DiffStatus:
        return self.compared.status

    def to_json(self) -> dict:
        return {"layer": self.layer, "step": self.step, "a": {"index": self.a, "name": self.a_name},
                "b": {"index": self.b, "name": self.b_name}, **self.compared.to_json()}


@dataclass
class DiffResult:
    a: Side
    b: Side
    by_step: bool  # ops pair by name and step (both are generation traces), else by name
    tolerance: DiffTolerance
    ops: list[OpDiff] = field(default_factory=list)  # in A's order
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    layers: list[LayerDiff] = field(default_factory=list)  # in the order A computes their boundaries
    layers_unmatched: int = 0  # layers (per step) of one trace only
    selected: str | None = None  # `--ops`: the selector, resolved on A
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        return {str(status): sum(op.status == status for op in self.ops) for status in DiffStatus}

    @property
    def first_difference(self) -> OpDiff | None:
        return next((op for op in self.ops if op.status in DIFFERENT), None)

    @property
    def first_layer_difference(self) -> LayerDiff | None:
        return next((layer for layer in self.layers if layer.status in DIFFERENT), None)

    @property
    def differs(self) -> bool:
        return self.first_difference is not None or self.first_layer_difference is not None

    def to_json(self) -> dict:
        first, layer = self.first_difference, self.first_layer_difference
        return {"a": self.a.to_json(), "b": self.b.to_json(), "keyed_by": "name and step" if self.by_step else "name",
                "tolerance": self.tolerance.to_json(), "selected": self.selected, "matched": len(self.ops),
                "only_in_a": {"count": len(self.only_in_a), "names": self.only_in_a[:NAMES_LISTED]},
                "only_in_b": {"count": len(self.only_in_b), "names": self.only_in_b[:NAMES_LISTED]},
                "counts": self.counts(), "differs": self.differs,
                "first_difference": first.to_json() if first else None,
                "first_layer_difference": layer.to_json() if layer else None,
                "ops": [op.to_json() for op in self.ops], "layers": [row.to_json() for row in self.layers],
                "layers_unmatched": self.layers_unmatched, "seconds": self.seconds}


# ---------------------------------------------------------------------------- comparing two ops
def _types(outputs: list[np.ndarray]) -> list[str]:
    return [f"{dtype_name(value)}{list(np.shape(value))}" for value in outputs]


def _declared(op: dict) -> list[str]:
    return [f"{spec.get('dtype', '?')}{list(spec.get('shape', []))}" for spec in op.get("outputs") or []]


def _float64(value: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(np.float64)


def _compare_one(a: np.ndarray, b: np.ndarray, rule: DiffTolerance, floors: tuple[str, ...]) -> tuple:
    """One output of B against A's: (metrics, tolerance, its dtype, "float32 vs bfloat16" when the
    dtypes differ and the values were compared in float64)."""
    a_dtype, b_dtype = dtype_name(a), dtype_name(b)
    tol, precision = rule.for_dtypes(a_dtype, b_dtype, floors)
    if a_dtype == b_dtype:
        return compare_arrays(b, a, tol), tol, precision, ""
    return compare_arrays(_float64(b), _float64(a), tol), tol, precision, f"{a_dtype} vs {b_dtype}"


def compare_values(a: list[np.ndarray], b: list[np.ndarray], rule: DiffTolerance,
                   floors: tuple[str, ...] = ()) -> Comparison:
    """Two ops' recorded outputs, output by output; the op's figures are its worst output's. `floors`:
    the lowest precision each op is computed from (`precision_floors`)."""
    a_types, b_types = _types(a), _types(b)
    if len(a) != len(b):
        return Comparison(DiffStatus.SHAPE, a_types, b_types, note=f"{len(a)} outputs vs {len(b)}")
    shapes = [k for k, (x, y) in enumerate(zip(a, b)) if np.shape(x) != np.shape(y)]
    if shapes:
        return Comparison(DiffStatus.SHAPE, a_types, b_types, output=shapes[0],
                          note=f"output {shapes[0]}: {a_types[shapes[0]]} vs {b_types[shapes[0]]}")
    if not a:
        return Comparison(DiffStatus.IDENTICAL, a_types, b_types)
    judged = [_compare_one(x, y, rule, floors) for x, y in zip(a, b)]
    metrics = worst([found[0] for found in judged])
    output = next(k for k, found in enumerate(judged) if found[0] is metrics)
    cast = next((found[3] for found in judged if found[3]), "")
    exact = not cast and all(found[0].max_abs_err == 0 and found[0].mismatched == 0 for found in judged)
    status = DiffStatus.IDENTICAL if exact else DiffStatus.CLOSE if all(found[0].passed for found in judged) \
        else DiffStatus.DIFFERS
    return Comparison(status, a_types, b_types, metrics, output, cast, judged[output][1], judged[output][2])


class _Pair:
    """The two readers, each op's values read once even when a layer row compares it again."""

    def __init__(self, a: TraceReader, b: TraceReader, rule: DiffTolerance):
        self.readers = (a, b)
        self.rule = rule
        self._done: dict[tuple[int, int], Comparison] = {}
        # the precision each op is computed from: only the default rule asks (a fixed rule is one for all)
        self._floors = ({}, {}) if rule.rtol is not None else \
            tuple(precision_floors(reader.outline.graph(), reader.outline.ops) for reader in self.readers)

    def compare(self, ia: int, ib: int) -> Comparison:
        if (ia, ib) not in self._done:
            self._done[(ia, ib)] = self._compare(ia, ib)
        return self._done[(ia, ib)]

    def _compare(self, ia: int, ib: int) -> Comparison:
        values = []
        for side, (reader, index) in zip("AB", zip(self.readers, (ia, ib))):
            if not reader.recorded.has_op(index):
                a_types, b_types = _declared(self.readers[0].outline.ops[ia]), _declared(self.readers[1].outline.ops[ib])
                return Comparison(DiffStatus.NOT_COMPARED, a_types, b_types,
                                  note=f"no values in {side}: {reader.recorded.missing_values_message(index)}")
            values.append(reader.tensors.op_outputs(index))
        floors = tuple(floor.get(reader.outline.ops[index]["name"], "")
                       for floor, reader, index in zip(self._floors, self.readers, (ia, ib)))
        return compare_values(*values, self.rule, floors)


# ---------------------------------------------------------------------------- pairing and layers
def _key(op: dict, by_step: bool):
    return (op["name"], op.get("step")) if by_step else op["name"]


def _has_steps(ops: list[dict]) -> bool:
    return any(op.get("step") is not None for op in ops)


def layer_boundaries(ops: list[dict], by_step: bool) -> dict[tuple, int]:
    """{(layer, step): the index of its last op} for every layer path and every prefix of it (a layer
    holds the ops of the layers nested in it, as op selectors say), per step when `by_step`."""
    last: dict[tuple, int] = {}
    for op in ops:
        parts = op.get("layer", "").split(LAYER_SEP) if op.get("layer") else []
        step = op.get("step") if by_step else None
        for end in range(1, len(parts) + 1):
            last[(LAYER_SEP.join(parts[:end]), step)] = op["index"]
    return last


def _shared_layers(ops_a: list[dict], ops_b: list[dict], by_step: bool) -> bool:
    """Two recordings of one model written twice (a transformers model and its port to Relax, whose
    module paths are transformers' names) share layers but no op name: they compare layer by layer."""
    return bool(set(layer_boundaries(ops_a, by_step)) & set(layer_boundaries(ops_b, by_step)))


def _side(path, reader: TraceReader) -> Side:
    meta = reader.meta
    return Side(str(path), str(meta.get("source") or ""), str(meta.get("model") or ""),
                len(reader.outline.ops), _has_steps(reader.outline.ops))


def _selected(reader: TraceReader, ops: str | None) -> set[int] | None:
    if ops is None:
        return None
    return set(OpTable.of(reader.outline.ops, listing="`tapml-dbg info TRACE_A --json` lists them").select_many(ops))


def diff_traces(path_a, path_b, tolerance: DiffTolerance = DiffTolerance(), ops: str | None = None,
                progress: Progress = _noop) -> DiffResult:
    """Compare two traces op by op where their ops match by name (and step), and at layer boundaries.
    `ops`: op selectors resolved on A (`12`, `a:b`, names, layers, `@K`): only those ops and the
    layers whose boundary they hold are compared. Raises a TraceError for a missing or damaged trace
    and a UsageError for two traces with no op in common."""
    started = time.perf_counter()
    with TraceReader(path_a) as a, TraceReader(path_b) as b:
        by_step = _has_steps(a.outline.ops) and _has_steps(b.outline.ops)
        chosen = _selected(a, ops)
        in_b = {_key(op, by_step): op["index"] for op in b.outline.ops}
        keys_a = {_key(op, by_step) for op in a.outline.ops}
        if not keys_a & set(in_b) and not _shared_layers(a.outline.ops, b.outline.ops, by_step):
            raise UsageError(f"{path_a} and {path_b} share no op name and no layer{' in any step' if by_step else ''}: "
                             "diff pairs ops by name and layers by module path, so both must be recordings of one "
                             "model (`tapml-dbg info TRACE --json` lists each trace's op names and layers)")
        result = DiffResult(_side(path_a, a), _side(path_b, b), by_step, tolerance, selected=ops)
        result.only_in_a = [op["name"] for op in a.outline.ops if _key(op, by_step) not in in_b]
        result.only_in_b = [op["name"] for op in b.outline.ops if _key(op, by_step) not in keys_a]
        pair = _Pair(a, b, tolerance)
        matched = [op for op in a.outline.ops
                   if _key(op, by_step) in in_b and (chosen is None or op["index"] in chosen)]
        for done, op in enumerate(matched):
            progress(done, len(matched), op["name"])
            ib = in_b[_key(op, by_step)]
            result.ops.append(OpDiff(op["name"], op.get("step"), op.get("op", ""), op.get("layer", ""), op["index"],
                                     ib, pair.compare(op["index"], ib), b.outline.ops[ib].get("op", "")))
        progress(len(matched), len(matched), "layers")
        _compare_layers(result, a, b, pair, chosen)
    result.seconds = time.perf_counter() - started
    return result


def _compare_layers(result: DiffResult, a: TraceReader, b: TraceReader, pair: _Pair, chosen: set[int] | None) -> None:
    """Each layer of both traces (per step) compared at its last op in each, in the order A reaches them."""
    ends_a, ends_b = layer_boundaries(a.outline.ops, result.by_step), layer_boundaries(b.outline.ops, result.by_step)
    # a nested layer before the layer holding it when both end at one op (`blocks.2` then `blocks`)
    both = sorted((key for key in ends_a if key in ends_b),
                  key=lambda key: (ends_a[key], -key[0].count(LAYER_SEP), key[0]))
    result.layers_unmatched = len(set(ends_a) ^ set(ends_b))
    for layer, step in both:
        ia, ib = ends_a[(layer, step)], ends_b[(layer, step)]
        if chosen is not None and ia not in chosen:
            continue
        result.layers.append(LayerDiff(layer, step, ia, a.outline.ops[ia]["name"], ib, b.outline.ops[ib]["name"],
                                       pair.compare(ia, ib)))
