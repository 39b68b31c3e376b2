"""The one renderer of the CLI and the REPL: `render(result, console)` draws any result object.

Everything the user typed or the trace holds (op names, layers, paths, messages, notes, targets)
is escaped, so a name with `[brackets]` never reads as markup. On a pipe the console has a fixed
width and no colors (see `console.make_console`), so transcripts are stable.
"""

from __future__ import annotations

import itertools
import math
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from functools import singledispatch
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table

from tapml_dbg.engine.diff import DIFFERENT, DiffResult, DiffStatus
from tapml_dbg.engine.kept import blocks_target
from tapml_dbg.engine.migrate import MigrateResult
from tapml_dbg.engine.mixed import MixedRun, spans_text
from tapml_dbg.engine.results import BisectResult, CompileReport, StepResult
from tapml_dbg.engine.stops import Command, RunResult, judge_divergence
from tapml_dbg.engine.fix import FAILURE_CHARS, FixResult
from tapml_dbg.engine.generation import TokenReport
from tapml_dbg.engine.triage import TriageResult
from tapml_dbg.judge.compare import metrics_text
from tapml_dbg.judge.verdict import ISOLATED, Status, Verdict
from tapml_dbg.frontend.causal_lm import CausalLMInfo
from tapml_dbg.model.generation import GenerationInfo, step_kind
from tapml_dbg.model.host_only import host_only_text
from tapml_dbg.record.recorder import RecordResult
from tapml_dbg.record.native import NativeRecordResult
from tapml_dbg.repro.carve import CarveResult
from tapml_dbg.repro.dump import DumpResult
from tapml_dbg.repro.files import human_bytes
from tapml_dbg.trace.schema import tvm_source_target
from tapml_dbg.trace.inspect import TraceInfo
from tapml_dbg.trace.verify import VerifyReport
from tapml_dbg.ui.repl import results as R
from tapml_dbg.report.folder import ReportFolder
from tapml_dbg.report.html import ReportWritten
from tapml_dbg.report.model_explorer import ModelExplorerWritten

PRINT_PRECISION = 5  # digits `print` shows per element
PRINT_THRESHOLD = 64  # arrays with more elements are summarized (numpy's threshold)
PRINT_EDGEITEMS = 3  # items kept at each edge of a summarized axis
PRINT_LINE_WIDTH = 46  # characters per line of one printed array (two fit side by side)
MESSAGE_CHARS = 70  # a crash or compile-error message is cut to this in one-line verdicts (on a terminal)
_WHOLE = ContextVar("whole_messages", default=False)  # off a terminal (a pipe, a file) nothing is cut
HELP_USAGE_WIDTH = 40  # the usage column of `help`; longer usages wrap
SKIPPED_SHOWN = 20  # `carve` lists this many left-out ops, then counts the rest
INHERITED_SHOWN = 12  # `triage` names this many inherited failures of a cause, then counts the rest
UNKNOWN = "?"  # a figure the result does not hold
AS_ABOVE = "(as above)"  # a verdict cell whose message the lines above already show
AS_BELOW = "(below)"  # ... or the lines below it (a migration's culprit)
AS_ISOLATED = "(as isolated)"  # `compare`: the propagated run failed with the isolated run's very message
TOP_LAYER = "<top>"  # how an op outside every layer is named
FAILED_RUN_STYLE = "bold magenta"  # the unit did not run to a value: compile-error, crash, timeout, error
STATUS_STYLES = {Status.PASS: "green", Status.FAIL: "bold red", Status.MISSING: "yellow", Status.UNDEFINED: "dim"}
UNBOUNDED_WIDTH = 10_000  # measure tables as if the console had no edge
PROSE = "fold"  # the overflow that marks a table column as prose: it may wrap; no other column is cut
PROSE_MIN_WIDTH = 28  # a prose column narrower than this is not worth the wrapping
PLOT_LOWEST_DECADE = -10  # `plot`: errors below 1e-10 share the bottom row
PLOT_HIGHEST_DECADE = 1  # ... and errors above 10 (and NaN) the top one
PLOT_LABEL_WIDTH = 7  # the y axis labels (`1e-02 ┤`)
PLOT_TICK_EVERY = 10  # columns between two op-index ticks on the x axis
PLOT_MAX_CELL = 3  # characters per op when the terminal has room
PLOT_GLYPHS = {"isolated": "•", "isolated-fail": "✖", "propagated": "○", "propagated-fail": "⊗", "both": "◉",
               "tolerance": "┄", "culprit": "▼"}
PLOT_STYLES = {"isolated": "blue", "propagated": "dark_orange", "fail": "bold red", "tolerance": "dim"}


@dataclass
class NextCommands:
    """What to run next, ending a result: `(command, why)` pairs; the REPL's are REPL commands."""

    commands: list[tuple[str, str]]
    repl: bool = False  # REPL commands are shown `quoted`, CLI ones as shell lines


def _natural_width(console: Console, renderable) -> int:
    return Measurement.get(console, console.options.update_width(UNBOUNDED_WIDTH), renderable).maximum


def print_table(console: Console, table: Table) -> None:
    """A table whose names and numbers are never cut: they are copied into the next command.

    Only columns marked as prose (`overflow=PROSE`: messages, summaries) may wrap, at spaces, down
    to PROSE_MIN_WIDTH; every other column keeps its full width. A table that still does not fit
    is printed wider than the console: a terminal wraps the long lines, a pipe keeps them.
    """
    for column in table.columns:
        column.no_wrap = column.overflow != PROSE
    natural = _natural_width(console, table)
    if natural <= console.width:
        console.print(table)
        return
    spare = sum(max(0, max([_natural_width(console, cell) for cell in column.cells] + [0]) - PROSE_MIN_WIDTH)
                for column in table.columns if column.overflow == PROSE)
    width = max(console.width, natural - spare)
    if width == console.width:
        console.print(table)  # the prose columns wrap; the rest stays whole
        return
    lines = console.render_lines(table, console.options.update_width(width), new_lines=True)
    console.print(Segments(itertools.chain.from_iterable(lines)), crop=False, soft_wrap=True, end="")


@dataclass
class TraceSummary:
    """What `tapml-dbg info` shows: `trace_info`'s dict without the op table (`info --json` prints the dict)."""

    path: str
    format: str
    model: str | None
    source: str | None
    versions: dict
    created: str | None
    complete: bool
    num_ops: int
    recorded_ops: int
    num_layers: int
    num_inputs: int
    num_params: int
    file_bytes: int | None
    activation_bytes: int
    eager_output_max_abs_diff: float | None = None
    capture: dict | None = None  # None: every op's tensors are stored
    stats_only_ops: int = 0
    import_fixes: list[str] = field(default_factory=list)
    type_changes: dict | None = None  # {"dtype": n, "shape": n, "ops": [...]}: ops whose import changed the type
    stock_import: dict | None = None  # what TVM's stock import does where an import fix hides it (trace/inspect.py)
    causal_lm: dict | None = None  # trace meta "causal_lm": an unwrapped transformers causal LM, driven as generate()
    generation: dict | None = None  # trace meta "generation": prefill + decode steps (record --generate)
    steps: list | None = None  # its steps (info --json "steps")
    weights: dict | None = None  # v1.4: params read from checkpoint files, and the files (trace/inspect.py)
    host_only: list = field(default_factory=list)  # ops TVM cannot import, run on the host (docs/host-only-ops.md)

    @classmethod
    def from_info(cls, info: dict) -> TraceSummary:
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in info.items() if key in names})


def weights_rows(weights: dict) -> list[tuple[str, str]]:
    """`info`'s rows for params read from checkpoint files: how many, and each file a replay needs."""
    files = weights["files"]
    rows = [("weights", f"{weights['params']} params ({size_text(weights['bytes'])}) read from {len(files)} checkpoint "
                        f"file{'s' if len(files) != 1 else ''}, not stored in the trace")]
    for item in files:
        if item["found"] is None:
            state = "MISSING: put it there, or set TAPML_WEIGHTS to the folder that holds it"
        elif not item["same_size"]:
            state = f"CHANGED (not {item['bytes']} bytes): restore it or record the model again"
        else:
            state = "present" if item["found"] == item["path"] else f"found at {item['found']}"
        rows.append(("  needs", f"{item['path']} ({size_text(item['bytes'])}, {item['params']} params): {state}"))
    return rows


def type_changes_text(changes: dict) -> str:
    """"3 ops whose import changed the dtype, 1 the shape: #4 mul, ..."."""
    parts = [f"{changes.get(what, 0)} op{'s' if changes.get(what, 0) != 1 else ''} whose import changed the {what}"
             for what in ("dtype", "shape") if changes.get(what)]
    ops = ", ".join(changes.get("ops", [])[:SKIPPED_SHOWN])
    return "; ".join(parts) + (f": {ops}" if ops else "")


def stock_import_text(stock: dict) -> str:
    """"fails at #2 addmm: TypeError: ...; declares other types at #1 addmm_p0 (type verdicts)"."""
    parts = []
    if stock.get("error"):
        where = f" at {stock['error_op']}" if stock.get("error_op") else ""
        parts.append(f"fails{where}: {stock.get('reason') or stock['error']}")
    if stock.get("changed"):
        parts.append(f"declares other types at {', '.join(stock['changed'][:SKIPPED_SHOWN])} (type verdicts)")
    if stock.get("widened"):
        parts.append(f"widens floats at {', '.join(stock['widened'][:SKIPPED_SHOWN])} (no verdict)")
    fixes = ", ".join(stock.get("fixes") or [])
    return ("; ".join(parts) or "as the recorded import") + (f" (without tapml-dbg's {fixes})" if fixes else "")


def _noise_text(metrics) -> str:
    """`target 4100x the source's own error (1.2e-03 vs 2.9e-07; bound 4.6e-06)`."""
    if metrics is None or metrics.ratio is None:
        return "-"
    ratio = "exact source" if math.isinf(metrics.ratio) else f"target {metrics.ratio:.3g}x the source's own error"
    return f"{ratio} ({metrics.target_err:.3g} vs {metrics.source_err:.3g}; bound {metrics.noise_bound:.3g})"


def verdict_style(status: str) -> str:
    return STATUS_STYLES.get(status, FAILED_RUN_STYLE)


def layer_text(layer: str) -> str:
    return layer or TOP_LAYER


def op_label(op) -> str:
    return f"#{op.index} [bold]{escape(op.name)}[/]"


def print_source_location(location, console: Console, indent: str = "  ") -> None:
    """`  at examples/model.py:21  weights = torch.softmax(...)` under an op's first line; a library's line
    (`at transformers/models/llama/modeling_llama.py:258  ...`) is followed by the user's frame that called
    it (`  called from examples/model.py:16  ...`); nothing when unknown."""
    for word, where in (("at", location), ("  called from", location.user if location is not None else None)):
        if where is not None:
            console.print(f"{indent}{word} [cyan]{escape(str(where))}[/]  {escape(where.code)}", soft_wrap=True,
                          highlight=False)


def verdict_cell(verdict: Verdict | None, said: str = "") -> str:
    """`pass rel=1.2e-07`, `FAIL rel=1.0e-02 nan!=128`, `crash <message>`; `crash (as above)` when the
    message is `said` already (a compile error's TVM text is printed once, not on every line)."""
    if verdict is None:
        return "-"
    style = verdict_style(verdict.status)
    status = "FAIL" if verdict.status == Status.FAIL else verdict.status
    if verdict.status in (Status.PASS, Status.FAIL):
        worst = verdict.worst
        return f"[{style}]{status}[/] {escape(metrics_text(worst, compact=True)) if worst else ''}"
    if said and verdict.message and _first_text(verdict.message) in said:
        return f"[{style}]{status}[/] {AS_ABOVE}"
    return f"[{style}]{status}[/] {escape(_cut(verdict.message))}"


def _propagated_message(isolated: str, propagated: str) -> str:
    """`compare`'s propagated message: `(as isolated)` when the isolated run said it already, after the
    op upstream whose run failed with it (`op NAME: (as isolated)`: a pass that fails every unit)."""
    if not propagated or not isolated or not propagated.endswith(isolated):
        return escape(propagated)
    upstream = propagated[:-len(isolated)]
    if upstream and not (upstream.startswith("op ") and upstream.endswith(": ")):
        return escape(propagated)
    return escape(upstream) + AS_ISOLATED


def _first_text(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


def short_cell(verdict: Verdict | None) -> str:
    if verdict is None:
        return "-"
    status = "FAIL" if verdict.status == Status.FAIL else verdict.status
    return f"[{verdict_style(verdict.status)}]{status}[/]"


def step_line(result: StepResult, inherited: bool = False) -> str:
    """One verdict line per op: index, name, layer, isolated and propagated verdicts (none: a kept op)."""
    verdicts = (f"isolated {verdict_cell(result.isolated)}  propagated {verdict_cell(result.propagated)}"
                if result.isolated is not None or result.propagated is not None else
                "[dim]kept on the source: no verdict[/]")
    line = (f"  #{result.index:<4} {escape(result.name):<22} {escape(layer_text(result.layer)):<16} "
            f"{step_cell(result.step)}{verdicts}")
    if inherited:
        line += "  [dim](inherited)[/]"
    return line


def step_cell(step: int | None) -> str:
    """`step 2   ` in a one-line-per-op listing of a generation trace's ops; "" for a forward's."""
    return f"step {step:<3} " if step is not None else ""


def complete_text(complete: bool, recorded_ops: int, num_ops: int) -> str:
    return "yes" if complete else f"NO: {recorded_ops} of {num_ops} ops recorded"


def capture_text(capture: dict) -> str:
    """A capture budget as given (`--window`, `--max-bytes`) and what it stored."""
    given = (f"--window {capture['window']}" if capture.get("window") is not None else "",
             f"--max-bytes {capture['max_bytes']}" if capture.get("max_bytes") is not None else "")
    layer = f", layer {capture['layer']}" if capture.get("layer") else ""
    cut = ", cut short by the byte budget" if capture.get("truncated") else ""
    return (f"{' '.join(part for part in given if part)}: window ops {capture['first']}..{capture['end'] - 1}"
            f"{layer}{cut}, {size_text(capture.get('stored_bytes'))} of op tensors")


def size_text(count: int | None) -> str:
    """`human_bytes`, or `?` where the result does not know the size."""
    return UNKNOWN if count is None else human_bytes(count)


def seconds_text(seconds: float) -> str:
    """A duration with three significant digits at any scale: `2.13 s`, `41.2 ms`, `96.3 us`."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} us"


def eager_diff_text(diff: float | None) -> str:
    if diff is None:
        return "not measured"
    return "bit-exact" if diff == 0 else f"max abs diff {diff:.3g} (a decomposed fused kernel)"


def _print_notes(notes: list[str], console: Console) -> None:
    for note in notes:
        print_note(note, console)


def print_note(note: str, console: Console) -> None:
    console.print(f"  note: {escape(note)}")


@singledispatch
def _render(result, console: Console) -> None:
    if result is None:
        return
    console.print(escape(str(result)))


def render(result, console: Console) -> None:
    """Print `result` (the renderer registered for its type); messages are cut to one line on a
    terminal only: piped or written to a file, every line is whole (grep, logs, transcripts)."""
    token = _WHOLE.set(not console.is_terminal)
    try:
        _render(result, console)
    finally:
        _WHOLE.reset(token)


render.register = _render.register


@render.register
def _(result: R.Message, console: Console) -> None:
    if result.text:
        console.print(escape(result.text), style=result.style or None)


@render.register
def _(result: R.Quit, console: Console) -> None:
    return None


@render.register
def _(result: R.HelpResult, console: Console) -> None:
    command = result.command
    if command is not None:
        console.print(f"usage: [bold]{escape(command.usage)}[/]")
        if command.aliases:
            console.print(f"aliases: {', '.join(command.aliases)}")
        for line in command.help.strip().splitlines():
            console.print(f"  {escape(line)}")
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column("usage", style="bold", max_width=HELP_USAGE_WIDTH, overflow=PROSE)
    table.add_column("summary", overflow=PROSE)
    for item in result.commands:
        names = item.usage + (f"  ({', '.join(item.aliases)})" if item.aliases else "")
        table.add_row(escape(names), escape(item.summary))
    print_table(console, table)
    console.print("OP is an op index (`12`, `#12`, `-1`) or name; `help CMD` tells more; Ctrl-C cancels a "
                  "long command; Ctrl-D or `quit` leaves.")


@render.register
def _(result: R.InfoResult, console: Console) -> None:
    info = result.trace
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow=PROSE)
    complete = complete_text(info["complete"], info["recorded_ops"], info["num_ops"])
    rows = [
        ("trace", info["path"]), ("model", info.get("model")), ("source", info.get("source")),
        ("format", info.get("format")), ("complete", complete),
        ("ops / layers", f"{info['num_ops']} / {info['num_layers']}"),
        ("inputs / params", f"{info['num_inputs']} / {info['num_params']}"),
        ("file size", size_text(info.get("file_bytes"))),
        ("target", f"{result.target} ({result.remote})"), ("transform", result.transform),
        ("position", f"{result.position} of {result.ops}"), ("offload", result.offload),
        ("mode", result.mode), ("breakpoints", str(result.breakpoints)), ("tolerance", result.tolerance),
    ]
    if (info.get("type_changes") or {}).get("ops"):
        rows.append(("type changes", type_changes_text(info["type_changes"])))
    for key, value in rows:
        table.add_row(key, escape(str(value)))
    print_table(console, table)


def _seen_cell(seen: StepResult | None) -> str:
    if seen is None:
        return ""
    return f"{short_cell(seen.isolated)}/{short_cell(seen.propagated)}"


@render.register
def _(result: R.OpsResult, console: Console) -> None:
    if not result.rows:
        console.print(f"no op matches {escape(result.query)!r}" if result.query else "the trace has no ops")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    stepped = any(row.op.step is not None for row in result.rows)  # a generation trace: which step
    for column in ("", "#", "name", "source op", "layer", *(("step",) if stepped else ()), "output", "T",
                   "iso/prop"):
        table.add_column(column, no_wrap=column in ("#", "T", "", "step"))
    for row in result.rows:
        op = row.op
        shape = ", ".join(f"{tuple(o.shape)} {o.dtype}" for o in op.outputs[:1])
        if len(op.outputs) > 1:
            shape += f" +{len(op.outputs) - 1}"
        step = ("" if op.step is None else str(op.step),) if stepped else ()
        table.add_row("→" if row.current else "", str(op.index), escape(op.name), escape(op.op),
                      escape(layer_text(op.layer)), *step, escape(shape), "T" if row.offloaded else "",
                      _seen_cell(row.seen))
    print_table(console, table)
    if result.matched > len(result.rows):
        console.print(f"... {result.matched - len(result.rows)} more; narrow with `ops PATTERN` or `ops a:b`")


@render.register
def _(result: R.LayersResult, console: Console) -> None:
    if not result.rows:
        console.print("the trace has no layers (every op is at the top level)")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("layer")
    table.add_column("ops", justify="right")
    table.add_column("count", justify="right")
    for row in result.rows:
        table.add_row("  " * row.depth + escape(row.path), f"{row.first}..{row.last}", str(row.count))
    print_table(console, table)


@render.register
def _(result: R.WhereResult, console: Console) -> None:
    if result.op is None:
        console.print(f"at the end of the trace: all {result.ops} ops have run (`reset` starts again)")
    else:
        op = result.op
        console.print(f"next op  {op_label(op)} ({escape(op.op)}) in layer [cyan]{escape(layer_text(op.layer))}[/]"
                      f"  [{result.position}/{result.ops}]")
    if result.place is not None:
        console.print(f"step     {place_text(result.place)}")
    if result.last is not None:
        last = result.last
        console.print(f"last op  #{last.index} [bold]{escape(last.name)}[/]  isolated {verdict_cell(last.isolated)}"
                      f"  propagated {verdict_cell(last.propagated)}")
        if last.breakpoint:
            console.print(f"         stopped by {escape(last.breakpoint)}")
    console.print(f"target   {escape(result.target)}   mode {result.mode}   breakpoints {result.breakpoints}")
    console.print(f"offload  {escape(result.offload)} on the target; the rest on the source (`run`: the model mixed)")


@render.register
def _(result: R.ShowResult, console: Console) -> None:
    op = result.op
    console.print(f"{op_label(op)}  source op [bold]{escape(op.op)}[/]  relax op {escape(op.relax_op)}")
    print_source_location(op.source_location, console)
    console.print(f"  layer {escape(layer_text(op.layer))}{step_text(op.step)}   fx node {escape(op.fx_node or '-')}   "
                  f"{'offloaded' if result.offloaded else 'not offloaded'}")
    if result.note:
        console.print(f"  note: {escape(result.note)}")
    if result.inputs:
        table = Table(title="inputs", box=None, pad_edge=False, header_style="bold", title_justify="left")
        for column in ("name", "from", "shape / stats"):
            table.add_column(column, overflow=PROSE if column == "shape / stats" else "ellipsis")
        for row in result.inputs:
            table.add_row(escape(row.name), escape(row.kind), escape(row.spec))
        print_table(console, table)
    table = Table(title="outputs (recorded)", box=None, pad_edge=False, header_style="bold", title_justify="left")
    for column in ("#", "shape", "dtype", "min", "max", "mean", "absmax", "nan", "inf"):
        table.add_column(column, justify="right" if column not in ("shape", "dtype") else "left")
    for number, spec in enumerate(op.outputs):
        stats = result.stats[number] if number < len(result.stats) else {}
        table.add_row(str(number), str(tuple(spec.shape)), spec.dtype, *(_num(stats.get(k)) for k in
                                                                          ("min", "max", "mean", "absmax")),
                      str(stats.get("nan", "")), str(stats.get("inf", "")))
    print_table(console, table)
    if result.seen is not None:
        console.print(f"  seen: isolated {verdict_cell(result.seen.isolated)}  propagated "
                      f"{verdict_cell(result.seen.propagated)}")
        for verdict in (result.seen.isolated, result.seen.propagated):
            if verdict is not None and verdict.wrong:
                console.print(f"  class ({verdict.mode}): [bold]{escape(verdict.wrong)}[/]: {escape(verdict.evidence)}")
        if result.seen.diagnosis:
            console.print(f"  → {escape(result.seen.diagnosis)}")
    console.print("[bold]Relax IR[/] (the op alone, as compiled for the target):")
    _code(console, result.ir.strip())


def _code(console: Console, text: str) -> None:
    if console.is_terminal and console.color_system:
        from rich.syntax import Syntax

        console.print(Syntax(text, "python", theme="ansi_dark", background_color="default", word_wrap=True))
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)


def _num(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@render.register
def _(result: R.OffloadResult, console: Console) -> None:
    console.print(escape(result.message))
    console.print(f"offload  {escape(result.offload)}")


@render.register
def _(result: R.KeepResult, console: Console) -> None:
    if result.message:
        console.print(escape(result.message))
    console.print(f"kept     {escape(result.kept) if result.kept else 'none'} on the source")


@render.register
def _(result: RunResult, console: Console) -> None:
    steps = result.steps
    if not steps and result.at_end and not result.cancelled:
        console.print("nothing to run: at the end of the trace (`reset` starts again)")
        return
    if result.command != Command.CONTINUE:  # one line per op; `continue` prints a summary
        for step in steps:
            console.print(step_line(step, step.index in result.inherited), soft_wrap=True)
    elif steps:
        failed = [s for s in steps if judge_divergence(s, result.mode, False).failing]
        kept = sum(1 for s in steps if s.isolated is None and s.propagated is None)  # kept on the source
        rule = "isolated verdict" if result.mode == ISOLATED else "isolated or propagated verdict"
        console.print(f"ran #{steps[0].index}..#{steps[-1].index} ({len(steps)} ops): "
                      f"{len(steps) - len(failed) - kept} passed, {len(failed)} failed ({rule})"
                      + (f", {kept} kept on the source" if kept else ""))
        for step in steps:
            if step in failed or step is steps[-1]:
                console.print(step_line(step, step.index in result.inherited), soft_wrap=True)
    if result.cancelled:
        console.print(f"[yellow]cancelled[/] after {len(steps)} op(s)")
    if result.reasons:
        last = steps[-1]
        console.print(f"[bold]stopped[/] after #{last.index} [bold]{escape(last.name)}[/]: "
                      f"{escape('; '.join(result.reasons))}")
        isolated_failed = last.isolated is not None and last.isolated.failed
        propagated_failed = last.propagated is not None and last.propagated.failed
        if isolated_failed or propagated_failed:  # the one wording of what the verdicts say (judge/diagnosis.py)
            washes = "; with the target's own upstream values it stays within the looser propagated tolerance" \
                if isolated_failed and last.propagated is not None and last.propagated.passed else ""
            console.print(f"  {escape(last.diagnosis)}{washes}")
            render(NextCommands([(f"compare {last.index}", "both verdicts side by side"),
                                 (f"dump {last.index} DIR", "a standalone repro"), ("plot", "every op's error")],
                                repl=True), console)
    elif result.at_end and steps:
        console.print("end of the trace: all ops have run")
        if result.command == Command.CONTINUE:
            render(NextCommands([("plot", "how close every op came to its tolerance"),
                                 ("bisect", "the search with an isolated sweep")], repl=True), console)


@render.register
def _(result: R.CompareResult, console: Console) -> None:
    op, step = result.op, result.step
    console.print(f"{op_label(op)} ({escape(op.op)}) in layer [cyan]{escape(layer_text(op.layer))}[/]"
                  f"{step_text(op.step)}")
    print_source_location(op.source_location, console)
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("")
    table.add_column("isolated (recorded inputs)", overflow=PROSE)
    table.add_column("propagated (target inputs)", overflow=PROSE)
    iso, prop = step.isolated, step.propagated
    table.add_row("verdict", short_cell(iso), short_cell(prop))
    wi, wp = (iso.worst if iso else None), (prop.worst if prop else None)
    if wi is not None or wp is not None:
        rows = [
            ("max abs err", lambda m: f"{m.max_abs_err:.4g}"),
            ("max rel err", lambda m: f"{m.max_rel_err:.4g}"),
            ("err / absmax", lambda m: f"{m.scale_rel_err:.4g}  (rtol {m.rtol:g})"),
            ("cosine", lambda m: f"{m.cosine:.8f}"),
            ("nan / inf mismatch", lambda m: f"{m.nan_mismatch} / {m.inf_mismatch}"),
            ("mismatched", lambda m: f"{m.mismatched} of {m.numel}"),
            ("tolerance", lambda m: f"rtol={m.rtol:g} atol={m.atol:g}"),
        ]
        for label, fmt in rows:
            table.add_row(label, fmt(wi) if wi else "-", fmt(wp) if wp else "-")
        shape = (wi or wp).shape_mismatch or (wi or wp).dtype_mismatch
        if shape:
            table.add_row("mismatch", escape((wi.shape_mismatch or wi.dtype_mismatch) if wi else "-"),
                          escape((wp.shape_mismatch or wp.dtype_mismatch) if wp else "-"))
    if wi is not None and wi.ratio is not None or wp is not None and wp.ratio is not None:
        table.add_row("vs float64", *(escape(_noise_text(m)) for m in (wi, wp)))
    if (iso is not None and iso.wrong) or (prop is not None and prop.wrong):
        table.add_row("class", *(escape(f"{v.wrong}: {v.evidence}") if v is not None and v.wrong else "-"
                                 for v in (iso, prop)))
    messages = (iso.message if iso else "", prop.message if prop else "")
    if any(messages):  # one compile error fails both runs: its text once
        table.add_row("message", escape(messages[0]), _propagated_message(*messages))
    print_table(console, table)
    if len(op.outputs) > 1:
        console.print(f"  ({len(op.outputs)} outputs: the worst one is shown)")
    if step.diagnosis:  # the one wording of what the verdicts say (judge/diagnosis.py)
        console.print(f"  → {escape(step.diagnosis)}")


def _stats(array: np.ndarray | None) -> dict:
    if array is None:
        return {}
    values = np.asarray(array)
    if values.size == 0:
        return {"numel": 0}
    as_float = values.astype(np.float64)
    finite = as_float[np.isfinite(as_float)]
    return {"min": float(finite.min()) if finite.size else math.nan,
            "max": float(finite.max()) if finite.size else math.nan,
            "mean": float(finite.mean()) if finite.size else math.nan,
            "absmax": float(np.abs(finite).max()) if finite.size else math.nan,
            "nan": int(np.isnan(as_float).sum()), "inf": int(np.isinf(as_float).sum()), "numel": int(values.size)}


def _array_text(array: np.ndarray | None) -> str:
    if array is None:
        return "-"
    return np.array2string(np.asarray(array), precision=PRINT_PRECISION, threshold=PRINT_THRESHOLD,
                           edgeitems=PRINT_EDGEITEMS, max_line_width=PRINT_LINE_WIDTH, suppress_small=False)


@render.register
def _(result: R.PrintResult, console: Console) -> None:
    op = result.op
    if not result.outputs:
        console.print(f"{op_label(op)} has no tensor outputs")
    for out in result.outputs:
        where = f"[{result.index_text}]" if result.index_text else ""
        suffix = f" output {out.number}" if len(result.outputs) > 1 else ""
        shape = tuple(np.shape(out.source))
        offloaded = "" if result.offloaded else ", op not offloaded"
        console.print(f"{op_label(op)}{suffix}{escape(where)}  {shape} {np.asarray(out.source).dtype}  "
                      f"(target value: {result.mode}{offloaded})")
        diff = None
        if out.target is not None and np.shape(out.target) == np.shape(out.source):
            with np.errstate(all="ignore"):
                diff = np.abs(np.asarray(out.target, dtype=np.float64) - np.asarray(out.source, dtype=np.float64))
        s_stats, t_stats, d_stats = _stats(out.source), _stats(out.target), _stats(diff)
        table = Table(box=None, pad_edge=False, header_style="bold")
        table.add_column("")
        table.add_column("source", justify="right")
        table.add_column("target", justify="right")
        table.add_column("|target - source|", justify="right")
        for key in ("min", "max", "mean", "absmax", "nan", "inf"):
            table.add_row(key, _num(s_stats.get(key)), _num(t_stats.get(key)),
                          _num(d_stats.get(key)) if key not in ("nan", "inf") else "")
        print_table(console, table)
        values = Table(box=None, pad_edge=False, header_style="bold")
        values.add_column("source", no_wrap=True)
        values.add_column("target", no_wrap=True)
        values.add_row(escape(_array_text(out.source)), escape(_array_text(out.target)))
        print_table(console, values)
        if out.target is None and out.note:
            console.print(f"  no target value: {escape(out.note)}")


def _plot_cell(points, mode: str) -> tuple[float | None, bool]:
    """The worst error of a column's ops in `mode`, and whether any of them fails."""
    errors = [p.error(mode) for p in points]
    errors = [math.inf if not math.isfinite(e) else e for e in errors if e is not None]
    runs = any(p.failed_run(mode) for p in points)
    failed = runs or any(p.verdict(mode) is not None and p.verdict(mode).failed for p in points)
    return (math.inf if runs else max(errors, default=None)), failed


def _decade(value: float) -> int:
    if not math.isfinite(value):
        return PLOT_HIGHEST_DECADE
    return min(PLOT_HIGHEST_DECADE, max(PLOT_LOWEST_DECADE, math.floor(math.log10(value))))


@render.register
def _(result: R.PlotResult, console: Console) -> None:
    points = result.points
    if not points:
        console.print("nothing to plot")
        return
    room = max(PLOT_TICK_EVERY, console.width - PLOT_LABEL_WIDTH - 2)
    per_column = math.ceil(len(points) / room)
    chars = max(1, min(PLOT_MAX_CELL, room // len(points)))  # characters per column
    columns = [points[start:start + per_column] for start in range(0, len(points), per_column)]
    rows = _plot_rows(columns)
    first, last = points[0].index, points[-1].index
    console.print(f"per-op error on {escape(result.target)}, ops {first}..{last}: max |target - source| / "
                  f"absmax(source), log scale" + (f"; one column = {per_column} ops" if per_column > 1 else ""))
    culprit = result.culprit
    console.print(_plot_marker(culprit, columns, chars), soft_wrap=True)
    _draw_plot(console, rows, columns, chars)
    if culprit is None:
        console.print("no divergence in these ops (the rule `continue` stops by)")
        render(NextCommands([("tol", "the tolerances the verdicts use")], repl=True), console)
        return
    where = "" if first <= culprit.index <= last else ", before these ops"
    console.print(f"{PLOT_GLYPHS['culprit']} first divergence: #{culprit.index} [bold]{escape(culprit.name)}[/] "
                  f"({escape(culprit.verdict)}){where}, where `continue` from op 0 stops and bisect points")
    render(NextCommands([(f"compare {culprit.index}", "both verdicts side by side"),
                         (f"dump {culprit.index} DIR", "a standalone repro")], repl=True), console)


def _plot_rows(columns: list) -> dict:
    """The plot's grid: one row per decade, top first (and "exact" last when an error is 0), each a
    (glyph, style) per column: the isolated tolerance, the propagated and the isolated error."""
    cells = [{mode: _plot_cell(column, mode) for mode in ("isolated", "propagated")} for column in columns]
    tolerances = [min((t for p in column if (t := p.tolerance("isolated"))), default=None) for column in columns]
    values = [e for cell in cells for e, _ in cell.values() if e] + [t for t in tolerances if t]
    top = max((_decade(v) for v in values), default=0)
    bottom = min((_decade(v) for v in values), default=top - 1)
    exact = any(e == 0 for cell in cells for e, _ in cell.values())
    rows = {decade: [(" ", "")] * len(columns) for decade in range(top, bottom - 1, -1)}
    if exact:
        rows["exact"] = [(" ", "")] * len(columns)

    def row_of(value: float):
        return "exact" if value == 0 else _decade(value)

    for number, (cell, tolerance) in enumerate(zip(cells, tolerances)):
        if tolerance:
            rows[row_of(tolerance)][number] = (PLOT_GLYPHS["tolerance"], PLOT_STYLES["tolerance"])
        (iso, iso_failed), (prop, prop_failed) = cell["isolated"], cell["propagated"]
        if prop is not None:
            rows[row_of(prop)][number] = (PLOT_GLYPHS["propagated-fail" if prop_failed else "propagated"],
                                          PLOT_STYLES["fail" if prop_failed else "propagated"])
        if iso is not None:
            same = prop is not None and row_of(prop) == row_of(iso)
            if iso_failed:
                glyph = (PLOT_GLYPHS["isolated-fail"], PLOT_STYLES["fail"])
            elif same and prop_failed:
                continue  # the failing propagated mark stays visible
            else:
                glyph = (PLOT_GLYPHS["both" if same else "isolated"], PLOT_STYLES["isolated"])
            rows[row_of(iso)][number] = glyph
    return rows


def _plot_marker(culprit, columns: list, chars: int) -> str:
    """The line above the plot: the culprit's mark over its column (blank without one)."""
    marker = " " * (PLOT_LABEL_WIDTH + 1)
    for number, column in enumerate(columns):
        if culprit is not None and any(p.index == culprit.index for p in column):
            marker += f"[{PLOT_STYLES['fail']}]{PLOT_GLYPHS['culprit']}[/] #{culprit.index} {escape(culprit.name)}"
            break
        marker += " " * chars
    return marker


def _draw_plot(console: Console, rows: dict, columns: list, chars: int) -> None:
    """The plot's rows with their decade labels, the axis, the op index ticks and the legend."""
    def drawn(glyph: str, style: str) -> str:
        text = glyph * chars if glyph == PLOT_GLYPHS["tolerance"] else glyph.ljust(chars)
        return f"[{style}]{text}[/]" if style else text

    for key, cells_of_row in rows.items():
        label = "exact" if key == "exact" else f"1e{key:+03d}"
        line = f"{label:>{PLOT_LABEL_WIDTH - 1}} ┤" + "".join(drawn(glyph, style) for glyph, style in cells_of_row)
        console.print(line.rstrip(), soft_wrap=True)
    console.print(" " * (PLOT_LABEL_WIDTH - 1) + " └" + "─" * (len(columns) * chars), soft_wrap=True)
    ticks = [" "] * (len(columns) * chars + PLOT_LABEL_WIDTH)
    every = max(1, math.ceil(PLOT_TICK_EVERY / chars))
    for number in range(0, len(columns), every):
        text = str(columns[number][0].index)
        ticks[number * chars:number * chars + len(text)] = list(text)
    console.print(" " * (PLOT_LABEL_WIDTH + 1) + "".join(ticks).rstrip(), soft_wrap=True)
    console.print(f"{PLOT_GLYPHS['isolated']} isolated  {PLOT_GLYPHS['propagated']} propagated (every op on the "
                  f"target)  {PLOT_GLYPHS['both']} both  {PLOT_GLYPHS['isolated-fail']} {PLOT_GLYPHS['propagated-fail']} "
                  f"failing  {PLOT_GLYPHS['tolerance']} isolated tolerance", soft_wrap=True)


@render.register
def _(result: R.TolResult, console: Console) -> None:
    if result.message:
        console.print(escape(result.message))
        return
    policy = result.policy
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("dtype / op", "rtol", "atol"):
        table.add_column(column)
    for dtype, tol in policy["by_dtype"].items():
        table.add_row(dtype, f"{tol['rtol']:g}", f"{tol['atol']:g}")
    for name, tol in policy["by_op"].items():
        table.add_row(f"op {escape(name)}", f"{tol['rtol']:g}", f"{tol['atol']:g}")
    print_table(console, table)
    console.print(f"propagated verdicts: {policy['propagated_factor']:g}x rtol and atol; integers and bools "
                  "must match exactly")
    console.print("an output passes when max_abs_err <= atol + rtol * absmax(source)")
    noise = policy.get("noise")
    if policy.get("kind") == "noise-floor" and noise:
        console.print(f"rule: [bold]noise-floor[/] (the default; the table is the fixed rule, used where an op has no "
                      f"float64 reference or an override): an output passes when its error against the float64 "
                      f"reference is within {noise['source_factor']:g}x the source's own error or "
                      f"{noise['ulp_factor']:g} ulp + {noise['accumulation_factor']:g} float32 ulp of its scale "
                      f"({noise['propagated_factor']:g}x that when propagated); `tol fixed` switches to the table")
    elif noise:
        console.print("rule: [bold]fixed[/] (the table); `tol noise-floor` judges against the float64 reference again")


@render.register
def _(result: R.BreakResult, console: Console) -> None:
    if result.message:
        console.print(escape(result.message))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("num", "stops after", "hits"):
        table.add_column(column, overflow=PROSE if column == "stops after" else "ellipsis")
    for bp in result.breakpoints:
        table.add_row(str(bp.number), escape(bp.describe()), str(bp.hits))
    print_table(console, table)


# ------------------------------------------------------------------ engine, record and repro results
def culprit_detail(culprit, console: Console) -> None:
    """A culprit's source line, verdict, what that verdict means, its class and message (bisect's and migrate's)."""
    print_source_location(culprit.source_location, console)
    console.print(f"  verdict: [{verdict_style(Status.FAIL)}]{escape(culprit.verdict)}[/]  {escape(culprit.summary or '')}")
    if culprit.diagnosis:
        console.print(f"  {escape(culprit.diagnosis)}")
    if culprit.wrong:
        console.print(f"  class: [bold]{escape(culprit.wrong)}[/]: {escape(culprit.evidence)}")
    if culprit.message and culprit.message != culprit.summary:
        console.print(f"  {escape(culprit.message)}")


def step_text(step: int | None) -> str:
    """`, step 3 (decode)` for an op of a generation trace; "" otherwise."""
    if step is None:
        return ""
    return f", step {step} ({step_kind(step)})"


def place_text(place: R.StepPlace) -> str:
    """`2 of 0..3 (decode, positions [9, 10)), op 3 of 245 in the step`: `where`'s step line."""
    recorded = place.recorded
    kind = (f"{recorded.kind}, positions [{recorded.start}, {recorded.end})" if recorded is not None else
            step_kind(place.step))
    return f"{place.step} of 0..{place.last_step} ({kind}), op {place.offset + 1} of {place.count} in the step"


def _tokens_line(tokens, console: Console) -> None:
    """Bisect's line on a generation's tokens (engine/generation.py): the first bad token, or none."""
    if tokens is None:
        return
    if tokens.failure:
        console.print(f"  tokens: the {tokens.mode} run stopped: {escape(tokens.failure)}")
        return
    first = tokens.first_bad
    worst = max(tokens.steps, key=lambda step: step.kl, default=None)
    kl = f"; KL max {worst.kl:.2e} nats (step {worst.step})" if worst is not None else ""
    if first is None:
        console.print(f"  tokens ({tokens.mode}): all {len(tokens.steps)} steps choose the source's token{kl}")
        return
    how = (f"in each other's top-{tokens.top_k}: drift" if first.in_top_k else
           f"not in each other's top-{tokens.top_k}: a bug")
    console.print(f"  [bold red]first bad token[/]: step {first.step} (position {first.position}): source "
                  f"{first.source}, target {first.target}, {how}{kl}")


@render.register
def _(result: TokenReport, console: Console) -> None:
    if result.failure:
        console.print(f"[bold red]the {result.mode} run stopped[/]: {escape(result.failure)}")
        return
    first = result.first_bad
    head = (f"first bad token at step {first.step}" if first is not None else "every step chooses the source's token")
    console.print(f"tokens on {escape(result.target)} ({result.mode}, {result.runs} run(s)): {head}")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("step", "position", "source", "target", "verdict", "KL (nats)", "logits error"):
        table.add_column(column, justify="right" if column != "verdict" else "left")
    for step in result.steps:
        style = "" if step.verdict == "same" else ("yellow" if step.verdict == "drift" else "bold red")
        verdict = f"[{style}]{step.verdict}[/]" if style else step.verdict
        table.add_row(str(step.step), str(step.position), str(step.source), str(step.target), verdict,
                      f"{step.kl:.2e}", f"{step.error:.2e}")
    print_table(console, table)


TVM_WIDE_SHOWN = 8  # TVM-wide ops named in a bisect's text; the rest counted (--json lists every one)
ATTRIBUTION_TEXT = {"target": "this platform's bug: the reference target {ref} agrees with the source here, the "
                              "target does not",
                    "tvm": "every TVM target's: the reference target {ref} differs from the source here too"}


def _reference_lines(result, console: Console) -> None:
    """Under a reference target (a bisect's or a triage's result): what the target was judged against, whose
    the culprit is, and the TVM-wide ops (one line each)."""
    reference = result.reference or {}
    if reference.get("kind") != "target":
        return
    ref = escape(str(reference.get("target")))
    culprit = getattr(result, "culprit", None)
    if culprit is not None and culprit.attribution in ATTRIBUTION_TEXT:
        console.print(f"  attribution: [bold]{culprit.attribution}[/]: {ATTRIBUTION_TEXT[culprit.attribution].format(ref=ref)}")
    else:
        console.print(f"  judged against the reference target {ref}, not the recorded source")
    if result.tvm_wide:
        shown = ", ".join(f"#{op.index} {escape(op.name)} ({escape(op.op)}, {escape(op.verdict)})"
                          for op in result.tvm_wide[:TVM_WIDE_SHOWN])
        more = f" and {len(result.tvm_wide) - TVM_WIDE_SHOWN} more" if len(result.tvm_wide) > TVM_WIDE_SHOWN else ""
        console.print(f"  TVM-wide ({ref} differs from the source too; every TVM target's, not this platform's): "
                      f"{shown}{more}")


@render.register
def _(result: BisectResult, console: Console) -> None:
    if not result.diverged:
        console.print(f"[green]no divergence[/]: {result.ops} ops checked on {escape(result.target)} with "
                      f"{result.probes} probes in {result.seconds:.1f} s")
        _reference_lines(result, console)
        _tokens_line(result.tokens, console)
        _print_notes(result.notes, console)
        return
    culprit = result.culprit
    console.print(f"[bold red]first divergent op[/]: #{culprit.index} [bold]{escape(culprit.name)}[/] "
                  f"({escape(culprit.op)}) in layer [cyan]{escape(layer_text(culprit.layer))}[/]{step_text(culprit.step)}")
    culprit_detail(culprit, console)
    _reference_lines(result, console)
    _tokens_line(result.tokens, console)
    probes = f"{result.probes} probe{'s' if result.probes != 1 else ''}"
    console.print(f"  found on {escape(result.target)} with {probes} over {result.ops} ops in {result.seconds:.1f} s")
    if result.neighbourhood:  # isolated verdicts only: the search never runs the neighbours propagated
        table = Table(box=None, pad_edge=False, header_style="bold")
        for column in ("", "#", "name", "source op", "layer", "isolated"):
            table.add_column(column, overflow=PROSE if column == "isolated" else "ellipsis")
        for row in result.neighbourhood:
            table.add_row("→" if row.index == culprit.index else "", str(row.index), escape(row.name),
                          escape(row.op), escape(layer_text(row.layer)), verdict_cell(row.isolated, culprit.message))
        print_table(console, table)
    _print_notes(result.notes, console)


@render.register
def _(result: TriageResult, console: Console) -> None:
    findings = f"; {len(result.findings)} finding(s) of TVM's stock import" if result.findings else ""
    if not result.diverged:
        console.print(f"[green]no divergence[/]: {result.ops} ops judged on {escape(result.target)} "
                      f"in {result.seconds:.1f} s{findings}")
    else:
        ops = sum(len(group.ops) for group in result.groups)
        inherited = sum(len(group.inherited) for group in result.groups)
        console.print(f"[bold red]{len(result.groups)} cause(s)[/] of divergence on {escape(result.target)}: {ops} "
                      f"divergent op(s), {inherited} inherited failure(s) folded in; {result.ops} ops judged in "
                      f"{result.seconds:.1f} s{findings}")
    # numbered as the headline counts them: causes 1..N, then the stock import's findings on their own
    entries = [(f"{n}.", g) for n, g in enumerate(result.groups, 1)] + \
              [(f"finding {n}.", g) for n, g in enumerate(result.findings, 1)]
    for label, group in entries:
        first = group.first
        console.print(f"{label} [bold]{escape(group.cause)}[/]  class [bold]{escape(group.wrong)}[/]")
        for op in group.ops:
            console.print(f"   #{op.index:<4} {escape(op.name):<22} {escape(layer_text(op.layer)):<16} {step_cell(op.step)}"
                          f"[{verdict_style(Status.FAIL)}]{escape(op.verdict)}[/] {escape(_cut(op.summary))}")
        print_source_location(first.source_location, console, indent="   ")
        if first.evidence and first.evidence != first.summary:
            console.print(f"   evidence: {escape(first.evidence)}")
        if group.inherited:
            shown = ", ".join(f"#{index}" for index in group.inherited[:INHERITED_SHOWN])
            more = f" and {len(group.inherited) - INHERITED_SHOWN} more" if len(group.inherited) > INHERITED_SHOWN else ""
            console.print(f"   [dim]inherited: {shown}{more}[/]")
    _kept_line(result.kept, console)
    if result.host_only:
        print_note(f"on the host only (no verdict, no cause): {host_only_text(result.host_only)}", console)
    _reference_lines(result, console)


def _kept_line(kept: list[int], console: Console) -> None:
    """Triage's kept ops (engine/kept.py): no cause, by the user's choice."""
    if kept:
        print_note(f"kept on the source (no verdict, no cause): {', '.join(f'#{index}' for index in kept)}", console)


@render.register
def _(result: FixResult, console: Console) -> None:
    changed = len(result.rewritten)
    verdict = "[green]passes[/]" if result.output_passed else "[bold red]still fails[/]"
    chars = None if _WHOLE.get() else FAILURE_CHARS
    before = result.output_before.text(chars) if result.output_before else "not run"
    after = result.output_after.text(chars) if result.output_after else "not run"
    if not result.groups:
        console.print(f"[green]nothing to fix[/]: triage found no divergence on {escape(result.target)}")
    else:
        console.print(f"fix for {result.groups} cause(s) on {escape(result.target)}: {changed} op(s) rewritten, "
                      f"{len(result.fixed) - changed} right once they are, {len(result.unfixed)} not fixed; the "
                      f"model's output with everything offloaded {verdict} ({escape(before)} -> {escape(after)}); "
                      f"{result.sessions} candidate session(s), {result.seconds:.1f} s", soft_wrap=True)
    for op in result.fixed:
        console.print(f"  [green]fixed[/]   #{op.index:<4} {escape(op.name):<22} {escape(op.how)}", soft_wrap=True)
        console.print(f"          op: {escape(op.before.text())} -> {escape(op.after.text())}", soft_wrap=True)
    for op in result.unfixed:
        console.print(f"  [red]unfixed[/] #{op.index:<4} {escape(op.name):<22} {escape(op.cause)}", soft_wrap=True)
        console.print(f"          why: {escape(op.why)}", soft_wrap=True)
    console.print(f"wrote {escape(str(Path(result.folder) / 'fix.py'))} and README.md (what each rewrite does, "
                  "what it was verified against)", soft_wrap=True)


def _cut(message: str, chars: int = MESSAGE_CHARS) -> str:
    if _WHOLE.get() or len(message) <= chars:
        return message
    return message[:chars - 1] + "…"


@render.register
def _(result: R.BisectDone, console: Console) -> None:
    render(result.result, console)
    culprit = result.result.culprit
    if result.result.diverged and culprit is not None:
        past = (f"keep {culprit.index}", "keep it on the source: `bisect` then finds the next divergence")
        lines = [(f"dump {culprit.index} DIR", "a standalone repro"),
                 (f"compare {culprit.index}", "both verdicts side by side"),
                 (f"show {culprit.index}", "its Relax IR"), ("plot", "every op's error")]
        render(NextCommands([past, *lines] if blocks_target(culprit) else [*lines, past], repl=True), console)
    else:
        render(NextCommands([("plot", "how close every op came to its tolerance")], repl=True), console)


@render.register
def _(result: NextCommands, console: Console) -> None:
    if not result.commands:
        return
    if result.repl:
        console.print("  next: " + ", ".join(f"`{escape(command)}` ({escape(why)})" for command, why in result.commands))
        return
    width = max(len(command) for command, _why in result.commands)
    for number, (command, why) in enumerate(result.commands):
        lead = "next: " if number == 0 else "      "
        console.print(f"{lead}{escape(command):<{width}}  [dim]# {escape(why)}[/]", soft_wrap=True)


@render.register
def _(result: ReportWritten, console: Console) -> None:
    report = result.report
    culprit = report.culprit
    found = (f"culprit #{culprit.index} {escape(culprit.name)} ({escape(culprit.verdict)})" if culprit is not None
             else "no divergence")
    console.print(f"wrote the report of {len(report.points)} ops on {escape(report.target)} to "
                  f"{escape(str(result.path))} ({size_text(result.bytes)}): {found}; {report.units} compiled "
                  f"unit(s), {report.seconds:.1f} s", soft_wrap=True)
    console.print(f"  open: file://{escape(str(result.path.resolve()))}", soft_wrap=True)


@render.register
def _(result: ReportFolder, console: Console) -> None:
    render(result.page, console)
    if result.explorer is not None:
        render(result.explorer, console)


@render.register
def _(result: ModelExplorerWritten, console: Console) -> None:
    keyed = ", ".join(f"{name}: {count} of {result.ops} ops" for name, count in result.keyed.items())
    console.print(f"wrote the Model Explorer graph ({result.nodes} nodes) and node data ({escape(keyed)}) to "
                  f"{escape(str(result.folder))}", soft_wrap=True)
    console.print(f"  open: {escape(result.command)}", soft_wrap=True)


@render.register
def _(result: RecordResult, console: Console) -> None:
    run = result.run_seconds or result.seconds
    ratio = result.overhead_ratio  # None for a forward too short to time (record.recorder.EAGER_RATIO_MIN_SECONDS)
    eager = seconds_text(result.eager_seconds) if result.eager_seconds else UNKNOWN
    versus = (f" = {ratio:.1f}x the bare eager forward ({eager}, warm)" if ratio is not None else
              f" (the bare eager forward: {eager}, warm, too short for a ratio)")
    console.print(f"recorded [bold]{result.ops}[/] ops to {escape(str(result.path))} ({size_text(result.file_bytes)}) "
                  f"in {result.seconds:.2f} s: prepare (export + import) {result.prepare_seconds:.2f} s, "
                  f"run {run:.2f} s{versus}")
    if result.causal_lm:
        console.print(f"  driven as a {escape(result.causal_lm)} (as generate() runs a prefill, use_cache=False)")
    if result.generation:
        console.print(f"  {escape(result.generation)}, each op tagged with its step")
    console.print(f"  {result.helper_ops} helper ops: {result.host_helpers} on the host (numpy / torch), "
                  f"{result.helper_ops - result.host_helpers} on tvm:llvm")
    if result.host_only:
        console.print(f"  {len(result.host_only)} op(s) TVM cannot import, run on the host in every replay: "
                      f"{escape(host_only_text(result.host_only))}", soft_wrap=True)
    if result.capture:
        console.print(f"  tensors stored for {result.stored_ops} of {result.ops} ops "
                      f"({escape(capture_text(result.capture))}); every op has stats")


@render.register
def _(result: NativeRecordResult, console: Console) -> None:
    whole = ("could not run" if result.whole_difference is None else
             f"{result.whole_difference:.3g} from the op-by-op values ({seconds_text(result.eager_seconds)})")
    console.print(f"recorded [bold]{result.ops}[/] ops to {escape(str(result.path))} ({size_text(result.file_bytes)}) "
                  f"in {result.seconds:.2f} s: build_tvm + checks {result.prepare_seconds:.2f} s, run "
                  f"{result.run_seconds:.2f} s on {escape(result.source)}")
    where = escape(tvm_source_target(result.source) or result.source)
    if result.generation:  # a native LLM: the deployment's own prefill and decode steps on its paged cache
        console.print(f"  {escape(result.generation)}, each call of each step an op (the paged-KV calls with the "
                      f"cache state as values); the module's own steps on its paged cache on {where}: every step's "
                      f"logits {whole}")
    else:
        console.print(f"  TVM-native: entry function {escape(result.entry)}, each binding an op; the whole module run "
                      f"once on {where}: {whole}")
    if result.capture:
        console.print(f"  tensors stored for {result.stored_ops} of {result.ops} ops "
                      f"({escape(capture_text(result.capture))}); every op has stats")


@render.register
def _(result: TraceInfo, console: Console) -> None:
    render(TraceSummary.from_info(result.info), console)


@render.register
def _(result: TraceSummary, console: Console) -> None:
    rows = [
        ("trace", result.path), ("format", result.format), ("model", result.model), ("source", result.source),
        ("versions", ", ".join(f"{name} {version}" for name, version in result.versions.items())),
        ("created", result.created),
        ("complete", complete_text(result.complete, result.recorded_ops, result.num_ops)),
        ("ops", result.num_ops), ("layers", result.num_layers),
        ("inputs / params", f"{result.num_inputs} / {result.num_params}"),
        ("file size", size_text(result.file_bytes)), ("activations", size_text(result.activation_bytes)),
        ("vs eager forward", eager_diff_text(result.eager_output_max_abs_diff)),
    ]
    if result.capture:
        rows.append(("capture", f"{capture_text(result.capture)}; {result.recorded_ops} ops with tensors, "
                                f"{result.stats_only_ops} with stats only"))
    if result.causal_lm:
        rows.append(("driven as", CausalLMInfo.text_of(result.causal_lm)))
    generation = GenerationInfo.from_meta(result.generation)
    if generation is not None:
        tokens = " ".join(str(step.token) for step in generation.steps)
        rows.append(("generation", f"{generation.text[len('generation: '):]}; the source's tokens: {tokens}"))
    if result.import_fixes:
        rows.append(("import fixes", ", ".join(result.import_fixes)))
    if (result.type_changes or {}).get("ops"):
        rows.append(("type changes", type_changes_text(result.type_changes)))
    if result.stock_import:
        rows.append(("stock import", stock_import_text(result.stock_import)))
    if result.weights:
        rows.extend(weights_rows(result.weights))
    if result.host_only:
        rows.append(("host only", host_only_text(result.host_only) + " (run on the host in every replay)"))
    table = Table(show_header=False, box=None)
    table.add_column("key")
    table.add_column("value", overflow=PROSE)
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", escape(str(value)))
    print_table(console, table)


@render.register
def _(result: DumpResult, console: Console) -> None:
    path = escape(str(result.path))
    what = (f"unit #{result.unit[0]}..#{result.unit[-1]} ({len(result.unit)} ops as one function, at #{result.index} "
            f"{escape(result.name)})" if result.unit else f"op #{result.index} {escape(result.name)}")
    console.print(f"wrote repro of {what} to {path} ({size_text(result.bytes)}); run: python {path}/repro.py")


@render.register
def _(result: R.DumpDone, console: Console) -> None:
    render(result.result, console)


@render.register
def _(result: CarveResult, console: Console) -> None:
    path = escape(str(result.path))
    console.print(f"carved {result.tests} op tests into {path} ({size_text(result.bytes)}); run: pytest {path}")
    for note in result.skipped[:SKIPPED_SHOWN]:
        console.print(f"  [yellow]{escape(note)}[/]")
    if len(result.skipped) > SKIPPED_SHOWN:
        console.print(f"  ... and {len(result.skipped) - SKIPPED_SHOWN} more left out")


@render.register
def _(result: CompileReport, console: Console) -> None:
    console.print(f"compiled {result.ops} ops for {escape(result.target)}: {result.failed} failed")
    for row in result.failures:
        console.print(f"  [{verdict_style(row['verdict'])}]{escape(str(row['verdict']))}[/] #{row['index']} "
                      f"{escape(row['name'])} ({escape(row['op'])}): {escape(str(row['message']))}")


@render.register
def _(result: VerifyReport, console: Console) -> None:
    how = "checksums verified" if result.checksummed else f"structure only: format {result.format or '?'} has no checksums"
    if result.ok:
        weights = (f"; referenced weights checked against {len(result.weight_files)} checkpoint file(s) by SHA-256"
                   if result.weight_files else "")
        console.print(f"[green]intact[/]: {escape(result.path)}: {result.parts} parts read, "
                      f"{result.datasets} tensors and texts ({escape(how)}){escape(weights)}")
        return
    console.print(f"[bold red]damaged[/]: {escape(result.path)}: {len(result.damaged)} of {result.parts} parts "
                  f"({escape(how)})")
    for damage in result.damaged:  # each message names its part; the path is said once, above
        console.print(f"  [red]-[/] {escape(damage.message.removeprefix(f'{result.path}: '))}")


# ---------------------------------------------------------------------------- mixed runs and migration
MIXED_FAILING_SHOWN = 8  # ops failing in a mixed run listed by name; the rest are counted


def _output_line(check, failure: str = "") -> str:
    status = "[green]pass[/]" if check.passed else f"[{verdict_style(Status.FAIL)}]FAIL[/]"
    figures = escape(metrics_text(check.metrics)) if check.metrics else \
        f"no value {AS_ABOVE}" if failure and check.message == failure else escape(check.message)
    top1 = f"  argmax agrees on {check.top1:.1%} of positions" if check.top1 is not None else ""
    label = f" ({escape(check.label)})" if check.label else ""
    return f"  output {escape(check.op)}[{check.output}]{label}: {status} {figures}{top1}"


@render.register
def _(result: MixedRun, console: Console) -> None:
    source = result.ops - len(result.offload)
    console.print(f"mixed run on {escape(result.target)}: {escape(spans_text(result.offload, result.ops))} on the "
                  f"target, {source} on the source ({escape(result.source)})")
    if result.failure:
        console.print(f"  [{FAILED_RUN_STYLE}]stopped[/]: {escape(result.failure)}")
    for check in result.outputs:
        console.print(_output_line(check, result.failure), soft_wrap=True)
    verdict = "[green]the output is right[/]" if result.passed else "[bold red]the output is wrong[/]"
    reused = f", {result.reused} reused from an earlier run" if result.reused else ""
    console.print(f"  {verdict}; {result.units} target unit(s) run, {result.compiled} compiled{reused}, "
                  f"in {result.seconds:.1f} s")
    failing = result.failing_ops()
    if failing:
        cells = [verdict_cell(result.verdicts[i], result.failure) for i in failing[:MIXED_FAILING_SHOWN]]
        shown = ", ".join(f"#{i} {escape(result.verdicts[i].name)} {cell.removesuffix(f' {AS_ABOVE}')}"
                          for i, cell in zip(failing, cells))
        more = f" and {len(failing) - MIXED_FAILING_SHOWN} more" if len(failing) > MIXED_FAILING_SHOWN else ""
        said = " (the stopped unit's error, as above)" if any(cell.endswith(AS_ABOVE) for cell in cells) else ""
        console.print(f"  {len(failing)} op(s) fail in this run: {shown}{more}{said}", soft_wrap=True)
    _print_notes(result.notes, console)


@render.register
def _(result: MigrateResult, console: Console) -> None:
    how = "one block alone on the target, the rest on the source" if result.one_at_a_time else \
        f"the offloaded prefix grows one {'op' if result.by == 'op' else 'top-level block'} per step"
    console.print(f"migration on {escape(result.target)} by {result.by}: {len(result.steps)} steps, {how}")
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["step", "adds" if not result.one_at_a_time else "on the target", "offloaded", "output error",
               "top-1", "output"] + (["rank"] if result.ranking else [])
    for column in columns:
        table.add_column(column, justify="right" if column in ("step", "output error", "top-1", "rank") else "left")
    rank = {number: position for position, number in enumerate(result.ranking, start=1)}
    said = _first_text(result.culprit.message) if result.culprit is not None else ""  # culprit_detail prints it
    for step in result.steps:
        error = "nan/inf" if step.run.not_finite else "-" if step.error is None else f"{step.error:.1e}"
        top1 = f"{step.run.top1:.1%}" if step.run.top1 is not None else "-"
        status = "[green]pass[/]" if step.passed else f"[{verdict_style(Status.FAIL)}]FAIL[/]"
        if step.run.failure:
            failure = step.run.failure
            if said and failure.endswith(said):
                failure = f"{failure[:-len(said)].rstrip(': ')} {AS_BELOW}"
            status += f" {escape(_cut(failure))}"
        row = [str(step.number), escape(step.label), escape(spans_text(step.offload, result.ops)), error, top1, status]
        table.add_row(*row, *([str(rank[step.number])] if result.ranking else []))
    print_table(console, table)
    by_number = {step.number: step for step in result.steps}
    if result.first_failing_step is None:
        console.print("[green]the output stays right at every step[/]")
    elif result.one_at_a_time:
        top = by_number[result.ranking[0]]
        console.print(f"[bold red]largest effect on the output[/]: {escape(top.label)} alone on the target "
                      f"(output error {top.run.error:.1e})")
    else:
        step = by_number[result.first_failing_step]
        console.print(f"[bold red]first failing step[/]: {step.number} ({escape(step.label)}): with it on the target "
                      f"the model's output is past its tolerance")
    culprit = result.culprit
    if culprit is not None:
        console.print(f"culprit: #{culprit.index} [bold]{escape(culprit.name)}[/] ({escape(culprit.op)}) in layer "
                      f"[cyan]{escape(layer_text(culprit.layer))}[/]{step_text(culprit.step)}, the first op of "
                      f"migration step {result.culprit_step} whose offload breaks the output ({result.probes} mixed runs)")
        culprit_detail(culprit, console)
    console.print(f"  {len(result.steps)} steps in {result.seconds:.1f} s: {result.units} target units run, "
                  f"{result.compiled} compiled, {result.reused} reused from earlier runs")
    _print_notes(result.notes, console)


# ---------------------------------------------------------------------------- diff
DIFF_LISTED = 8  # `diff`: ops beyond the tolerance, and ops of one trace only, named; the rest counted
DIFF_LAYERS_SHOWN = 40  # layer rows shown; a longer table starts DIFF_LAYER_CONTEXT rows before the first that differs
DIFF_LAYER_CONTEXT = 5


def _listed(names: list[str], total: int | None = None) -> str:
    more = (total if total is not None else len(names)) - DIFF_LISTED
    return ", ".join(names[:DIFF_LISTED]) + (f" and {more} more" if more > 0 else "")


def _diff_figures(compared, bound: bool = True) -> str:
    """A pair's figures (and its bound), or why it has none."""
    if compared.metrics is None:
        return compared.note or "no outputs"
    tol = compared.tolerance
    said = "exact" if tol.rtol == 0 and tol.atol == 0 else f"rtol {tol.rtol:g}, atol {tol.atol:g}"
    whose = f"{compared.precision}: " if compared.precision and said != "exact" else ""
    return metrics_text(compared.metrics) + (f" ({whose}{said})" if bound else "")


def _diff_tolerance_line(result: DiffResult) -> str:
    if result.tolerance.rtol is None:
        return ("  tolerance: max_abs <= atol + rtol * absmax(A), the judge's for the lowest precision an op is "
                "computed from in A or B (float32 rtol 1e-4, bfloat16 4e-2: docs/tolerance.md); integers exact; "
                "--rtol sets one")
    return (f"  tolerance: max_abs <= {result.tolerance.atol or 0:g} + {result.tolerance.rtol:g} * absmax(A) for every "
            "float pair (--rtol, --atol), integers exact")


@render.register
def _(result: DiffResult, console: Console) -> None:
    a, b = result.a, result.b
    among = f" among {escape(result.selected)}" if result.selected else ""
    console.print(f"diff {escape(a.path)} ({escape(a.source or UNKNOWN)}) vs {escape(b.path)} ({escape(b.source or UNKNOWN)}):"
                  f" {len(result.ops)} ops paired by {'name and step' if result.by_step else 'name'}{among}; "
                  f"{len(result.only_in_a)} only in A, {len(result.only_in_b)} only in B", soft_wrap=True)
    for side, names in (("A", result.only_in_a), ("B", result.only_in_b)):
        if names:
            console.print(f"  only in {side}: {escape(_listed(names))}", soft_wrap=True)
    counts = result.counts()
    shown = [f"{counts[str(s)]} {s}" for s in DiffStatus if counts[str(s)] or s in (DiffStatus.CLOSE, DiffStatus.DIFFERS)]
    console.print(f"  {len(result.ops)} compared, B against A: {', '.join(shown)}", soft_wrap=True)
    console.print(escape(_diff_tolerance_line(result)), soft_wrap=True)
    casts: dict[str, int] = {}
    for op in result.ops:
        if op.compared.cast:
            casts[op.compared.cast] = casts.get(op.compared.cast, 0) + 1
    for cast, count in casts.items():
        console.print(f"  dtypes differ ({escape(cast)}) at {count} op(s): compared in float64")
    other = [op for op in result.ops if op.op and op.b_op and op.op != op.b_op]
    if other:
        console.print(f"  {len(other)} pair(s) are other operators in B (the graphs differ there): #{other[0].a} "
                      f"{escape(other[0].name)} is {escape(other[0].op)} in A, {escape(other[0].b_op)} in B", soft_wrap=True)
    first = result.first_difference
    if first is not None:
        where = f"; B's #{first.b}" if first.b != first.a else ""
        console.print(f"[bold red]first difference[/]: #{first.a} [bold]{escape(first.name)}[/] ({escape(first.op)}{where}) "
                      f"in layer [cyan]{escape(layer_text(first.layer))}[/]{step_text(first.step)}: "
                      f"{first.status}: {escape(_diff_figures(first.compared))}", soft_wrap=True)
        beyond = [op for op in result.ops if op.status in DIFFERENT]
        console.print(f"  {len(beyond)} op(s) differ: {escape(_listed([f'#{op.a} {op.name}' for op in beyond]))}",
                      soft_wrap=True)
    else:
        figured = [op for op in result.ops if op.compared.metrics is not None]
        largest = max(figured, key=lambda op: op.compared.metrics.scale_rel_err, default=None)
        said = (f"; the largest: #{largest.a} {escape(largest.name)} {escape(_diff_figures(largest.compared))}"
                if largest is not None and largest.status != DiffStatus.IDENTICAL else "")
        console.print(f"[green]no difference beyond the tolerance[/]{said}", soft_wrap=True)
    _diff_layers(result, console)
    _print_notes([f"{op.name}: {op.compared.note}" for op in result.ops if op.status == DiffStatus.NOT_COMPARED][:1],
                 console)


def _diff_layers(result: DiffResult, console: Console) -> None:
    """Each layer compared at its last op in A and in B: where the two recordings part."""
    if not result.layers:
        return
    parted = result.first_layer_difference
    headline = (f"first layer that differs: [cyan]{escape(layer_text(parted.layer))}[/]{step_text(parted.step)}"
                if parted else "[green]every layer within the tolerance[/]")
    console.print(f"layers, each compared at its last op: {len(result.layers)}; {headline}")
    rows = result.layers
    start = 0
    if len(rows) > DIFF_LAYERS_SHOWN and parted is not None:
        start = max(0, rows.index(parted) - DIFF_LAYER_CONTEXT)
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["layer", *(["step"] if result.by_step else []), "last op", "status", "figures"]
    for column in columns:
        table.add_column(column, overflow=PROSE if column == "figures" else "ellipsis")
    for row in rows[start:start + DIFF_LAYERS_SHOWN]:
        at = f"#{row.a} {row.a_name}" + ("" if (row.b, row.b_name) == (row.a, row.a_name) else f" / B #{row.b} {row.b_name}")
        status = f"[{verdict_style(Status.FAIL)}]{row.status}[/]" if row.status in DIFFERENT else str(row.status)
        figures = _diff_figures(row.compared, bound=False) if row.status != DiffStatus.IDENTICAL else ""
        table.add_row(escape(layer_text(row.layer)), *([str(row.step)] if result.by_step else []), escape(at),
                      status, escape(figures))
    print_table(console, table)
    hidden = len(rows) - min(len(rows) - start, DIFF_LAYERS_SHOWN)
    if hidden:
        console.print(f"  {hidden} more layer(s) not shown (--json lists every one)")
