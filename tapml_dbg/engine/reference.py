"""What the target is judged against: one `Reference` interface, two kinds.

- `RecordedSource`: the values the trace holds, as recorded on its source (PyTorch eager, or a
  trusted TVM target for a trace recorded with `--source tvm:T`). The default.
- `TrustedTarget`: the same units on a trusted TVM *reference target* (TapML's mature platform,
  local or over RPC). Its values are the whole model run on that target, op by op, each op fed the
  reference target's own earlier values (what `record --source tvm:T` records), computed once per
  trace, reference target and reference transform, and kept in the cache as a trace of their own
  (`references/KEY.h5`): the search, verdicts, dump and carve then read it as they read any trace,
  and never ask which kind they have. The same pass also runs every op *alone* on the reference
  target, fed the recorded source inputs, and judges it against the recorded source value: the ops
  where the reference target itself differs from the source are TVM-wide (`tvm_wide`), listed,
  never the platform's culprit. A divergence found against the reference target is attributed to
  the target alone (`target`), or to every TVM target (`tvm`) where the reference target also
  differs from the source at that op.

The derived trace keeps the source graph, so the default noise-floor rule still judges the target
against a float64 reference of each op: the reference target's own error counts as its noise.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from tapml_dbg.engine.propagation import TargetChains
from tapml_dbg.engine.references import META_REFERENCE
from tapml_dbg.engine.results import BisectResult
from tapml_dbg.engine.verdicts import Verdicts
from tapml_dbg.errors import TraceError
from tapml_dbg.runtime.scheduler import transform_identity
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.trace import TraceReader, TraceWriter
from tapml_dbg.trace.schema import DS_WEIGHT_REFS, tvm_source_target

REFERENCE_FOLDER = "references"  # under the compile cache's folder: one derived trace per key
SOURCE, TARGET = "source", "target"  # Reference.kind
ATTRIBUTION_TARGET, ATTRIBUTION_TVM = "target", "tvm"  # op.attribution under a reference target
FAILED_NOTE = "the reference target failed on this op: the recorded source value"
FAILED_RUN_VERDICTS = ("compile-error", "crash", "timeout")  # a TVM-wide op the reference target cannot run: kept
REFERENCE_FORMAT = 2  # bump when the derived trace's content changes: older ones are made again
WEIGHT_REFS_TEXT = DS_WEIGHT_REFS.rsplit("/", 1)[1]  # its name under /graph (reader.outline.text)

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass(frozen=True)
class TvmWideOp:
    """An op where the reference target, fed the recorded source inputs, differs from the source."""

    index: int
    name: str
    op: str
    verdict: str  # isolated | compile-error | crash | timeout | type

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "op": self.op, "verdict": self.verdict}


class Reference(Protocol):
    """What the target is judged against, as the search's results tell it."""

    kind: str  # "source" | "target"
    target: str | None  # the reference target's label; None for a recorded PyTorch source

    @property
    def trace(self) -> Path:
        """The trace whose values the target is judged against."""
        ...

    @property
    def tvm_wide(self) -> list[TvmWideOp]:
        """Ops where the reference itself differs from the recorded source (none for the source)."""
        ...

    def attribution(self, index: int) -> str | None:
        """Whose divergence one at op `index` is: "target", "tvm", or None (judged against the source)."""
        ...

    def to_json(self) -> dict:
        ...


@dataclass
class RecordedSource:
    """The trace's own recorded values. A trace recorded on a TVM target (`--source tvm:T`) names that
    target: its divergences are judged against T already, without a second kind to tell them apart."""

    path: Path
    source: str = "torch"  # the trace's meta source

    kind = SOURCE

    @property
    def target(self) -> str | None:
        return tvm_source_target(self.source)

    @property
    def trace(self) -> Path:
        return self.path

    @property
    def tvm_wide(self) -> list[TvmWideOp]:
        return []

    def attribution(self, index: int) -> str | None:
        return None

    def to_json(self) -> dict:
        return {"kind": SOURCE, "target": self.target}


@dataclass
class TrustedTarget:
    """The same units on a trusted reference target, kept as a derived trace (see the module's doc)."""

    path: Path  # the derived trace
    of: Path  # the recorded trace it was derived from
    label: str  # the reference target as reports name it ("llvm", "cuda via rpc HOST:PORT")
    wide: list[TvmWideOp] = field(default_factory=list)
    seconds: float = 0.0  # what computing it took (0.0: it was in the cache)
    cached: bool = False

    kind = TARGET

    @property
    def target(self) -> str:
        return self.label

    @property
    def trace(self) -> Path:
        return self.path

    @property
    def tvm_wide(self) -> list[TvmWideOp]:
        return self.wide

    def attribution(self, index: int) -> str:
        return ATTRIBUTION_TVM if any(op.index == index for op in self.wide) else ATTRIBUTION_TARGET

    def to_json(self) -> dict:
        return {"kind": TARGET, "target": self.label}


def attributed(result: BisectResult, against: Reference) -> BisectResult:
    """`result` told what it was judged against: the reference, its TVM-wide ops, whose the culprit is."""
    result.reference, result.tvm_wide = against.to_json(), list(against.tvm_wide)
    if result.culprit is not None:
        result.culprit.attribution = against.attribution(result.culprit.index)
    return result


def reference_key(path: str | Path, spec: TargetSpec) -> str:
    """One derived trace per recorded trace (its bytes' identity: path, size, mtime), reference target,
    connection and reference transform (its file's bytes)."""
    stat = os.stat(path)
    parts = [REFERENCE_FORMAT, os.path.realpath(path), stat.st_size, stat.st_mtime_ns, spec.target, spec.rpc,
             spec.tracker, spec.key, transform_identity(spec.transform)]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def trusted_target(path: str | Path, spec: TargetSpec, cache_dir: str | Path, open_session,
                   progress: Progress = _noop) -> TrustedTarget:
    """The reference target's values of trace `path`: from the cache, else computed now (a session on
    `spec` made by `open_session(path, spec)`) and kept. Raises TraceError on a trace it cannot read."""
    with TraceReader(path):  # a missing or bad trace fails here, in one line, before anything is keyed on it
        pass
    folder = Path(cache_dir) / REFERENCE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    derived = folder / f"{reference_key(path, spec)}.h5"
    if derived.exists():
        kept = _read_kept(derived, Path(path), spec)
        if kept is not None:
            return kept
    started = time.perf_counter()
    partial = derived.with_suffix(f".{os.getpid()}.partial")
    try:
        with open_session(path, spec) as session:
            wide = _tvm_wide(session.verdicts, progress)
            _write_derived(session.chains, partial, spec, wide, path, progress)
        os.replace(partial, derived)
    finally:
        if partial.exists():
            partial.unlink()
    return TrustedTarget(derived, Path(path), spec.where, wide, time.perf_counter() - started)


def _read_kept(derived: Path, of: Path, spec: TargetSpec) -> TrustedTarget | None:
    try:
        with TraceReader(derived) as reader:
            if not reader.complete:
                return None
            info = reader.meta.get(META_REFERENCE) or {}
            wide = [TvmWideOp(int(op["index"]), str(op["name"]), str(op["op"]), str(op["verdict"]))
                    for op in info.get("tvm_wide", [])]
    except (TraceError, KeyError, TypeError, ValueError):
        return None  # a damaged cache entry is made again
    return TrustedTarget(derived, of, spec.where, wide, cached=True)


def _tvm_wide(verdicts: Verdicts, progress: Progress) -> list[TvmWideOp]:
    """Every op alone on the reference target, fed the recorded source inputs, judged against the
    recorded source value: those that fail."""
    judged = [op.index for op in verdicts.ops if op.outputs]
    found = verdicts.isolated_many(judged, progress)
    wide = []
    for index in judged:
        verdict = found.get(index)
        if verdict is not None and verdict.failed:
            op = verdicts.ops[index]
            kind = verdict.mode if verdict.status.judged else verdict.status
            wide.append(TvmWideOp(index, op.name, op.op, str(kind)))
    return wide


def _write_derived(chains: TargetChains, path: Path, spec: TargetSpec, wide: list[TvmWideOp], of,
                   progress: Progress) -> None:
    """A trace like the recorded one whose op values are the reference target's chain (an op that fails
    there keeps its recorded value, and is TVM-wide already)."""
    reader = chains.trace_ops.reader
    meta = dict(reader.meta)
    meta[META_REFERENCE] = {"target": spec.where, "of": os.fspath(of), "tvm_wide": [op.to_json() for op in wide]}
    refs = reader.weights.refs  # params the recorded trace reads from checkpoint files: referenced here too
    referenced = set(refs.params) if refs is not None else set()
    outline, tensors = reader.outline, reader.tensors
    writer = TraceWriter(path, meta=meta, graph_json=outline.graph_json, tvmscript=outline.tvmscript, ops=outline.ops,
                         inputs={name: tensors.input(name) for name in outline.input_names},
                         params={name: tensors.param(name) for name in outline.param_names if name not in referenced},
                         source_graph=outline.source_graph_json,
                         weight_refs=outline.text(WEIGHT_REFS_TEXT) if refs is not None else None,
                         weight_views={name: tensors.param(name) for name in referenced} if refs is not None else None)
    complete = False
    try:
        written: set[int] = set()
        note = f"computed by the reference target {spec.where}"
        for index, result, values in chains.series(progress):
            if values is not None and result is not None and result.ok:
                writer.write_op(index, [np.asarray(v) for v in values], note=note)
            else:
                writer.write_op(index, reader.tensors.op_outputs(index), note=FAILED_NOTE)
            written.add(index)
        for op in chains.ops:  # ops without a value of their own (no outputs) keep the recorded entry
            if op.index not in written and reader.recorded.has_op(op.index):
                writer.write_op(op.index, reader.tensors.op_outputs(op.index), note=reader.recorded.op_note(op.index))
        complete = True
    finally:
        writer.close(complete=complete)
