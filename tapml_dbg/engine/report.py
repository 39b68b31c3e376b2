"""The data of `tapml-dbg report`: every op's isolated and propagated verdict along the model.

Two sweeps, no verdict rule of its own:
- isolated: the session's batched sweep (`Verdicts.isolated_many`: many ops per compiled unit);
- propagated: the whole model on the target with every op fed the target's own upstream values
  (every op offloaded, as `continue` from op 0 runs it): engine/propagation.py's chain of per-op
  kernels, a segment at a time, the values `step`, bisect and `run --offload all` compute.
Each value is judged by `Verdicts.judge`; the culprit is the first op `engine.stops` would stop
`continue` at (`first_divergence`), or bisect's culprit when a bisect result is given, so the
page, the CLI and the REPL tell one story.

Room for what comes next: the noise floor of [8] (the source's own error against a float64
reference, read from the metrics where they carry it: `OpPoint.noise_floor`, `OpPoint.tolerance`
then gives the noise-floor bound), the class of a failing verdict ([8]: `OpPoint.wrong`), and a
migration curve ([9]: `ErrorReport.migration`, shown when set).

A generation trace ([15]) adds `ErrorReport.generation`: per step, the worst propagated error of
the step's ops (read from the verdicts above, nothing run again) beside the step's teacher-forced
token verdict and KL (engine/generation.py: one more chained run, or the bisect's own when a bisect
result is given).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from tapml_dbg.engine.generation import TokenReport, teacher_forced, trace_generation
from tapml_dbg.engine.migrate import MigrateResult
from tapml_dbg.engine.propagation import OpValue
from tapml_dbg.engine.results import BisectResult, Culprit, StepResult
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.stops import first_divergence
from tapml_dbg.judge.tokens import TokenStep
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode, Status, Verdict
from tapml_dbg.model.generation import GenerationInfo
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.trace.inspect import trace_info

MAX_LAYER_BANDS = 24  # the deepest layer level with at most this many bands is drawn
# [8]'s fields, read with getattr so that a trace judged without them (the fixed policy) draws too
SOURCE_ERROR_FIELD = "source_err"  # Metrics: max |source - float64 reference| (absolute)
BOUND_FIELD = "noise_bound"  # Metrics: the target error the noise-floor rule allows (absolute)
CLASS_FIELD = "wrong"  # Verdict: what kind of wrong a failing verdict is
EVIDENCE_FIELD = "evidence"  # Verdict: why it is that class

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass
class OpPoint:
    """One op along the model: its two verdicts."""

    index: int
    name: str
    op: str
    layer: str
    dtype: str  # the first output's dtype ("" when the op has no tensor output)
    isolated: Verdict | None = None
    propagated: Verdict | None = None

    def verdict(self, mode: Mode) -> Verdict | None:
        return self.isolated if mode == ISOLATED else self.propagated

    def error(self, mode: Mode) -> float | None:
        """The worst output's error relative to the source's scale (`rel`), None when not judged."""
        verdict = self.verdict(mode)
        if verdict is None or not verdict.status.judged or verdict.worst is None:
            return None
        return float(verdict.worst.scale_rel_err)

    def tolerance(self, mode: Mode) -> float | None:
        """What the error was held to, in `rel` units: the noise-floor bound where the rule set one
        ([8]), else the rtol (the dtype's, or the op's override; looser when propagated)."""
        metrics = self._metrics(mode)
        if metrics is None:
            return None
        bound = getattr(metrics, BOUND_FIELD, None)
        if isinstance(bound, (int, float)):  # the noise-floor rule judged it: its bound, when it converts
            return _relative(metrics, bound)
        return float(metrics.rtol)

    def noise_floor(self, mode: Mode = ISOLATED) -> float | None:
        """The source's own error against a float64 reference, in `rel` units ([8]); None without one."""
        metrics = self._metrics(mode)
        return _relative(metrics, getattr(metrics, SOURCE_ERROR_FIELD, None)) if metrics is not None else None

    def wrong(self) -> tuple[str, str]:
        """The class of the failing verdict and its evidence ([8]); ("", "") when none is given."""
        for verdict in (self.isolated, self.propagated):
            kind = getattr(verdict, CLASS_FIELD, None) if verdict is not None and verdict.failed else None
            if kind:
                return str(kind), str(getattr(verdict, EVIDENCE_FIELD, "") or "")
        return "", ""

    def _metrics(self, mode: Mode):
        verdict = self.verdict(mode)
        return verdict.worst if verdict is not None and verdict.metrics else None

    def failed_run(self, mode: Mode) -> bool:
        """The unit did not run to a value (compile-error, crash, timeout, error)."""
        verdict = self.verdict(mode)
        return verdict is not None and verdict.failed and not verdict.status.judged

    def step(self) -> StepResult:
        return StepResult(self.index, self.name, self.op, self.layer, self.isolated, self.propagated)


def _relative(metrics, absolute) -> float | None:
    """An absolute error of an output as a share of the output's scale (absmax of the source), the
    unit of `scale_rel_err`; None when it is not given or the scale cannot be told."""
    if not isinstance(absolute, (int, float)) or metrics.max_abs_err <= 0 or metrics.scale_rel_err <= 0:
        return None
    return float(absolute) * metrics.scale_rel_err / metrics.max_abs_err


@dataclass
class LayerBand:
    """A run of consecutive ops inside one layer, at the level the chart draws."""

    path: str
    first: int
    last: int


@dataclass
class MigrationPoint:
    """One step of a gradual migration ([9]): ops [0, boundary) on the target, the model's output error."""

    boundary: int
    label: str
    error: float | None
    passed: bool


def migration_points(result: MigrateResult) -> list[MigrationPoint]:
    """The report's migration curve from `Session.migrate`: per step, how many ops are on the target,
    what the step adds, the output's error (None: not finite, or the run failed) and its verdict."""
    return [MigrationPoint(len(step.offload), step.label, step.error, step.passed) for step in result.steps]


@dataclass
class StepPoint:
    """One step of a generation trace ([15]): its ops' worst propagated error and its token verdict."""

    step: int
    kind: str  # model.generation.PREFILL or DECODE
    start: int  # the sequence positions [start, end) the step adds to the cache
    end: int
    first: int | None = None  # the first and last op of the step (None: no op carries the step)
    last: int | None = None
    worst: float | None = None  # the worst propagated error (`rel`) of the step's ops; None: none judged
    worst_op: int | None = None  # the op that has it
    failing: int = 0  # ops of the step whose propagated verdict fails (a failed run included)
    token: TokenStep | None = None  # teacher-forced; None: the chain stopped before this step

    @property
    def positions(self) -> str:
        return f"[{self.start}, {self.end})"


@dataclass
class GenerationReport:
    """A generation trace's steps on the page: the teacher-forced tokens and the per-step errors."""

    info: GenerationInfo
    tokens: TokenReport
    steps: list[StepPoint] = field(default_factory=list)

    @property
    def first_bad(self) -> TokenStep | None:
        return self.tokens.first_bad


def generation_points(session: Session, points: list[OpPoint], tokens: TokenReport | None = None,
                      progress: Progress = _noop) -> GenerationReport | None:
    """Per step of `session`'s generation, the worst propagated error among `points` of that step and
    the step's teacher-forced token verdict (`tokens` when given, else one more chained run); None for
    a trace of one forward."""
    info = trace_generation(session)
    if info is None:
        return None
    if tokens is None:
        progress(0, 1, "teacher-forced tokens")
        tokens = teacher_forced(session)
        progress(1, 1, "teacher-forced tokens done")
    by_token = {token.step: token for token in tokens.steps}
    steps = {step.step: StepPoint(step.step, step.kind, step.start, step.end, token=by_token.get(step.step))
             for step in info.steps}
    ops = session.ops
    for point in points:
        step = steps.get(ops[point.index].step)
        if step is None:
            continue
        step.first = point.index if step.first is None else min(step.first, point.index)
        step.last = point.index if step.last is None else max(step.last, point.index)
        verdict = point.propagated
        if verdict is not None and verdict.failed:
            step.failing += 1
        error = point.error(PROPAGATED)
        if error is not None and (step.worst is None or _worse(error, step.worst)):
            step.worst, step.worst_op = error, point.index
    return GenerationReport(info, tokens, [steps[k] for k in sorted(steps)])


def _worse(error: float, than: float) -> bool:
    """`error` is worse than `than`: a non-finite error (NaN, Inf) is worse than any finite one."""
    if not math.isfinite(than):
        return False
    return not math.isfinite(error) or error > than


@dataclass
class ErrorReport:
    """Everything the report page shows; the UI draws it, nothing here knows HTML."""

    trace: str
    target: str  # where it ran ("llvm", "cuda via rpc HOST:PORT")
    points: list[OpPoint]
    bands: list[LayerBand]
    summary: dict  # trace_info without the op table
    culprit: Culprit | None = None
    culprit_source: str = ""  # "bisect" or "continue" (the first divergence of the two sweeps)
    bisect: BisectResult | None = None
    seconds: float = 0.0
    units: int = 0
    migration: list[MigrationPoint] | None = None  # [9]; None: not asked for
    causes: object | None = None  # a TriageResult over these points (engine/triage.py builds on this module)
    generation: GenerationReport | None = None  # [15]: a generation trace's steps; None for one forward
    notes: list[str] = field(default_factory=list)
    reference: dict = field(default_factory=lambda: {"kind": "source", "target": None})  # engine/reference.py
    tvm_wide: list = field(default_factory=list)  # TvmWideOp: where the reference target differs from the source

    @property
    def culprit_point(self) -> OpPoint | None:
        return self.points[self.culprit.index] if self.culprit is not None else None

    @property
    def has_noise_floor(self) -> bool:
        return any(point.noise_floor() is not None for point in self.points)

    def failing(self, mode: Mode) -> list[OpPoint]:
        return [p for p in self.points if p.verdict(mode) is not None and p.verdict(mode).failed]


def build_report(session: Session, bisect: BisectResult | None = None, progress: Progress = _noop) -> ErrorReport:
    """Both verdicts of every op of `session`'s trace, the culprit, the layer bands and the summary."""
    started = time.perf_counter()
    units_before = session.lanes.units
    ops = session.ops
    points = error_points(session, progress=progress)
    summary = trace_info(str(session.reader.path))
    summary.pop("ops", None)
    report = ErrorReport(trace=str(session.reader.path), target=session.where, points=points,
                         bands=layer_bands(ops), summary=summary, bisect=bisect)
    if bisect is not None:
        report.culprit, report.culprit_source = bisect.culprit, "bisect"
        report.notes += bisect.notes
    else:
        report.culprit = first_divergent(points, ops)
        report.culprit_source = "continue" if report.culprit else ""
    report.reference, report.tvm_wide = session.against.to_json(), list(session.against.tvm_wide)
    if report.culprit is not None and report.culprit.attribution is None:
        report.culprit.attribution = session.against.attribution(report.culprit.index)
    report.generation = generation_points(session, points, bisect.tokens if bisect is not None else None, progress)
    report.seconds = time.perf_counter() - started
    report.units = session.lanes.units - units_before
    return report


def error_points(session: Session, indices: list[int] | None = None, progress: Progress = _noop) -> list[OpPoint]:
    """Both verdicts of ops `indices` (default: all), as `report` and the REPL's `plot` show them.

    The propagated chain runs from op 0 to the last op asked for: values flow from the start. It
    runs on the side worker while the lanes run the isolated verdicts, where there is one; its
    verdicts are judged after those (a propagated failure takes its class from an isolated one).
    A kept op (engine/kept.py) gets neither verdict.
    """
    ops = session.ops
    wanted = sorted(set(range(len(ops)) if indices is None else indices))
    if not wanted:
        return []
    judged = [i for i in wanted if ops[i].outputs and i not in session.kept]
    series = session.chains.series_beside(last=wanted[-1])
    try:
        isolated = session.verdicts.isolated_many(judged, progress)
        propagated = propagated_chain(session, progress, last=wanted[-1], series=series)
    finally:
        if series is not None:
            series.close()
    return [OpPoint(ops[i].index, ops[i].name, ops[i].op, ops[i].layer, ops[i].outputs[0].dtype if ops[i].outputs
                    else "", isolated.get(i), propagated.get(i)) for i in wanted]


def first_divergent(points: list[OpPoint], ops: list[OpInfo]) -> Culprit | None:
    """Where `continue` from the first point would stop (engine.stops' rule), as a culprit."""
    stop = first_divergence([p.step() for p in points if p.isolated or p.propagated], ops)
    return culprit_of(stop, ops[stop.index]) if stop is not None else None


def culprit_of(step: StepResult, op: OpInfo) -> Culprit:
    """A diverging op as bisect names one: isolated when its kernel is wrong, else propagated."""
    verdict = step.isolated if step.isolated is not None and step.isolated.failed else step.propagated
    kind = verdict.mode if verdict.status.judged else verdict.status
    return Culprit(op.index, op.name, op.op, op.layer, kind, verdict.worst, verdict.message, verdict.wrong,
                   verdict.evidence, source_location=op.source_location, step=op.step)


def propagated_chain(session: Session, progress: Progress = _noop, last: int | None = None,
                     series: Iterable[OpValue] | None = None) -> dict[int, Verdict]:
    """Every op's (up to `last`) propagated verdict: engine/propagation.py's series (or `series`,
    that series made beside: `series_beside`), judged. A kept op (engine/kept.py) gets none; an op
    the trace cannot feed, a missing one."""
    verdicts: dict[int, Verdict] = {}
    if series is not None:
        progress(0, 1, "propagated chain (beside the isolated verdicts)")
    for index, result, outputs in (session.chains.series(progress, last) if series is None else series):
        op = session.ops[index]
        verdicts[index] = (session.verdicts.judge(index, PROPAGATED, result, outputs) if result is not None else
                           Verdict(index, op.name, PROPAGATED, Status.MISSING,
                                   message=session.reader.recorded.missing_values_message(index)))
    if series is not None:
        progress(1, 1, "propagated chain done")
    return verdicts


def layer_bands(ops: list[OpInfo], max_bands: int = MAX_LAYER_BANDS) -> list[LayerBand]:
    """Runs of consecutive ops in one layer, at the deepest nesting level that gives at most
    `max_bands` runs (ops outside every layer get no band)."""
    depth = max((len(op.layer.split(".")) for op in ops if op.layer), default=0)
    for level in range(depth, 0, -1):
        bands = _bands_at(ops, level)
        if len(bands) <= max_bands:
            return bands
    return _bands_at(ops, 1) if depth else []


def _bands_at(ops: list[OpInfo], level: int) -> list[LayerBand]:
    bands: list[LayerBand] = []
    for op in ops:
        path = ".".join(op.layer.split(".")[:level]) if op.layer else ""
        if bands and bands[-1].path == path and bands[-1].last == op.index - 1:
            bands[-1].last = op.index
        elif path:
            bands.append(LayerBand(path, op.index, op.index))
    return bands
