"""Every divergence of a model, grouped by root cause: what `tapml-dbg triage` answers.

bisect names the first divergent op; a user who deploys a model needs the whole list, and
needs to see which failures share a cause. The rule, from the same two sweeps the report runs
(`engine.report.error_points`, so the page, `plot` and this list tell one story):

- an op *diverges* when its isolated verdict fails (its kernel is wrong alone, or does not
  build or run), when the import declares another type than the source computed for a value the
  model reads (a type verdict), or when its propagated verdict fails and no divergent op lies
  upstream of it (an error amplified here);
- any other failure is *inherited*: folded into the group of the nearest divergent op upstream,
  and so is a failure of an op that reads a value whose type the import changed (it computes in
  the declared type);
- divergent ops are grouped by (source op, class, failure signature): two `aten.index.Tensor`
  ops that both import as bool where torch gives int64 are one cause, listed once with both ops;
- kept ops (`Session.kept`, engine/kept.py: known bugs) are no cause: they get no verdict, the
  propagated chain feeds their recorded values on, and a failure that reads a kept op's changed
  type is that known bug's, not listed; the rest of the model's causes are.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from tapml_dbg.engine.report import OpPoint, error_points
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.verdict import Status, Verdict
from tapml_dbg.model.graph import OpInfo, SourceLocation

Progress = Callable[..., None]
TYPE_CLASS = "type"  # the class of a group whose root cause is the import's declared type
IMPORT_ERROR_CLASS = "import-error"  # the class of the group of a stock import that fails outright
EXPLAINED_OPS = 32  # failing isolated verdicts run a second time to tell a nondeterministic kernel
SIGNATURE_CHARS = 120  # a failed run's message is compared on its first line, this long at most
_VOLATILE = re.compile(r"0x[0-9a-f]+|%\w+|\d+")  # what differs between two messages of one cause


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass
class TriagedOp:
    """One divergent op: how it fails (`verdict`: isolated | propagated | type, or a failed run's
    status such as compile-error) and the evidence."""

    index: int
    name: str
    op: str
    layer: str
    verdict: str
    summary: str  # metrics or the failed run's message, one line
    evidence: str = ""
    wrong: str = ""  # the WrongClass of a judged failure ("" for a failed run)
    source_location: SourceLocation | None = None  # the user's line it comes from
    step: int | None = None  # its generation step (0 = the prefill); None outside a generation trace

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "op": self.op, "verdict": self.verdict,
                "layer": self.layer, "summary": self.summary, "evidence": self.evidence, "class": self.wrong,
                "source_location": self.source_location.to_json() if self.source_location else None,
                "step": self.step}


@dataclass
class CauseGroup:
    """Divergent ops that share a source op, a class and a failure signature, with the failures
    inherited from them."""

    cause: str
    wrong: str  # the class: a WrongClass, a failed run's status, or "type"
    ops: list[TriagedOp]
    inherited: list[int] = field(default_factory=list)  # failing ops downstream, folded in

    @property
    def first(self) -> TriagedOp:
        return self.ops[0]

    def to_json(self) -> dict:
        return {"cause": self.cause, "class": self.wrong, "ops": [op.to_json() for op in self.ops],
                "evidence": self.first.evidence or self.first.summary, "inherited": self.inherited}


@dataclass
class TriageResult:
    """Every cause of divergence in a trace on one target, in model order of their first op."""

    target: str
    ops: int
    groups: list[CauseGroup]
    seconds: float = 0.0
    unjudged: list[int] = field(default_factory=list)  # ops with no verdict (no recorded value)
    kept: list[int] = field(default_factory=list)  # ops kept on the source: no cause (engine/kept.py)
    # what TVM's stock import does that no target run shows: its failure outright (`stock_import_group`),
    # listed after the target's causes (in JSON among the groups) and not a cause a `fix` rewrites
    findings: list[CauseGroup] = field(default_factory=list)
    host_only: list[dict] = field(default_factory=list)  # ops TVM cannot import, run on the host (engine/kept.py)
    reference: dict = field(default_factory=lambda: {"kind": "source", "target": None})  # engine/reference.py
    tvm_wide: list = field(default_factory=list)  # TvmWideOp: the reference target differs from the source too

    @property
    def diverged(self) -> bool:
        return bool(self.groups)

    def to_json(self) -> dict:
        return {"target": self.target, "ops": self.ops, "diverged": self.diverged,
                "groups": [group.to_json() for group in self.groups + self.findings], "kept": list(self.kept),
                "host_only": list(self.host_only), "seconds": round(self.seconds, 3), "reference": self.reference,
                "tvm_wide": [op.to_json() for op in self.tvm_wide]}


def triage(session: Session, progress: Progress = _noop, points: list[OpPoint] | None = None) -> TriageResult:
    """Both verdicts of every op (unless `points` already holds them), grouped by cause. Failing
    isolated verdicts are judged again with a second run (`Verdicts.explain`), so an out-of-bounds
    read is classed nondeterministic before it is grouped."""
    started = time.perf_counter()
    points = error_points(session, progress=progress) if points is None else points
    failing = [p for p in points if p.isolated is not None and p.isolated.status == Status.FAIL]
    for point in failing[:EXPLAINED_OPS]:
        point.isolated = session.verdicts.explain(point.isolated)
    # a type change the target no longer computes in (its op passes in the source's type: a transform retyped it)
    resolved = {p.index for p in points if p.isolated is not None and p.isolated.status == Status.PASS}
    type_changed = {index: session.reference.type_changes[index] for index in session.verdicts.type_changed_ops()
                    if index not in resolved}
    result = group_causes(session.where, session.ops, points, type_changed, session.kept)
    stock = stock_import_group(session.ops, session.reference.stock_meta, type_changed, session.kept)
    if stock is not None:  # a finding of the stock import, not of the target
        result.findings.append(stock)
    result.kept = sorted(session.user_kept)
    result.host_only = [entry.to_json() for entry in session.host_only]
    result.reference, result.tvm_wide = session.against.to_json(), list(session.against.tvm_wide)
    result.seconds = time.perf_counter() - started
    return result


def group_causes(target: str, ops: list[OpInfo], points: list[OpPoint], type_changed: dict,
                 kept=frozenset()) -> TriageResult:
    """The grouping rule of the module docstring, on verdicts already computed (`kept`: kept ops)."""
    by_name = {op.name: op for op in ops}
    # ops whose only change is the stock import's: the target computes them in torch's type, so no
    # failure downstream comes from them (frontend/stock_import.py)
    stock_only = {index for index, changes in type_changed.items() if all(c.stock for c in changes)}
    divergent: dict[int, TriagedOp] = {}
    folded: dict[int, list[int]] = {}  # divergent op -> inherited failures
    for point in points:
        op = ops[point.index]
        if op.index in kept:
            continue
        own = _own_divergence(point, op, type_changed.get(point.index))
        producer = _type_changed_producer(op, type_changed, by_name) if own is None or own.verdict in \
            ("isolated", "propagated") else None  # a failed build or run is the op's own bug
        if producer in kept:  # it computes in a kept op's changed type: that known bug's
            continue
        if own is not None and own.verdict != "propagated" and producer is None:
            divergent[op.index] = own
            continue
        cause = producer if producer is not None else _upstream(op, {i: t for i, t in divergent.items()
                                                                     if i not in stock_only}, by_name)
        if own is not None and cause is None:  # a propagated failure with nothing wrong upstream
            divergent[op.index] = own
        elif cause is not None and (own is not None or _failing(point)):
            folded.setdefault(cause, []).append(op.index)
    groups: dict[tuple, CauseGroup] = {}
    for index, triaged in divergent.items():
        key = _group_key(triaged, ops[index], type_changed.get(index))
        group = groups.get(key)
        if group is None:
            group = groups[key] = CauseGroup(_cause_text(triaged, ops[index], type_changed.get(index)), key[1], [])
        group.ops.append(triaged)
        group.inherited += folded.get(index, [])
    for group in groups.values():
        group.inherited.sort()
    unjudged = [p.index for p in points if not _judged_any(p) and ops[p.index].outputs]
    unjudged = [index for index in unjudged if index not in kept]
    return TriageResult(target, len(ops), list(groups.values()), unjudged=unjudged, kept=sorted(kept))


def stock_import_group(ops: list[OpInfo], stock: dict, type_changed: dict, kept=frozenset()) -> CauseGroup | None:
    """The import-error finding of a trace whose stock import fails outright (meta `stock_import`,
    frontend/stock_import.py) as a group of its own: the op of the FX node it fails at, the stock
    importer's one-line error; None when the stock import works (or was not tried)."""
    error = (stock or {}).get("error")
    if not error:
        return None
    by_name = {op.name: op for op in ops}
    op = by_name.get(stock.get("error_op") or "")
    if op is None or op.index in kept:
        return None
    fixes = ", ".join(stock.get("fixes") or []) or "import"
    node = stock.get("error_node") or op.fx_node
    typed = [ops[i] for i, changes in sorted(type_changed.items())
             if ops[i].fx_node == node and any(c.stock for c in changes)]
    after = f" (after the stock type change at #{typed[0].index} {typed[0].name})" if typed else ""
    evidence = f"TVM's stock from_exported_program fails here; tapml-dbg's {fixes} workaround imports it{after}"
    short = op.op.removeprefix("aten.").rsplit(".", 1)[0] if op.op.startswith("aten.") else op.op
    why = " ".join((stock.get("reason") or error).split()).split(". ", 1)[0]  # "TypeError: Binary operators ..."
    cause = f"{short}: the stock import fails: {why[:SIGNATURE_CHARS]}"
    triaged = TriagedOp(op.index, op.name, op.op, op.layer, IMPORT_ERROR_CLASS, error, evidence, IMPORT_ERROR_CLASS,
                        op.source_location, op.step)
    return CauseGroup(cause, IMPORT_ERROR_CLASS, [triaged])


def _failing(point: OpPoint) -> bool:
    return any(v is not None and v.failed for v in (point.isolated, point.propagated))


def _judged_any(point: OpPoint) -> bool:
    return any(v is not None and (v.status.judged or v.failed) for v in (point.isolated, point.propagated))


def _own_divergence(point: OpPoint, op: OpInfo, changes: list | None) -> TriagedOp | None:
    """How `op` diverges by itself, before asking whether it inherits: its isolated failure, its type
    change, or (a candidate, kept only when nothing upstream diverges) its propagated failure."""
    isolated, propagated = point.isolated, point.propagated
    if isolated is not None and isolated.failed:
        return _triaged(op, isolated, "isolated")
    if changes:
        return TriagedOp(op.index, op.name, op.op, op.layer, TYPE_CLASS,
                         "; ".join(change.describe() for change in changes),
                         "; ".join(change.describe() for change in changes), source_location=op.source_location,
                         step=op.step)
    if propagated is not None and propagated.failed:
        return _triaged(op, propagated, "propagated")
    return None


def _triaged(op: OpInfo, verdict: Verdict, mode: str) -> TriagedOp:
    kind = mode if verdict.status.judged else str(verdict.status)
    summary = verdict.summary.splitlines()[0] if verdict.summary else ""
    return TriagedOp(op.index, op.name, op.op, op.layer, kind, summary, verdict.evidence, str(verdict.wrong or ""),
                     op.source_location, op.step)


def _upstream(op: OpInfo, divergent: dict[int, TriagedOp], by_name: dict[str, OpInfo]) -> int | None:
    """The nearest divergent op upstream of `op` (breadth first over its inputs), or None."""
    seen: set[int] = set()
    frontier = list(op.inputs)
    while frontier:
        producer = by_name.get(frontier.pop(0))
        if producer is None or producer.index in seen:
            continue
        seen.add(producer.index)
        if producer.index in divergent:
            return producer.index
        frontier.extend(producer.inputs)
    return None


def _type_changed_producer(op: OpInfo, type_changed: dict, by_name: dict[str, OpInfo]) -> int | None:
    """The op whose changed type `op` reads (directly or through its own helper bindings, such as the
    `astype` the import puts before a `sub`), when its own type is not changed: what `op` computes
    on the target is in the declared type, a consequence of that producer's cause."""
    if op.index in type_changed:
        return None
    frontier, seen = list(op.inputs), set()
    while frontier:
        producer = by_name.get(frontier.pop(0))
        if producer is None or producer.index in seen:
            continue
        seen.add(producer.index)
        if producer.index in type_changed and not all(c.stock for c in type_changed[producer.index]):
            return producer.index  # (a stock type change is not what the target computes in)
        if producer.name.startswith(f"{op.name}_p"):  # a helper binding of the same source op
            frontier.extend(producer.inputs)
    return None


def _group_key(triaged: TriagedOp, op: OpInfo, changes: list | None) -> tuple:
    """(source op, class, signature): what two ops of one cause have in common."""
    if changes:
        signature = tuple(sorted((c.declared.dtype, c.source.dtype, c.what) for c in changes))
        return op.op, TYPE_CLASS, signature, triaged.verdict if triaged.verdict != "isolated" else ""
    if triaged.verdict in ("isolated", "propagated"):
        return op.op, triaged.wrong, triaged.verdict, ""
    return op.op, triaged.verdict, _signature(triaged.summary), ""


def _signature(message: str) -> str:
    """A failed run's message with what varies between two ops of one cause blanked."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return _VOLATILE.sub("#", first)[:SIGNATURE_CHARS]


def _cause_text(triaged: TriagedOp, op: OpInfo, changes: list | None) -> str:
    """One line naming the cause: the source op, then what goes wrong."""
    short = op.op.removeprefix("aten.").rsplit(".", 1)[0] if op.op.startswith("aten.") else op.op
    if changes:
        declared = ", ".join(sorted({c.declared.dtype for c in changes}))
        source = ", ".join(sorted({c.source.dtype for c in changes}))
        failure = f": {triaged.verdict}" if triaged.verdict not in ("isolated", "propagated", TYPE_CLASS) else ""
        what = f"declared {declared} where the source computed {source}" if declared != source else \
            "; ".join(c.describe() for c in changes)
        if all(c.stock for c in changes) and declared != source:
            return f"{short}: the stock import declares {declared} where the source computed {source}{failure}"
        return f"{short} {what}{failure}"
    if triaged.verdict in ("isolated", "propagated"):
        dtype = f" ({op.outputs[0].dtype})" if op.outputs else ""
        return f"{short}{dtype}: {triaged.wrong or 'wrong'} ({triaged.verdict})"
    first = " ".join(triaged.summary.split())[:SIGNATURE_CHARS]
    return f"{short}: {triaged.verdict}: {first}"
