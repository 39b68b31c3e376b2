"""tapml-dbg from Python: a trace opened on a target, asked what the CLI asks, answered with objects.

For scripts and notebooks (docs/api.md):

    import tapml_dbg
    with tapml_dbg.open("traces/demo.h5", target="llvm") as replay:
        found = replay.bisect()          # BisectResult, .to_json() as `bisect --json` prints it
        frame = replay.table()           # a pandas DataFrame, one row per op
        causes = replay.triage()         # every divergence grouped by cause
        fixed = replay.fix("fix/")       # verified rewrites: fix/fix.py, for transform="fix/fix.py:fix"
        tokens = replay.tokens()         # a generation trace's tokens on the target beside the source's

Each method returns the result object the CLI renders (each has `to_json()`); the CLI's commands
are this layer plus rendering. pandas is needed only by `table()` (`pip install tapml-dbg[api]`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from tapml_dbg.engine.diff import DiffResult, DiffTolerance, diff_traces
from tapml_dbg.engine.fix import FixResult, fix as fix_causes
from tapml_dbg.engine.generation import TokenReport, free_running, teacher_forced
from tapml_dbg.engine.migrate import MigrateResult
from tapml_dbg.engine.mixed import MixedRun, parse_offload
from tapml_dbg.engine.report import OpPoint, error_points
from tapml_dbg.engine.results import BisectResult, StepResult
from tapml_dbg.engine.reference import Reference
from tapml_dbg.engine.session import Session, open_judged
from tapml_dbg.engine.triage import TriageResult, triage
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.repro.dump import DumpResult, dump_op
from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR
from tapml_dbg.runtime.target import DEFAULT_UNIT_TIMEOUT_S, TargetSpec

Progress = Callable[..., None]
TABLE_COLUMNS = ("index", "name", "op", "layer", "step", "file", "line", "code", "library", "user_file", "user_line",
                 "dtype", "isolated", "isolated_error",
                 "isolated_tolerance", "propagated", "propagated_error", "propagated_tolerance", "class", "evidence")
NULLABLE_INT = "Int64"  # pandas' integer dtype with a missing value: `step` stays an int, <NA> outside a generation


def _noop(*_args, **_kwargs) -> None:
    return None


class Replay:
    """One trace on one target. Use as a context manager (it holds worker processes) or `close()` it."""

    def __init__(self, session: Session):
        self.session = session
        self._points: list[OpPoint] | None = None  # both verdicts of every op, once asked for
        self._points_kept: frozenset[int] = frozenset()  # the kept set they were computed with

    @classmethod
    def from_spec(cls, trace: str | Path, spec: TargetSpec, *, searching: bool = False,
                  cache_dir: str | Path = DEFAULT_CACHE_DIR, reference: TargetSpec | None = None,
                  progress: Progress = _noop) -> "Replay":
        """What the CLI opens: `searching` starts the worker a bisect's chain runs on too; `reference`: judge
        the target against that trusted TVM target instead of the recorded source (docs/reference-target.md)."""
        return cls(open_judged(trace, spec, reference=reference, cache_dir=cache_dir, start_workers=True,
                               searching=searching, progress=progress))

    @property
    def reference(self) -> Reference:
        """What the target is judged against: `kind` "source" or "target", `tvm_wide`, `attribution(op)`."""
        return self.session.against

    def __enter__(self) -> "Replay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    @property
    def ops(self) -> list[OpInfo]:
        """The op table, in execution order."""
        return self.session.ops

    @property
    def target(self) -> str:
        """Where units run ("llvm", "cuda via rpc HOST:PORT")."""
        return self.session.where

    # ------------------------------------------------------------------ what the CLI's commands ask
    def keep(self, ops: str | list[int] | None) -> list[int]:
        """Keep ops on the source (`--keep OPS`: selectors such as `"14,37"`, `"cumsum"`, a layer, or
        `"none"`; or indices), so that every method below goes on past them (docs/keep.md); the
        kept ops, with the other bindings of their source ops."""
        if ops is None or isinstance(ops, str):
            return self.session.keep(ops or "none")
        return self.session.set_kept(ops)

    def bisect(self, sweep: bool = True, progress: Progress = _noop) -> BisectResult:
        """The first divergent op (`tapml-dbg bisect`)."""
        return self.session.bisect(sweep=sweep, progress=progress)

    def compare(self, op: int | str) -> StepResult:
        """Both verdicts of one op (an index, `#12`, `-1` or a name), as the REPL's `compare`."""
        return self.session.compare(self.session.resolve(op).index)

    def triage(self, progress: Progress = _noop) -> TriageResult:
        """Every divergence grouped by cause (`tapml-dbg triage`)."""
        started = time.perf_counter()
        result = triage(self.session, progress, self._verdicts(progress))
        result.seconds = time.perf_counter() - started  # with the verdicts' sweeps, when they ran here
        return result

    def fix(self, folder: str | Path, progress: Progress = _noop) -> FixResult:
        """Verified rewrites for the causes `triage()` finds, written as `folder/fix.py` (FUNC `fix`, for
        `transform="folder/fix.py:fix"` or the user's own pipeline) and `folder/README.md` (`tapml-dbg fix`)."""
        started = time.perf_counter()
        result = fix_causes(self.session, folder, progress, triaged=self.triage(progress))
        result.seconds = time.perf_counter() - started  # with the triage's sweeps, when they ran here
        return result

    def migrate(self, by: str = "layer", one_at_a_time: bool = False, progress: Progress = _noop) -> MigrateResult:
        """TapML's gradual offload (`tapml-dbg migrate`)."""
        return self.session.migrate(by, one_at_a_time, progress)

    def run(self, offload: str = "all", progress: Progress = _noop) -> MixedRun:
        """One mixed run (`tapml-dbg run --offload SPEC`): `all`, `none` or op selectors."""
        return self.session.run_mixed(parse_offload(self.session.op_table, offload), progress=progress)

    def tokens(self, free: bool = False) -> TokenReport:
        """A generation trace's tokens on the target beside the source's, one `TokenStep` per step
        (`.first_bad`: the first step whose token differs): teacher-forced, every step fed the source's
        token; `free=True`: the target fed its own tokens (the REPL's `tokens [free]`). A trace without
        steps raises a `UsageError`."""
        return free_running(self.session) if free else teacher_forced(self.session)

    def dump(self, op: int | str, folder: str | Path, minimize: bool = False, progress: Progress = _noop) -> DumpResult:
        """One op as a standalone repro folder (`tapml-dbg dump`)."""
        return dump_op(self.session, str(op), str(folder), command=f"tapml_dbg.open(...).dump({op!r})",
                       minimize=minimize, progress=progress)

    # ------------------------------------------------------------------ tables
    def rows(self, progress: Progress = _noop) -> list[dict]:
        """One dict per op (the columns of `table()`), without pandas."""
        return [_row(point, self.session.ops[point.index]) for point in self._verdicts(progress)]

    def table(self, progress: Progress = _noop):
        """Every op's isolated and propagated verdict and error as a pandas DataFrame indexed by op
        index: what ExecuTorch's Inspector gives as `calculate_numeric_gap`, with the class of
        every failure. The numbers are those of `tapml-dbg report` and the REPL's `plot`."""
        try:
            import pandas
        except ImportError as exc:
            raise UsageError("table() needs pandas: pip install pandas (or tapml-dbg[api]); rows() gives the "
                             "same data as dicts") from exc
        frame = pandas.DataFrame(self.rows(progress), columns=list(TABLE_COLUMNS))
        return frame.astype({"step": NULLABLE_INT}).set_index("index", drop=False)

    def _verdicts(self, progress: Progress) -> list[OpPoint]:
        """Both verdicts of every op, computed once per transform text (an edited pass recomputes)."""
        if self.session.notice_transform_edit() or self._points is None or self._points_kept != self.session.kept:
            self._points = error_points(self.session, progress=progress)
            self._points_kept = self.session.kept
        return self._points


def _row(point: OpPoint, op: OpInfo) -> dict:
    wrong, evidence = point.wrong()
    where = op.source_location  # the user's or a library's line the op comes from (None: neither)
    mine = (where.user if where.library else where) if where else None  # the user's own frame
    row = {"index": point.index, "name": point.name, "op": point.op, "layer": op.layer, "step": op.step,
           "file": where.file if where else None, "line": where.line if where else None,
           "code": where.code if where else None, "library": where.library if where else None,
           "user_file": mine.file if mine else None, "user_line": mine.line if mine else None,
           "dtype": point.dtype, "class": wrong or None, "evidence": evidence or None}
    for mode in (ISOLATED, PROPAGATED):
        row.update(_mode_columns(point, mode))
    return row


def _mode_columns(point: OpPoint, mode: Mode) -> dict:
    verdict = point.verdict(mode)
    return {str(mode): str(verdict.status) if verdict is not None else None,
            f"{mode}_error": point.error(mode), f"{mode}_tolerance": point.tolerance(mode)}


def open(trace: str | Path, target: str = "llvm", *, transform: str | None = None, rpc: str | None = None,
         tracker: str | None = None, key: str | None = None, timeout: float | None = None,
         parallel: int | None = None, cache_dir: str | Path = DEFAULT_CACHE_DIR, keep: str | None = None,
         reference_target: str | None = None, reference_rpc: str | None = None,
         reference_transform: str | None = None) -> Replay:
    """Open a trace for replay on `target` (options as the CLI's: `transform="FILE.py:FUNC"`,
    `rpc="HOST:PORT"` or `tracker=` + `key=`; `keep="14,37"`: ops kept on the source, `Replay.keep`).
    `reference_target="llvm"` (with `reference_rpc=`, `reference_transform=`): judged against that trusted
    TVM target instead of the recorded source (docs/reference-target.md).
    A bad path, trace, target or selector raises a `TapmlError`."""
    spec = TargetSpec(target=target, rpc=rpc, tracker=tracker, key=key, transform=transform,
                      timeout_s=timeout or DEFAULT_UNIT_TIMEOUT_S, parallel=parallel)
    reference = None if reference_target is None else TargetSpec(
        target=reference_target, rpc=reference_rpc, transform=reference_transform,
        timeout_s=timeout or DEFAULT_UNIT_TIMEOUT_S, parallel=parallel)
    replay = Replay.from_spec(trace, spec, cache_dir=cache_dir, reference=reference)
    if keep is not None:
        try:
            replay.keep(keep)
        except BaseException:
            replay.close()
            raise
    return replay


def diff(a: str | Path, b: str | Path, *, rtol: float | None = None, atol: float | None = None,
         ops: str | None = None, progress: Progress = _noop) -> DiffResult:
    """Two recordings of one model compared op by op (ops paired by name, and step) and at every layer's
    last op, B against A (`tapml-dbg diff A B`; docs/diff.md). No target and no replay: both traces are only
    read. `rtol` (and `atol`): one tolerance for every float op instead of the judge's by dtype; `ops`: op
    selectors resolved on A. A missing or damaged trace, or two traces with no op name in common, raises
    a `TapmlError`."""
    return diff_traces(a, b, DiffTolerance(rtol=rtol, atol=atol), ops=ops, progress=progress)
