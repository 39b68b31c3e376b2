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

Besides a trace opened on a target: `record(model, output)` writes a trace, `info(trace)` summarizes
it (`verify=True`: checks every part), `diff(a, b)` compares two.

It is also the one table of commands, and every `tapml-dbg` subcommand is an entry of it, its
arguments declared here as `Arg`s: a method (or function) marked `@command(Command(...))` is a
subcommand, and a REPL command when its entry has `repl_help`; `ui/verbs.py` makes both front ends'
parsers, usage lines and completion from the entry, `ui/cli.py` calls it and renders the result
(`ui/render.py`, one renderer per result type). The one rule: what a command computes or writes is
its API method or function here; what belongs to the command line alone (rendering, `next:` lines,
exit codes, `--json` printing) stays in `ui/cli.py`. So `replay` (an interactive terminal session)
and `serve` (a process server), which are nothing but the command line, are entries without a
function (`command_line_only`). A new command is its engine function, one method here with its
entry, and its renderer (docs/architecture.md "What a new command touches").
"""

from __future__ import annotations

import shlex
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tapml_dbg.engine.diff import DiffResult, DiffTolerance, diff_traces
from tapml_dbg.engine.fix import FixResult, fix as fix_causes
from tapml_dbg.engine.generation import TokenReport, free_running, teacher_forced
from tapml_dbg.engine.kept import kept_selector
from tapml_dbg.engine.migrate import MigrateResult
from tapml_dbg.engine.mixed import MixedRun, parse_offload
from tapml_dbg.engine.report import OpPoint, error_points
from tapml_dbg.engine.results import BisectResult, CompileReport, StepResult
from tapml_dbg.engine.reference import Reference
from tapml_dbg.engine.session import Session, open_judged
from tapml_dbg.engine.triage import TriageResult, triage
from tapml_dbg.errors import UsageError
from tapml_dbg.frontend.generation import parse_steps
from tapml_dbg.frontend.native import defines_native
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.repro.carve import CarveResult, carve as carve_ops
from tapml_dbg.repro.dump import DumpResult, dump_op
from tapml_dbg.record.native import record_native
from tapml_dbg.record.native_llm import record_native_generation
from tapml_dbg.record.recorder import RecordResult, record as record_torch
from tapml_dbg.report.folder import ReportFolder, ReportOptions, write_report_folder
from tapml_dbg.runtime import fork_server
from tapml_dbg.runtime.compile_cache import DEFAULT_CACHE_DIR
from tapml_dbg.runtime.target import DEFAULT_UNIT_TIMEOUT_S, TargetSpec
from tapml_dbg.trace.inspect import TraceInfo, trace_info
from tapml_dbg.trace.schema import tvm_source_target
from tapml_dbg.trace.verify import VerifyReport, verify_trace

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
    store: str | None = None  # the name argparse stores its value under, where not the flag's (`-c`: commands)

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
        if self.store:
            return self.store
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
    function: Callable | None = None  # set by `command`; None: the command line's own (`command_line_only`)

    @property
    def on_replay(self) -> bool:
        """A `Replay` method (the trace opened on a target first), or a function of its own arguments
        (declared outside a class)."""
        return self.function is not None and "." in self.function.__qualname__

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


def command_line_only(entry: Command) -> None:
    """Declare a command that has no API function (`replay`: an interactive terminal session; `serve`: a
    process server): the command line runs it itself (`ui/cli.py:_HANDLERS`); its arguments are declared
    here all the same, as every subcommand's are."""
    COMMANDS.append(entry)


def find_command(name: str) -> Command:
    """The entry of the command `name` (a KeyError when the table has none)."""
    for entry in COMMANDS:
        if entry.name == name:
            return entry
    raise KeyError(f"no command {name!r} in the table of commands")


TARGET_OPTIONS = ("target", "rpc", "tracker", "key", "transform")  # a TargetSpec's fields the command line sets
SPELLED_OPTIONS = (*TARGET_OPTIONS, "reference_target", "reference_rpc",
                   "reference_transform")  # what a suggested command line repeats (with --keep)


def command_line(subcommand: str, trace: str, *words: str, options: dict | None = None) -> str:
    """A `tapml-dbg` command line to suggest: `subcommand` on `trace` with `words`, then those of `options`
    (values by dest, as the user gave them: target options and `keep`) that `subcommand` takes; the
    default target, llvm, left out."""
    options = options or {}
    takes = {arg.dest for arg in find_command(subcommand).arguments}
    parts = ["tapml-dbg", subcommand, trace, *words]
    for name in SPELLED_OPTIONS:
        value = options.get(name)
        if value and name in takes and not (name == "target" and value == "llvm"):
            parts += [f"--{name.replace('_', '-')}", str(value)]
    kept = options.get("keep")
    if kept and "keep" in takes and "--keep" not in words:  # the ops the user keeps, kept again
        parts += ["--keep", kept]
    return " ".join(shlex.quote(part) for part in parts)


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
RECORD = Command(
    "record", "run a model on the source and write a trace",
    "Exports the model with torch.export, imports it into TVM Relax and runs it op by op in torch eager, storing "
    "every op's inputs and outputs in one HDF5 file.",
    (Arg(("model",), "FILE.py[:FUNC], FUNC() -> (module, inputs)", metavar="MODEL", param="model"),
     Arg(("-o", "--output"), "the trace file to write (.h5); its folder must exist", metavar="TRACE", required=True,
         param="output"),
     Arg(("--source",), "torch (default) or tvm:TARGET; with tvm:TARGET a file that defines build_tvm() is recorded "
                        "as a TVM-native model (docs/reference-target.md)", default="torch", param="source"),
     Arg(("--entry",), "a TVM-native model's entry function (default: main, else forward, else the only one)",
         metavar="NAME", param="entry"),
     Arg(("--inputs",), "real inputs, one array per model input", metavar="FILE.npz", param="inputs"),
     Arg(("--seed",), "seed for random weights and inputs", type=int, default=0, param="seed"),
     Arg(("--compression",), "HDF5 compression of stored tensors (default none; lzf is cheap, gzip 10-30x slower)",
         choices=("none", "lzf", "gzip"), default="none", param="compression"),
     Arg(("--window",), "store tensors only for these ops (A:B, end exclusive; an op; or a layer such as "
                        "transformer.h.3) plus the values they read; every op keeps its stats", metavar="OPS|LAYER",
         param="window"),
     Arg(("--generate",), "record a transformers causal LM's greedy generation: the prefill and N decode steps with "
                          "a KV cache, as one graph whose ops know their step (docs/generation.md)", metavar="N",
         param="generate"),
     Arg(("--max-bytes",), "budget for stored op tensors (e.g. 200M, 1.5G): tensors of ops from the window's start "
                           "(or op 0) until the budget is spent; every op keeps its stats", metavar="SIZE",
         param="max_bytes")),
    progress="recording")
INFO = Command(
    "info", "summarize a trace",
    "Model, source, versions, sizes, op and layer counts; --json adds the op table (index, name, source op, layer of "
    "every op).",
    (Arg(("trace",), TRACE_HELP, metavar="TRACE", param="trace"),
     Arg(("--json",), "one JSON object with the op table", switch=True),
     Arg(("--verify",), "read every part of the trace and check its checksums; list each damaged part (exit 1 when "
                        "there is one)", switch=True, param="verify")))
REPORT = Command(
    "report", "write an HTML report of every op's error",
    "A self-contained index.html (no network): every op's isolated and propagated error along the model, layers as "
    "bands, the culprit marked, its card and the trace's summary.",
    _arguments(TRACE,
               Arg(("-o", "--output"), "the folder to write index.html into", metavar="DIR", required=True,
                   param="folder"),
               Arg(("--migrate",), "also run `migrate` (one mixed run per top-level block) and chart the model "
                                   "output's error per step", switch=True, param="migrate"),
               Arg(("--model-explorer",), "also write DIR/model_explorer/: the op graph and every op's error as JSON "
                                          "for Google's AI Edge Model Explorer (pip install ai-edge-model-explorer), "
                                          "and print the command that opens it", switch=True, param="model_explorer"),
               TARGET, REFERENCE, KEEP),
    progress="report")
REPLAY = Command(
    "replay", "interactive replay on a target",
    "A debugger over the trace: step op by op, continue to a divergence or breakpoint, compare, print, plot, bisect "
    "and dump without leaving the session (docs/repl.md).",
    _arguments(TRACE, TARGET, REFERENCE,
               Arg(("-c",), "run commands and exit", metavar='"CMD; CMD"', store="commands"),
               Arg(("--script",), "run commands from FILE and exit", metavar="FILE")))
SERVE = Command(
    "serve", "keep TVM and torch imported: later commands start in a fraction of a second",
    "A fork server for this compile cache (TAPML_CACHE_DIR): every later `tapml-dbg` command but `replay` starts as a "
    "fork of a process that imported TVM and torch, and is otherwise the process it would have been (docs/serve.md). "
    "It runs until Ctrl-C, `serve --stop` or --idle minutes without a command; TAPML_SERVER=0 runs a command without "
    "it. Unless TAPML_SERVER is 0 or 1, a command that ran by itself and imported TVM or torch starts one as it "
    "leaves.",
    (Arg(("--idle",), "stop after MIN minutes without a command (default 30; 0: never)", metavar="MIN", type=float,
         default=fork_server.DEFAULT_IDLE_S / 60),
     Arg(("--detach",), "leave it running in the background and return", switch=True),
     Arg(("--stop",), "stop the running server (the commands it runs finish)", switch=True)))
command_line_only(REPLAY)
command_line_only(SERVE)


class Replay:
    """One trace on one target. Use as a context manager (it holds worker processes) or `close()` it."""

    def __init__(self, session: Session, trace: str | None = None, options: dict | None = None):
        """`trace` as the user gave it, and `options` the target options by dest as the command line
        takes them (`SPELLED_OPTIONS`): what `command_line` repeats."""
        self.session = session
        self._trace = trace
        self.options = dict(options or {})
        self._points: list[OpPoint] | None = None  # both verdicts of every op, once asked for
        self._points_kept: frozenset[int] = frozenset()  # the kept set they were computed with

    @classmethod
    def from_spec(cls, trace: str | Path, spec: TargetSpec, *, searching: bool = False,
                  cache_dir: str | Path = DEFAULT_CACHE_DIR, reference: TargetSpec | None = None,
                  progress: Progress = _noop) -> "Replay":
        """What the CLI opens: `searching` starts the worker a bisect's chain runs on too; `reference`: judge
        the target against that trusted TVM target instead of the recorded source (docs/reference-target.md)."""
        session = open_judged(trace, spec, reference=reference, cache_dir=cache_dir, start_workers=True,
                              searching=searching, progress=progress)
        return cls(session, str(trace), _spelled(spec, reference))

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

    @property
    def trace(self) -> str:
        """The trace's path, as it was given."""
        return str(self.session.reader.path) if self._trace is None else self._trace

    # ------------------------------------------------------------------ what the CLI's commands ask
    def keep(self, ops: str | list[int] | None) -> list[int]:
        """Keep ops on the source (`--keep OPS`: selectors such as `"14,37"`, `"cumsum"`, a layer, or
        `"none"`; or indices), so that every method below goes on past them (docs/keep.md); the
        kept ops, with the other bindings of their source ops."""
        if ops is None or isinstance(ops, str):
            kept = self.session.keep(ops or "none")
            self.options["keep"] = ops
        else:
            kept = self.session.set_kept(ops)
            self.options["keep"] = kept_selector(ops) if ops else None
        return kept

    def command_line(self, subcommand: str, *words: str) -> str:
        """The `tapml-dbg` command line of `subcommand` on this trace and target, with `words`:
        `replay.command_line("dump", "--op", "9", "-o", "repro/")`."""
        return command_line(subcommand, self.trace, *words, options=self.options)

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

    @command(REPORT)
    def report(self, folder: str | Path, migrate: bool = False, model_explorer: bool = False,
               bisect: BisectResult | None = None, progress: Progress = _noop) -> ReportFolder:
        """Every op's isolated and propagated error as a self-contained page, `folder/index.html`
        (`tapml-dbg report`): the culprit (`bisect`'s, when given that result), the causes, the command
        lines to type (`command_line`); `migrate`: the output's error per migration step too;
        `model_explorer`: `folder/model_explorer/` for Google's Model Explorer."""
        return write_report_folder(self.session, folder, self.command_line,
                                   ReportOptions(bisect, migrate, model_explorer), progress)

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


def _spelled(spec: TargetSpec, reference: TargetSpec | None) -> dict:
    """The target options of `spec` (and `reference`) by dest, as the command line takes them."""
    options = {name: getattr(spec, name) for name in TARGET_OPTIONS}
    if reference is not None:
        options.update(reference_target=reference.target, reference_rpc=reference.rpc,
                       reference_transform=reference.transform)
    return options


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


@command(RECORD)
def record(model: str, output: str | Path, *, source: str = "torch", entry: str | None = None,
           inputs: str | None = None, seed: int = 0, compression: str = "none", window: str | None = None,
           generate: int | str | None = None, max_bytes: int | str | None = None,
           progress: Progress = _noop) -> RecordResult:
    """Record `model` (`FILE.py[:FUNC]`, FUNC() -> (module, inputs)) into the trace `output` (`tapml-dbg
    record`): on PyTorch eager, or with `source="tvm:T"` a file that defines `build_tvm()` on that TVM
    target (`entry`: its entry function); `generate=N`: a causal LM's prefill and N greedy decode steps.
    `window` (A:B, an op, a layer) and/or `max_bytes` ("200M"): tensors stored only there, every op's
    stats everywhere. A bad model, option or path raises a `TapmlError`."""
    source_target = tvm_source_target(source)
    native = source_target is not None and (entry is not None or defines_native(model))
    if entry is not None and not native:
        raise UsageError("--entry names the entry function of a TVM-native model: give --source tvm:TARGET and "
                         "a file that defines build_tvm()")
    common = {"seed": seed, "compression": None if compression == "none" else compression, "progress": progress,
              "window": window, "max_bytes": max_bytes}
    if not native:
        return record_torch(model, output, source=source, inputs_npz=inputs, **common,
                            generate=None if generate is None else parse_steps(generate))
    if inputs:  # a TVM-native model: build_tvm() -> (IRModule, args), recorded on the source target
        raise UsageError("--inputs is for PyTorch models; a TVM-native model's build_tvm() returns its own arguments")
    if generate is not None:  # a native LLM: prefill + N decode steps on TVM's paged KV cache
        return record_native_generation(model, output, source_target, parse_steps(generate), **common)
    return record_native(model, output, source_target, entry=entry, **common)


@command(INFO)
def info(trace: str | Path, *, verify: bool = False) -> TraceInfo | VerifyReport:
    """What a trace holds (`tapml-dbg info`): model, source, versions, sizes, op and layer counts and the
    op table, read without its tensors; `verify=True`: every part read and its checksums checked, the
    damaged parts listed (`info --verify`; `.ok`). A missing or unreadable trace raises a `TapmlError`."""
    return verify_trace(str(trace)) if verify else TraceInfo(trace_info(str(trace)))
