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

It is also the one table of commands: a method (or function) marked `@command(Command(...))` is a
`tapml-dbg` subcommand, and a REPL command when its entry has `repl_help`; `ui/verbs.py` makes both
front ends' parsers, usage lines and completion from the entry, `ui/cli.py` calls it and renders the
result (`ui/render.py`, one renderer per result type). A new command is its engine function, one
method here with its entry, and its renderer (docs/architecture.md "What a new command touches").
"""

from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tapml_dbg.engine.diff import DiffResult, DiffTolerance, diff_traces
from tapml_dbg.engine.fix import FixResult, fix as fix_causes
from tapml_dbg.engine.generation import TokenReport, free_running, teacher_forced
from tapml_dbg.engine.migrate import MigrateResult
from tapml_dbg.engine.mixed import MixedRun, parse_offload
from tapml_dbg.engine.report import OpPoint, error_points
from tapml_dbg.engine.results import BisectResult, CompileReport, StepResult
from tapml_dbg.engine.reference import Reference
from tapml_dbg.engine.session import Session, open_judged
from tapml_dbg.engine.triage import TriageResult, triage
from tapml_dbg.errors import UsageError
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.repro.carve import CarveResult, carve as carve_ops
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


# ---------------------------------------------------------------------- the table of commands
@dataclass(frozen=True)
class Arg:
    """One argument of a command, in argparse's words (`flags`: `("trace",)` for a positional, or
    `("-o", "--output")`), and where its value goes: `param`, the API's keyword it fills (None: the front
    ends' own, as `--json` or the target options the CLI opens the trace with). `repl`: the REPL's
    command takes it too, as the same `--flag` (a switch, or one word of `choices`)."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    type: Callable | None = None
    default: object = None
    choices: tuple[str, ...] = ()
    switch: bool = False  # a flag that takes no value (store_true)
    required: bool = False
    group: str = ""  # mutually exclusive with the other arguments of this group (required when they are)
    param: str | None = None
    repl: bool = False

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def flag(self) -> str:
        """The long spelling: `--output`, `--no-sweep`."""
        return self.flags[-1]

    @property
    def dest(self) -> str:
        """The name argparse stores its value under."""
        return self.flags[0] if self.positional else self.flag.lstrip("-").replace("-", "_")

    @property
    def words(self) -> str:
        """`--by layer|op`, `--no-sweep`: how usage lines and error hints write it."""
        return f"{self.flag} {'|'.join(self.choices)}" if self.choices else self.flag


@dataclass(frozen=True)
class Command:
    """A command, declared once: its CLI subcommand (`summary`: its line in `tapml-dbg --help`;
    `description`: what `tapml-dbg NAME --help` says after it; `arguments` in their help's order), its
    REPL command (`repl_help`: a summary line, then the body; None: the command line's only; `operands`:
    the REPL's positional words after the options, as its usage line writes them, completed by
    `operand_completion`), the label of its progress bar, and the API method or function it calls."""

    name: str
    summary: str
    description: str
    arguments: tuple[Arg, ...]
    progress: str = ""
    repl_help: str | None = None
    operands: str = ""
    operand_completion: tuple = ()
    function: Callable | None = None  # set by `command`

    @property
    def on_replay(self) -> bool:
        """A `Replay` method (the trace opened on a target first), or a function of its own arguments
        (declared outside a class)."""
        return "." in self.function.__qualname__

    @property
    def repl_options(self) -> tuple[Arg, ...]:
        return tuple(arg for arg in self.arguments if arg.repl)

    def params(self, values: dict) -> dict:
        """The API's keywords from the front end's values by dest (those it has)."""
        return {arg.param: values[arg.dest] for arg in self.arguments if arg.param and arg.dest in values}


COMMANDS: list[Command] = []  # in the order they are declared below


def command(entry: Command) -> Callable:
    """Mark an API method (or function) as the command `entry` declares (it is added to COMMANDS)."""
    def register(function: Callable) -> Callable:
        COMMANDS.append(replace(entry, function=function))
        return function

    return register


def find_command(name: str) -> Command:
    """The entry of the command `name` (a KeyError when the table has none)."""
    for entry in COMMANDS:
        if entry.name == name:
            return entry
    raise KeyError(f"no command {name!r} in the table of commands")


HELP_WIDTH = 95  # a REPL help body written from one paragraph is wrapped at this width


def _wrapped(summary: str, body: str) -> str:
    return summary + "\n" + textwrap.fill(body, HELP_WIDTH)


TRACE_HELP = "a trace written by `tapml-dbg record` (.h5)"
TARGET_HELP = ("TVM target: a kind (llvm, cuda, opencl, metal, webgpu) or, with options, a JSON dict such as "
               "'{\"kind\":\"llvm\",\"mcpu\":\"haswell\"}' (TVM 0.27 refuses the old \"llvm -mcpu=...\" "
               "string form); default llvm")
KEEP_HELP = ("ops kept on the source (a known bug, or one assumed fixed): cut out of the target's units, so the "
             "search goes on past them; op selectors as in the REPL (14,37 | cumsum | 30:40 | a layer); "
             "docs/keep.md")
TRACE = (Arg(("trace",), TRACE_HELP, metavar="TRACE"),)
TARGET = (  # where units compile and run: what the CLI opens the trace with (TargetSpec.from_args)
    Arg(("--target",), TARGET_HELP, metavar="T", default="llvm"),
    Arg(("--rpc",), "run on a TVM RPC server", metavar="HOST:PORT", group="remote"),
    Arg(("--tracker",), "lease devices from a TVM RPC tracker", metavar="HOST:PORT", group="remote"),
    Arg(("--key",), "device key at the tracker"),
    Arg(("--transform",), "IRModule -> IRModule pass applied before every target compile", metavar="FILE.py:FUNC"),
    Arg(("--timeout",), "seconds one unit may take to compile and run (default 300)", metavar="S", type=float),
    Arg(("--parallel",), "worker lanes for independent units (sweep batches, per-op compiles); default: one per "
                         "free tracker server for --tracker/--key, else 1", metavar="N", type=int))
REFERENCE = (  # a trusted TVM target to judge the target against, instead of the recorded source (TapML's way)
    Arg(("--reference-target",), "judge the target against the same units on this trusted TVM target (computed "
                                 "once and kept), not against the recorded source: a divergence T shares is listed "
                                 "as TVM-wide, never the culprit (docs/reference-target.md)", metavar="T"),
    Arg(("--reference-rpc",), "the reference target over TVM RPC", metavar="HOST:PORT"),
    Arg(("--reference-transform",), "a pass you trust, applied to the reference target's builds (default: none)",
        metavar="FILE.py:FUNC"))
KEEP = (Arg(("--keep",), KEEP_HELP, metavar="OPS"),)
JSON = (Arg(("--json",), "one JSON object on stdout", switch=True),)


def _arguments(*groups: tuple[Arg, ...] | Arg) -> tuple[Arg, ...]:
    return tuple(arg for group in groups for arg in ((group,) if isinstance(group, Arg) else group))


BISECT_DESCRIPTION = (
    "Chains every op on the target, each compiled alone and fed the target's own values before it, and "
    "screens every value as it is computed: the first wrong op, isolated or propagated, is the candidate. "
    "When the chain finds nothing, prefixes of the model compiled as one unit are searched for a fusion bug. "
    "Then the isolated verdicts of the ops below the candidate are swept (--no-sweep skips it), so a fault "
    "that washes out downstream is still found; an op whose import changes its dtype or shape counts too.")
BISECT = Command(
    "bisect", "find the first divergent op", BISECT_DESCRIPTION,
    _arguments(TRACE, TARGET, REFERENCE, JSON,
               Arg(("--no-sweep",), "skip the isolated sweep that catches faults which wash out downstream",
                   switch=True, repl=True),
               Arg(("--report",), "also write the HTML report (as `tapml-dbg report`) to DIR", metavar="DIR"),
               KEEP),
    progress="bisecting", repl_help=_wrapped("Find the first divergent op.", BISECT_DESCRIPTION + " Ctrl-C cancels."))
TRIAGE = Command(
    "triage", "list every divergent op, grouped by cause",
    "Both verdicts of every op (as `report`), then every op that diverges by itself (its isolated verdict fails, "
    "the import changes its type, or its propagated verdict fails with nothing wrong upstream), grouped by source "
    "op, class and failure signature; failures inherited from a cause are folded into it (docs/triage.md).",
    _arguments(TRACE, TARGET, REFERENCE, JSON, KEEP), progress="triage",
    repl_help="Every divergent op of the model, grouped by cause.\n"
              "Both verdicts of every op (as `plot`), then the ops that diverge by themselves (isolated\n"
              "failure, a type the import changed, or a propagated failure with nothing wrong upstream),\n"
              "grouped by source op, class and failure signature; inherited failures folded in.")
FIX = Command(
    "fix", "write a verified fix transform for every cause triage finds",
    "Triage, then for each cause the rewrites its class suggests (precision: the op in float32, the fewest ops as "
    "Polygraphy's `debug precision`; type: casts to the source's dtype; bool operands that do not build: integer "
    "casts; pow(x, 2|3): multiplies; x[-1] read out of bounds: the index wrapped; on GPU targets a failing schedule: "
    "DefaultGPUSchedule), each kept only when the op's isolated verdict passes under it; the whole transform is "
    "verified with a mixed run of the model (`run --offload all`). Writes DIR/fix.py (FUNC `fix`, for `--transform "
    "DIR/fix.py:fix` or your own TVM pipeline) and DIR/README.md (docs/fix.md).",
    _arguments(TRACE, Arg(("-o", "--output"), "the folder to write fix.py and README.md into", metavar="DIR",
                          required=True, param="folder"), TARGET, JSON), progress="fix")
MIGRATE = Command(
    "migrate", "offload the model step by step and find where its output breaks",
    "TapML's gradual migration: the offloaded prefix grows one top-level block (or op) per step, one mixed run "
    "each; a table of the output's error per step, the first failing step and the op inside it that breaks the "
    "output (docs/migrate.md).",
    _arguments(TRACE,
               Arg(("--by",), "what a step adds: a top-level block (default) or one op", choices=("layer", "op"),
                   default="layer", param="by", repl=True),
               Arg(("--one-at-a-time",), "only one block (or op) on the target per step, the rest on the source: "
                                         "ranks them by their effect on the output", switch=True,
                   param="one_at_a_time", repl=True),
               TARGET, JSON, KEEP),
    progress="migrating",
    repl_help="TapML's gradual offload: one mixed run per step, the step that breaks the output, its culprit.\n"
              "The offloaded prefix grows one top-level block (or op) at a time; --one-at-a-time puts one\n"
              "block alone on the target to rank blocks by their effect on the output (docs/migrate.md).")
RUN = Command(
    "run", "run the model once mixed: the offload set on the target, the rest on the source",
    "Ops off the target re-execute on torch CPU in the recorded dtype, fed the values before them (the target's "
    "where their producer is offloaded); prints the model's outputs against the recording, top-1 agreement of the "
    "last dimension and the ops failing in that run (docs/migrate.md).",
    _arguments(TRACE,
               Arg(("--offload",), "what runs on the target: all (default), none, or op selectors as in the REPL "
                                   "(0:120, a name, transformer.h.0,transformer.h.3)", metavar="SPEC", default="all",
                   param="offload"),
               TARGET, JSON, KEEP),
    progress="mixed run",
    repl_help="Run the whole model once mixed: the offload set on the target, the rest on the source.\n"
              "Ops off the target re-execute on torch CPU fed the values before them (the target's where\n"
              "their producer is offloaded); prints the model's outputs against the recording and the ops\n"
              "failing in that run. Without argument: the offload set (`boundary`, `offload`).",
    operands="[all|none|OPS|LAYERS]", operand_completion=(("all", "none", "<layer>"),))
DUMP = Command(
    "dump", "write one op as a standalone repro",
    "A folder with the op's Relax module, its recorded inputs and outputs, and a repro.py that needs only tvm and "
    "numpy.",
    _arguments(TRACE,
               Arg(("--op",), "op index or name (`tapml-dbg info TRACE --json` lists them); an op that fails only "
                              "compiled with its producers (fused) is written as that unit", metavar="OP",
                   group="which", required=True, param="op"),
               Arg(("--ops",), "a range of ops written as one unit (one function), fed its recorded inputs, compared "
                               "at the values it hands on", metavar="A:B", group="which", required=True),
               Arg(("-o", "--output"), "the folder to write the repro into", metavar="DIR", required=True,
                   param="folder"),
               Arg(("--minimize",), "shrink the inputs to the smallest shapes that still fail (expected values from "
                                    "the source re-executed in float64 at those shapes) and write the repro at them",
                   switch=True, param="minimize"),
               TARGET),
    progress="minimizing",
    repl_help="Write an op as a standalone repro into DIR.\n"
              "The repro needs only tvm and numpy. OP may be a range A:B: ops A..B-1 as one unit; an op\n"
              "that fails only compiled with its producers (fused) is written as that unit.",
    operands="OP DIR", operand_completion=(("<op>",), ("<path>",)))
CARVE = Command(
    "carve", "write every op as a pytest suite",
    "One test per op with its recorded inputs, runnable without the model or tapml-dbg.",
    _arguments(TRACE,
               Arg(("-o", "--output"), "the folder to write the suite into", metavar="DIR", required=True,
                   param="folder"),
               Arg(("--max-mb",), "size budget for the suite's data", type=float, param="max_mb"),
               Arg(("--unit",), "one test per op (default), or per layer: its consecutive ops compiled as one "
                                "function", choices=("op", "layer"), default="op", param="unit"),
               TARGET),
    progress="carving")
COMPILE = Command(
    "compile", "compile every op for a target without running it",
    "A codegen-only check: needs no device, so it works for a GPU target on a machine without one.",
    _arguments(TRACE, TARGET, Arg(("--json",), "one JSON object on stdout (the failures)", switch=True)),
    progress="compiling")
DIFF = Command(
    "diff", "compare two recordings of one model op by op and layer by layer",
    "Ops pair by name (and by step in generation traces): one model recorded twice, with two torch versions, "
    "--source torch and tvm:T, or in float32 and bfloat16. B is compared against A with the judge's compare rule, "
    "values of two dtypes in float64; every layer is compared at its last op, so you see where the recordings "
    "part. No target, nothing run (docs/diff.md).",
    _arguments(Arg(("trace",), "the reference recording (.h5)", metavar="TRACE_A", param="a"),
               Arg(("trace_b",), "the recording compared against it (.h5)", metavar="TRACE_B", param="b"),
               Arg(("--rtol",), "one tolerance for every float op: max_abs <= atol + X * absmax(A) (default: the "
                                "judge's for the lowest precision the op is computed from in either trace: float32 "
                                "1e-4, bfloat16 4e-2)", metavar="X", type=float, param="rtol"),
               Arg(("--atol",), "with --rtol: the absolute part (default 0)", metavar="Y", type=float, param="atol"),
               Arg(("--ops",), "compare only these ops of TRACE_A (op selectors: 0:40, a name, a layer, @K) and the "
                               "layers that end in them", metavar="SEL", param="ops"),
               JSON),
    progress="diff")


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

    @command(BISECT)
    def bisect(self, sweep: bool = True, progress: Progress = _noop) -> BisectResult:
        """The first divergent op (`tapml-dbg bisect`)."""
        return self.session.bisect(sweep=sweep, progress=progress)

    def compare(self, op: int | str) -> StepResult:
        """Both verdicts of one op (an index, `#12`, `-1` or a name), as the REPL's `compare`."""
        return self.session.compare(self.session.resolve(op).index)

    @command(TRIAGE)
    def triage(self, progress: Progress = _noop) -> TriageResult:
        """Every divergence grouped by cause (`tapml-dbg triage`)."""
        started = time.perf_counter()
        result = triage(self.session, progress, self._verdicts(progress))
        result.seconds = time.perf_counter() - started  # with the verdicts' sweeps, when they ran here
        return result

    @command(FIX)
    def fix(self, folder: str | Path, progress: Progress = _noop) -> FixResult:
        """Verified rewrites for the causes `triage()` finds, written as `folder/fix.py` (FUNC `fix`, for
        `transform="folder/fix.py:fix"` or the user's own pipeline) and `folder/README.md` (`tapml-dbg fix`)."""
        started = time.perf_counter()
        result = fix_causes(self.session, folder, progress, triaged=self.triage(progress))
        result.seconds = time.perf_counter() - started  # with the triage's sweeps, when they ran here
        return result

    @command(MIGRATE)
    def migrate(self, by: str = "layer", one_at_a_time: bool = False, progress: Progress = _noop) -> MigrateResult:
        """TapML's gradual offload (`tapml-dbg migrate`)."""
        return self.session.migrate(by, one_at_a_time, progress)

    @command(RUN)
    def run(self, offload: str = "all", progress: Progress = _noop) -> MixedRun:
        """One mixed run (`tapml-dbg run --offload SPEC`): `all`, `none` or op selectors."""
        return self.session.run_mixed(parse_offload(self.session.op_table, offload), progress=progress)

    def tokens(self, free: bool = False) -> TokenReport:
        """A generation trace's tokens on the target beside the source's, one `TokenStep` per step
        (`.first_bad`: the first step whose token differs): teacher-forced, every step fed the source's
        token; `free=True`: the target fed its own tokens (the REPL's `tokens [free]`). A trace without
        steps raises a `UsageError`."""
        return free_running(self.session) if free else teacher_forced(self.session)

    @command(DUMP)
    def dump(self, op: int | str | None, folder: str | Path, minimize: bool = False, progress: Progress = _noop,
             ops: str | None = None, command: str | None = None) -> DumpResult:
        """One op as a standalone repro folder (`tapml-dbg dump`); `ops="A:B"` (with `op` None): that range as
        one unit. `command`: how its README says it was made (default: this call)."""
        return dump_op(self.session, None if op is None else str(op), str(folder), ops=ops, minimize=minimize,
                       command=command or f"tapml_dbg.open(...).dump({op!r})", progress=progress)

    @command(CARVE)
    def carve(self, folder: str | Path, max_mb: float | None = None, unit: str = "op",
              progress: Progress = _noop) -> CarveResult:
        """Every op as a pytest suite in `folder`, one test per op (`unit="layer"`: per layer), runnable
        without the model or tapml-dbg (`tapml-dbg carve`)."""
        return carve_ops(self.session, str(folder), max_mb=max_mb, progress=progress, unit=unit)

    @command(COMPILE)
    def compile(self, progress: Progress = _noop) -> CompileReport:
        """Every op compiled for the target, none run: the ops that do not build (`tapml-dbg compile`)."""
        return self.session.compile_all(progress=progress)

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


@command(DIFF)
def diff(a: str | Path, b: str | Path, *, rtol: float | None = None, atol: float | None = None,
         ops: str | None = None, progress: Progress = _noop) -> DiffResult:
    """Two recordings of one model compared op by op (ops paired by name, and step) and at every layer's
    last op, B against A (`tapml-dbg diff A B`; docs/diff.md). No target and no replay: both traces are only
    read. `rtol` (and `atol`): one tolerance for every float op instead of the judge's by dtype; `ops`: op
    selectors resolved on A. A missing or damaged trace, or two traces with no op name in common, raises
    a `TapmlError`."""
    return diff_traces(a, b, DiffTolerance(rtol=rtol, atol=atol), ops=ops, progress=progress)
