"""Rich rendering of engine results for the CLI (the REPL reuses `human_bytes`, `verdict_style`)."""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
error_console = Console(stderr=True, highlight=False)


def error_line(message: str) -> None:
    error_console.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)


@contextlib.contextmanager
def progress(label: str, quiet: bool = False):
    """Yields a `callback(done, total)`; draws a bar on a terminal, nothing otherwise."""
    if quiet or not sys.stderr.isatty():
        yield lambda done, total, *_: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=error_console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done, total, note: str = ""):
            bar.update(task, completed=done, total=total, description=note)

        yield update


def human_bytes(count: float | None) -> str:
    if count is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} GiB"


def record_result(result) -> None:
    eager = result.eager_seconds
    run = getattr(result, "run_seconds", 0.0) or result.seconds
    ratio = f"{run / eager:.1f}x" if eager else "?"
    console.print(f"recorded [bold]{result.ops}[/] ops to {result.path} ({human_bytes(result.file_bytes)}) "
                  f"in {result.seconds:.2f} s: prepare (export + import) "
                  f"{getattr(result, 'prepare_seconds', 0.0):.2f} s, run {run:.2f} s = {ratio} the bare eager "
                  f"forward ({eager:.2f} s, warm)")
    host = getattr(result, "host_helpers", 0)
    console.print(f"  {result.helper_ops} helper ops: {host} on the host (numpy / torch), "
                  f"{result.helper_ops - host} on tvm:llvm")
    capture = getattr(result, "capture", None)
    if capture:
        console.print(f"  tensors stored for {result.stored_ops} of {result.ops} ops "
                      f"({_capture_text(capture)}); every op has stats")


def _capture_text(capture: dict) -> str:
    how = " ".join(part for part in (f"--window {capture['window']}" if capture.get("window") is not None else "",
                                     f"--max-bytes {capture['max_bytes']}" if capture.get("max_bytes") is not None
                                     else "") if part)
    layer = f", layer {capture['layer']}" if capture.get("layer") else ""
    cut = ", cut short by the byte budget" if capture.get("truncated") else ""
    return (f"{how}: window ops {capture['first']}..{capture['end'] - 1}{layer}{cut}, "
            f"{human_bytes(capture.get('stored_bytes'))} of op tensors")


def trace_info(info: dict) -> None:
    table = Table(show_header=False, box=None)
    rows = [
        ("trace", info["path"]), ("format", info["format"]), ("model", info["model"]),
        ("source", info["source"]),
        ("versions", ", ".join(f"{k} {v}" for k, v in info["versions"].items())),
        ("created", info["created"]),
        ("complete", "yes" if info["complete"] else f"NO: {info['recorded_ops']} of {info['num_ops']} ops recorded"),
        ("ops", str(info["num_ops"])), ("layers", str(info["num_layers"])),
        ("inputs / params", f"{info['num_inputs']} / {info['num_params']}"),
        ("file size", human_bytes(info["file_bytes"])),
        ("activations", human_bytes(info["activation_bytes"])),
        ("vs eager forward", _eager_diff(info.get("eager_output_max_abs_diff"))),
    ]
    if info.get("capture"):
        rows.append(("capture", f"{_capture_text(info['capture'])}; {info['recorded_ops']} ops with tensors, "
                                f"{info.get('stats_only_ops', 0)} with stats only"))
    if info.get("import_fixes"):
        rows.append(("import fixes", ", ".join(info["import_fixes"])))
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", str(value))
    console.print(table)


def _eager_diff(diff) -> str:
    if diff is None:
        return "not measured"
    return "bit-exact" if diff == 0 else f"max abs diff {diff:.3g} (a decomposed fused kernel)"


def op_table(ops: list[dict], title: str | None = None) -> Table:
    table = Table(title=title)
    for column in ("#", "name", "source op", "layer", "shape"):
        table.add_column(column)
    for op in ops:
        shapes = ", ".join(f"{tuple(o['shape'])} {o['dtype']}" for o in op.get("outputs", [])[:2])
        table.add_row(str(op["index"]), op["name"], op["op"], op.get("layer", ""), shapes)
    return table


def verdict_style(status: str) -> str:
    return {"pass": "green", "fail": "bold red", "compile-error": "bold magenta", "crash": "bold magenta",
            "timeout": "bold magenta", "missing": "yellow", "error": "bold magenta"}.get(status, "")


def bisect_result(result) -> None:
    if not result.diverged:
        console.print(f"[green]no divergence[/]: {result.ops} ops checked on {result.target} with "
                      f"{result.probes} probes in {result.seconds:.1f} s")
        for note in result.notes:
            console.print(f"  note: {note}")
        return
    culprit = result.culprit
    console.print(f"[bold red]first divergent op[/]: #{culprit.index} [bold]{culprit.name}[/] "
                  f"({culprit.op}) in layer [cyan]{culprit.layer or '<top>'}[/]")
    console.print(f"  verdict: [{verdict_style('fail')}]{culprit.verdict}[/]  {culprit.summary}")
    if culprit.message:
        console.print(f"  {culprit.message}")
    console.print(f"  found on {result.target} with {result.probes} probes over {result.ops} ops "
                  f"in {result.seconds:.1f} s")
    if result.neighbourhood:
        table = Table(title="around the culprit")
        for column in ("#", "name", "source op", "layer", "isolated", "propagated"):
            table.add_column(column)
        for row in result.neighbourhood:
            mark = "→ " if row.index == culprit.index else "  "
            table.add_row(f"{mark}{row.index}", row.name, row.op, row.layer,
                          _verdict_cell(row.isolated), _verdict_cell(row.propagated))
        console.print(table)
    for note in result.notes:
        console.print(f"  note: {note}")


def _verdict_cell(verdict) -> str:
    if verdict is None:
        return "-"
    style = verdict_style(verdict.status)
    return f"[{style}]{verdict.status}[/] {verdict.summary}"


def dump_result(result) -> None:
    console.print(f"wrote repro of op #{result.index} {result.name} to {result.path} "
                  f"({human_bytes(result.bytes)}); run: python {result.path}/repro.py")


def carve_result(result) -> None:
    console.print(f"carved {result.tests} op tests into {result.path} ({human_bytes(result.bytes)}); "
                  f"run: pytest {result.path}")
    for note in result.skipped[:20]:
        console.print(f"  [yellow]{note}[/]")
    if len(result.skipped) > 20:
        console.print(f"  ... and {len(result.skipped) - 20} more left out")


def compile_result(result) -> None:
    console.print(f"compiled {result.ops} ops for {result.target}: {result.failed} failed")
    for row in result.failures:
        console.print(f"  [bold magenta]{row['verdict']}[/] #{row['index']} {row['name']} ({row['op']}): "
                      f"{row['message']}")
