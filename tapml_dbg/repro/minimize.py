"""`dump --minimize`: the smallest input shapes at which a repro's unit still diverges.

An upstream maintainer wants the smallest failing case, not the model's tensors. Starting from the
unit's recorded inputs, each dimension (a group of input axes of the same extent, sliced together
so that a matmul's shared k stays consistent; one axis alone when the group does not rebuild) is
halved while the unit still fails, then bisected between the last failing and the first passing
extent. At every candidate shape the unit is rebuilt (its bindings re-normalized for the new
parameter shapes), run on the target through the session's lanes (its transform, its compile
cache), and judged against the expected value computed on the host at that shape: the source
runner (host/source_runner.py) re-executes the op's FX node on the sliced inputs in float64
(a helper binding such as the matmul inside an addmm: `host.helper_values`), rounded to the
output's dtype. The judge is the repro's own compare rule with the dump's tolerance, so the
minimized repro fails exactly as the search saw it fail. Failure is assumed to be monotone in
each extent (true for accumulation-length and elementwise bugs); a unit that only fails at full
size, or that cannot be re-executed on the host, is reported as such and dumped unminimized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tapml_dbg import portable as lib
from tapml_dbg.model.serialize import function_to_json
from tapml_dbg.model.units import bindings_by_name, substitute
from tapml_dbg.host.helper_values import helper_value
from tapml_dbg.runtime.messages import UnitRequest
from tapml_dbg.host.source_runner import SourceRunError, SourceRunner

MAX_PROBES = 200  # candidate shapes tried at most per unit (each is one compile and run)
MINIMIZE_ROUNDS = 2  # passes over every axis group


class NotMinimizable(Exception):
    """A candidate shape the unit cannot be rebuilt at, or re-executed on the host at."""


@dataclass
class Candidate:
    """The unit at one set of input shapes, as run and judged."""

    shapes: list[tuple[int, ...]]
    windows: list[list[tuple[int, int]]] = field(default_factory=list)  # (start, stop) of each input axis
    func: object = None
    inputs: list[np.ndarray] = field(default_factory=list)
    expected: list[np.ndarray] = field(default_factory=list)  # the float64 reference rounded to the output dtype
    reference: list[np.ndarray] = field(default_factory=list)  # the float64 reference itself
    metrics: list[dict] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)  # what the target returned
    failed: bool = False

    def worst(self) -> dict | None:
        """The element of the first failing output farthest from its expected value, for a bug report."""
        for k, m in enumerate(self.metrics):
            if m["passed"] or k >= len(self.outputs):
                continue
            got = np.asarray(self.outputs[k], np.float64)
            expected = np.asarray(self.expected[k], np.float64)
            with np.errstate(all="ignore"):
                diff = np.where(np.isnan(got) != np.isnan(expected), np.inf, np.abs(got - expected))
            diff = np.nan_to_num(diff, nan=0.0, posinf=np.inf)
            at = np.unravel_index(int(np.argmax(diff)), got.shape) if got.size else ()
            return {"output": k, "index": [int(i) for i in at], "expected": float(expected[at]),
                    "got": float(got[at]), "float64": float(np.asarray(self.reference[k], np.float64)[at])}
        return None


@dataclass
class Minimized:
    """What `minimize` found: the smallest failing candidate (None: nothing smaller fails, or cannot tell)."""

    full_shapes: list[tuple[int, ...]]
    best: Candidate | None
    probes: int
    note: str = ""

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return self.best.shapes if self.best else self.full_shapes

    @property
    def elements(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    def to_json(self) -> dict:
        return {"from": [list(s) for s in self.full_shapes], "to": [list(s) for s in self.shapes],
                "windows": [[list(w) for w in window] for window in self.best.windows] if self.best else None,
                "probes": self.probes, "minimized": self.best is not None and self.shapes != self.full_shapes,
                "note": self.note, "worst": self.best.worst() if self.best else None}


def rebuild(func, shapes: list[tuple[int, ...]]):
    """`func` with parameters of `shapes`, every binding re-normalized (raises NotMinimizable).

    Each value is normalized outside any function frame, so a shape TVM refuses (a reshape to a
    fixed shape, a broadcast that no longer fits) raises without leaving a builder half open.
    """
    from tvm import relax

    params = [relax.Var(p.name, relax.TensorType(shape, p.ty.dtype)) for p, shape in zip(func.params, shapes)]
    checker, remap = relax.BlockBuilder(), dict(zip(func.params, params))
    bindings = [b for block in func.body.blocks for b in block.bindings]
    try:  # infer every binding's type at the new shapes first: TVM raises here, not inside a function frame
        for binding in bindings:
            if isinstance(binding, relax.MatchCast):
                raise NotMinimizable("a match_cast binding keeps its shapes")
            value = checker.normalize(substitute(binding.value, remap))
            remap[binding.var] = relax.Var(binding.var.name, value.ty)
    except NotMinimizable:
        raise
    except Exception as exc:
        raise NotMinimizable(lib.one_line(exc)) from exc
    remap = dict(zip(func.params, params))
    builder = relax.BlockBuilder()
    with builder.function("main", params, attrs={"num_input": len(params)}, pure=True):
        for binding in bindings:
            remap[binding.var] = builder.emit(substitute(binding.value, remap), binding.var.name)
        builder.emit_func_output(substitute(func.body.body, remap))
    return builder.get()["main"]


class HostReference:
    """Float64 values of a unit's ops on given (sliced) inputs, on the host, from the trace's source graph."""

    def __init__(self, session, ops, param_names: list[str]):
        self.session = session
        self.ops = ops
        self.param_names = param_names
        self.bindings = bindings_by_name(session.main)
        self.graph = session.reference.graph

    def values(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The unit's last op's outputs in float64 with its parameters set to `arrays`."""
        given = dict(zip(self.param_names, arrays))
        values: dict[str, list[np.ndarray]] = {name: [np.asarray(a)] for name, a in given.items()}
        for op in self.ops:
            values[op.name] = self._op_value(op, values, given)
        return values[self.ops[-1].name]

    def _op_value(self, op, values: dict, given: dict) -> list[np.ndarray]:
        if self.graph is not None and op.name in self.graph.op_values:
            try:
                return self._source_value(op, values, given)
            except SourceRunError:
                pass  # e.g. the FX node reads values the unit does not have: try the helper recipe
        computed = helper_value(self.bindings[op.name], values)
        if computed is None:
            raise NotMinimizable(f"no host recipe for op {op.name} ({op.relax_op}) at other shapes")
        return computed

    def _source_value(self, op, values: dict, given: dict) -> list[np.ndarray]:
        reader = self.session.reader

        def fetch_op(name: str):
            if name in values:
                return values[name]
            other = self.session.by_name.get(name)
            if other is None or other.index not in self.session.recorded:
                return None
            return reader.tensors.op_outputs(other.index)

        def fetch_placeholder(kind: str, name: str):
            if name in given:
                return given[name]
            return reader.tensors.input(name) if kind == "input" else reader.tensors.param(name)

        runner = SourceRunner(self.graph, fetch_op, fetch_placeholder)
        try:
            return [np.asarray(v) for v in runner.op_value(op, promote=True)]
        except SourceRunError:
            raise
        except Exception as exc:  # torch refused the sliced shapes
            raise SourceRunError(lib.one_line(exc)) from exc


def _rounded(reference: np.ndarray, like: np.ndarray) -> np.ndarray:
    """The float64 reference as the output's dtype holds it (what a correct kernel returns)."""
    with np.errstate(all="ignore"):
        return np.asarray(reference).astype(like.dtype)


class Minimizer:
    """One minimization of one unit (see the module docstring)."""

    def __init__(self, session, ops, func, inputs: list[np.ndarray], outputs_like: list[np.ndarray],
                 tolerances: list[tuple[float, float]], param_names: list[str],
                 progress: Callable[..., None] = lambda *a, **k: None, max_probes: int | None = None):
        self.session = session
        self.ops = ops
        self.func = func
        self.full = [np.asarray(a) for a in inputs]
        self.outputs_like = outputs_like
        self.tolerances = tolerances
        self.host = HostReference(session, ops, param_names)
        self.progress = progress
        self.max_probes = MAX_PROBES if max_probes is None else max_probes
        self.probes = 0

    # -- one candidate ---------------------------------------------------------------------
    def sliced(self, windows) -> list[np.ndarray]:
        return [np.ascontiguousarray(a[tuple(slice(lo, hi) for lo, hi in window)])
                for a, window in zip(self.full, windows)]

    def check(self, windows) -> Candidate:
        """Run and judge the unit on the inputs cut to `windows` ((start, stop) per axis; raises NotMinimizable)."""
        self.probes += 1
        shapes = [tuple(hi - lo for lo, hi in window) for window in windows]
        self.progress(self.probes, self.max_probes, " ".join("x".join(map(str, s)) for s in shapes))
        candidate = Candidate(shapes=shapes, windows=[list(w) for w in windows])
        candidate.func = rebuild(self.func, candidate.shapes)
        candidate.inputs = self.sliced(windows)
        try:
            candidate.reference = self.host.values(candidate.inputs)
        except SourceRunError as exc:
            raise NotMinimizable(f"the host cannot re-execute the unit: {exc}") from exc
        if len(candidate.reference) != len(self.outputs_like):
            raise NotMinimizable("the host reference does not line up with the unit's outputs")
        candidate.expected = [_rounded(r, like) for r, like in zip(candidate.reference, self.outputs_like)]
        last = self.ops[-1].name
        request = UnitRequest(unit_json=function_to_json(candidate.func),
                              inputs=[("value", a) for a in candidate.inputs], outputs=[last])
        result = self.session.lanes.run(request)
        if not result.ok:  # a crash or compile error at a smaller shape is not the divergence being minimized
            raise NotMinimizable(f"the unit did not run at {candidate.shapes}: {result.message}")
        outputs = candidate.outputs = result.outputs[0]
        if [np.shape(t) for t in outputs] != [np.shape(e) for e in candidate.expected]:
            raise NotMinimizable(f"the host reference at {candidate.shapes} does not have the unit's output shapes")
        candidate.metrics = [lib.compare(t, e, rtol, atol) for t, e, (rtol, atol)
                             in zip(outputs, candidate.expected, self.tolerances)]
        candidate.failed = any(not m["passed"] for m in candidate.metrics)
        return candidate

    def _try(self, windows) -> Candidate | None:
        """The candidate when it fails, None when it passes or cannot be built."""
        if self.probes >= self.max_probes:
            return None
        try:
            candidate = self.check(windows)
        except NotMinimizable:
            return None
        return candidate if candidate.failed else None

    # -- the search ------------------------------------------------------------------------
    def groups(self, shapes) -> list[list[tuple[int, int]]]:
        """Axes to cut together: all input axes of one extent (larger extents first), then each alone."""
        by_extent: dict[int, list[tuple[int, int]]] = {}
        for p, shape in enumerate(shapes):
            for axis, extent in enumerate(shape):
                if extent > 1:
                    by_extent.setdefault(extent, []).append((p, axis))
        together = [by_extent[n] for n in sorted(by_extent, reverse=True)]
        alone = [[axis] for group in together if len(group) > 1 for axis in group]
        return together + alone

    def _smallest(self, best: Candidate, group, lowest: int, highest: int, window_of) -> Candidate:
        """Halve then bisect an integer n in [lowest, highest] (highest fails as `best`) for the smallest
        failing `window_of(n)`; the candidate there."""
        def at(n: int):
            windows = [list(w) for w in best.windows]
            for p, a in group:
                windows[p][a] = window_of(n)
            return windows

        failing, passing, found = highest, None, best
        while failing > lowest:  # halving (towards lowest)
            step = lowest + (failing - lowest) // 2
            candidate = self._try(at(step))
            if candidate is None:
                passing = step
                break
            failing, found = step, candidate
        if passing is not None:
            while failing - passing > 1:  # bisecting between the last failing and the first passing n
                middle = (failing + passing) // 2
                candidate = self._try(at(middle))
                if candidate is None:
                    passing = middle
                else:
                    failing, found = middle, candidate
        return found

    def shrink(self, best: Candidate, group: list[tuple[int, int]]) -> Candidate:
        """Cut `group`'s window from the end, then from the front, while the unit still fails."""
        window = best.windows[group[0][0]][group[0][1]]
        if any(best.windows[p][a] != window for p, a in group) or window[1] - window[0] <= 1:
            return best
        start, stop = window
        best = self._smallest(best, group, 1, stop - start, lambda n: (start, start + n))
        start, stop = best.windows[group[0][0]][group[0][1]]
        if stop - start <= 1:
            return best
        # from the front: keep [stop - n, stop) for the smallest n that still fails
        return self._smallest(best, group, 1, stop - start, lambda n: (stop - n, stop))

    def run(self) -> Minimized:
        full_shapes = [tuple(a.shape) for a in self.full]
        try:
            start = self.check([[(0, n) for n in shape] for shape in full_shapes])
        except NotMinimizable as exc:
            return Minimized(full_shapes, None, self.probes, f"not minimized: {exc}")
        if not start.failed:
            return Minimized(full_shapes, None, self.probes,
                             "not minimized: at full size the unit passes against the float64 reference rounded "
                             "to its dtype (the recorded source value is what it fails against)")
        best = start
        for _round in range(MINIMIZE_ROUNDS):  # cutting one axis can let another be cut further
            before = best.shapes
            for group in self.groups(best.shapes):
                best = self.shrink(best, group)
            if best.shapes == before:
                break
        if best.shapes == full_shapes:
            return Minimized(full_shapes, best, self.probes, "fails only at full size: no smaller shape fails")
        return Minimized(full_shapes, best, self.probes)


def minimize(session, ops, func, inputs, outputs_like, tolerances, param_names, progress=None) -> Minimized:
    """Minimize the unit `func` of `ops` (see `Minimizer`)."""
    kwargs = {"progress": progress} if progress else {}
    return Minimizer(session, ops, func, inputs, outputs_like, tolerances, param_names, **kwargs).run()

