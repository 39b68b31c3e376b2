"""The command line: every subcommand is an entry of the table of commands (tapml_dbg.api.COMMANDS), its
parser made from the entry (ui/verbs.py); `_call` runs its API method or function and renders the result.

What stays here is the command line's own: rendering, `--json` printing, the `next:` lines (`_NEXT`),
exit codes (`_EXIT`), the subcommands that are nothing but the command line (`replay`, `serve`) and
the little a few others do besides (`_HANDLERS`). Exit codes: 0 done (a divergence found is still
"done"), 1 a `TapmlError` (or a damaged trace under `info --verify`), 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from importlib import metadata

from tapml_dbg.api import COMMANDS, Command, Replay, command_line, find_command
from tapml_dbg.engine.kept import blocks_target, kept_selector
from tapml_dbg import settings
from tapml_dbg.errors import TapmlError, UsageError
from tapml_dbg.report.html import prepare_folder
from tapml_dbg.runtime import fork_server
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.trace.verify import VerifyReport
from tapml_dbg.ui.console import error_line, make_console, progress
from tapml_dbg.ui.render import NextCommands, render
from tapml_dbg.ui.repl.app import run_replay
from tapml_dbg.ui import verbs

DESCRIPTION = """\
Record a model's every operator once on PyTorch, replay it on a TVM target, find the
first operator that diverges, and write it as a standalone repro (tvm + numpy only)."""
EPILOG = """\
start with:
  tapml-dbg record examples/fp16_memory_attention.py -o traces/demo.h5
  tapml-dbg bisect traces/demo.h5

`tapml-dbg COMMAND --help` explains a command. Exit status: 0 done (a divergence found is
a completed search), 1 a user error (one line says what to do), 2 bad usage."""
DEFAULT_REPORT_DIR = "report/"  # what `next:` lines suggest for -o
DEFAULT_REPRO_DIR = "repro/"
TRIAGE_DUMPS_SUGGESTED = 3  # `next:` lines after a triage: a dump of each of the first causes
VERSIONED = ("apache-tvm", "torch")  # the stack `--version` names beside tapml-dbg


def version_text() -> str:
    """`tapml-dbg 0.1.0 (apache-tvm 0.27.0.post1, torch 2.13.0+cpu)`, from the installed metadata only."""
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"tapml-dbg {version('tapml-dbg')} ({', '.join(f'{name} {version(name)}' for name in VERSIONED)})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tapml-dbg", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _subcommand_order():
        verbs.add_command(commands, find_command(name))
    return parser


# the order of `tapml-dbg --help` of the table's subcommands (tapml_dbg.api.COMMANDS); an entry not named
# here (diff, a command added) comes before the last
SUBCOMMAND_ORDER = ("record", "info", "replay", "bisect", "triage", "fix", "run", "migrate", "dump", "carve", "compile",
                    "report", "serve")


def _subcommand_order() -> list[str]:
    unnamed = [entry.name for entry in COMMANDS if entry.name not in SUBCOMMAND_ORDER]
    return [*SUBCOMMAND_ORDER[:-1], *unnamed, SUBCOMMAND_ORDER[-1]]


def _quiet_libraries() -> None:
    """torch.export and transformers warn at length on stderr; the CLI speaks for itself."""
    import logging
    import warnings

    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    for name in ("torch", "torch.export", "torch.fx", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    _quiet_libraries()
    out, err = make_console(sys.stdout), make_console(sys.stderr)
    try:
        handler = _HANDLERS.get(args.command)
        if handler is None:
            return _call(find_command(args.command), args, out, err)
        return handler(args, out, err) or 0
    except TapmlError as exc:
        if exc.detail and settings.value(settings.DEBUG):  # the full text behind the line (torch's message)
            err.print(exc.detail, markup=False, highlight=False, soft_wrap=True)
        error_line(str(exc) + (f" (set {settings.DEBUG}=1 for the full text)" if exc.detail and
                               not settings.value(settings.DEBUG) else ""), err)
        return 1
    except KeyboardInterrupt:
        error_line("interrupted", err)
        return 130


def _bar(args) -> bool | None:
    """No progress bar under --json (scripts read stdout; keep stderr quiet too); else on a terminal."""
    return False if getattr(args, "json", False) else None


def _record_next(args, result) -> NextCommands:
    """After a recording: search the trace."""
    return NextCommands([(_command("bisect", args.output), "find the first op that diverges on llvm"),
                         (_command("replay", args.output), "step through it op by op")])


def _command(subcommand: str, trace: str, *extra: str, args=None) -> str:
    """A `tapml-dbg` command line to suggest, with the target options of `args` as the user gave them
    (`tapml_dbg.api.command_line`)."""
    return command_line(subcommand, trace, *extra, options=vars(args) if args is not None else None)


def _keep_next(args, indices, then: str) -> tuple[str, str]:
    """A `next:` line: `subcommand` (args.command) again with `indices` kept on the source too."""
    kept = set(indices) | set(getattr(args, "kept", ()))
    extra = ("--offload", args.offload) if args.command == "run" else ()
    return (_command(args.command, args.trace, *extra, "--keep", kept_selector(kept), args=args), then)


def _bisect_next(args, result) -> NextCommands:
    """After a bisect: dump the culprit, or look at the whole picture; and get past the culprit (kept on
    the source) to the next divergence, first when nothing after it can run or be trusted on the target."""
    report = [] if args.report else [(_command("report", args.trace, "-o", DEFAULT_REPORT_DIR, args=args),
                                      "every op's error along the model, as a page")]
    if result.culprit is None:
        return NextCommands(report)
    index = str(result.culprit.index)
    which = ("--ops", f"{result.culprit.unit[0][0]}:{result.culprit.index + 1}") if result.culprit.unit \
        else ("--op", index)
    past = _keep_next(args, [result.culprit.index], f"keep #{index} on the source and find the next divergence")
    lines = [(_command("dump", args.trace, *which, "-o", DEFAULT_REPRO_DIR, args=args),
              "the fused unit as a standalone repro (tvm + numpy only)" if result.culprit.unit else
              "the op as a standalone repro (tvm + numpy only)"), *report,
             (_command("replay", args.trace, args=args) + f' -c "compare {index}"', "both verdicts side by side")]
    return NextCommands([past, *lines] if blocks_target(result.culprit) else [*lines, past])


def _info_after(args, result) -> NextCommands:
    """After `info`: search the trace; after `info --verify`, when nothing is damaged."""
    if not isinstance(result, VerifyReport):
        return _info_next(args.trace, result.info)
    return NextCommands([(_command("bisect", args.trace), "find the first op that diverges on llvm")] if result.ok
                        else [])


def _info_next(trace: str, info: dict) -> NextCommands:
    """After `info`: search the trace (a trace whose recording stopped: record it again first)."""
    search = [(_command("bisect", trace), "find the first op that diverges on llvm"),
              (_command("replay", trace), "step through it op by op")]
    if info.get("complete") or not info.get("model"):
        return NextCommands(search)
    return NextCommands([(_command("record", info["model"], "-o", trace),
                          "the recording stopped before the end: record it again"), *search])


NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # how --json spells them


def strict_json(value) -> str:
    """`--json` output as strict JSON (RFC 8259): NaN and +-Infinity, which `json.dumps` would print
    bare (not JSON), become the strings "NaN", "Infinity" and "-Infinity"."""
    return json.dumps(_finite(value), allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE[str(value)]
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _open(args, searching: bool = False) -> Replay:
    """The Python API's replay of a subcommand's trace and target options: one TargetSpec, nothing dropped;
    `--keep OPS` kept on the source (`args.kept`: the ops it resolved to, for the `next:` lines)."""
    replay = Replay.from_spec(args.trace, TargetSpec.from_args(args), searching=searching,
                              reference=TargetSpec.reference_from_args(args))
    if getattr(args, "keep", None) is not None:
        try:
            args.kept = replay.keep(args.keep)
        except BaseException:
            replay.close()
            raise
    return replay


def _bisect(args, out, err) -> int:
    folder = prepare_folder(args.report) if args.report else None  # a bad folder fails before the search
    with _open(args, searching=not args.no_sweep) as replay:
        with progress("bisecting", err, show=_bar(args)) as report:
            result = replay.bisect(sweep=not args.no_sweep, progress=report)
        # the answer first, then the report; the workers stop after (a CUDA worker's exit: tenths of a second)
        if args.json:
            print(strict_json(result.to_json()), flush=True)
        else:
            render(result, out)
        written = None
        if folder is not None:
            with progress("report", err, show=_bar(args)) as report:
                written = replay.report(folder, bisect=result, progress=report)
    if args.json:
        return 0
    if written is not None:
        render(written, out)
    render(_bisect_next(args, result), out)
    return 0


def _call(entry: Command, args, out, err) -> int:
    """A command of the table (tapml_dbg.api.COMMANDS): its API method on the trace opened from the options
    (or its function of its own arguments), under a progress bar when the entry names one; `--json` prints
    the result's JSON, else it is rendered, then the commands to type next (`_NEXT`, where the command has
    some). The exit status: 0, or `_EXIT`'s for the result."""
    with _open(args) if entry.on_replay else contextlib.nullcontext() as replay:
        with progress(entry.progress, err, show=_bar(args) if entry.progress else False) as report:
            result = entry.function(*([replay] if entry.on_replay else []), **entry.params(vars(args)),
                                    **({"progress": report} if entry.progress else {}))
    if getattr(args, "json", False):
        print(strict_json(result.to_json()))
    else:
        render(result, out)
        if entry.name in _NEXT:
            render(_NEXT[entry.name](args, result), out)
    return _EXIT[entry.name](result) if entry.name in _EXIT else 0


def _run_next(args, result) -> NextCommands:
    """After a mixed run: offload block by block; first, when a unit did not build or run, find the bugs."""
    lines = [(_command("migrate", args.trace, args=args), "offload block by block: where the output breaks, and "
                                                          "the op that breaks it")]
    if result.failure:  # a unit that does not build or run: find the bugs, to keep them on the source
        lines.insert(0, (_command("triage", args.trace, args=args), "every bug of the model; then --keep them on "
                                                                    "the source to run past them"))
    return NextCommands(lines)


def _migrate_next(args, result) -> NextCommands:
    """After a migration: the culprit's repro and verdicts, and getting past it; else the whole picture."""
    culprit = result.culprit
    if culprit is not None:
        past = _keep_next(args, [culprit.index], f"keep #{culprit.index} on the source and migrate on past it")
        lines = [(_command("dump", args.trace, "--op", str(culprit.index), "-o", DEFAULT_REPRO_DIR, args=args),
                  "the culprit as a standalone repro (tvm + numpy only)"),
                 (_command("replay", args.trace, args=args) + f' -c "compare {culprit.index}"',
                  "both verdicts side by side")]
        return NextCommands([past, *lines] if blocks_target(culprit) else [*lines, past])
    # the output stays right (or no op could be blamed): every op alone, and the whole picture
    return NextCommands([(_command("bisect", args.trace, args=args),
                          "judge every op alone too: an op whose error the output washes out"
                          if result.first_failing_step is None else "find the first op that diverges"),
                         (_command("report", args.trace, "-o", DEFAULT_REPORT_DIR, args=args),
                          "every op's error along the model, as a page")])


def _cause_dump(args, group) -> str:
    """The repro of a cause's first op, in a folder named for it."""
    return _command("dump", args.trace, "--op", str(group.first.index), "-o", f"{DEFAULT_REPRO_DIR}{group.first.name}/",
                    args=args)


def _triage_next(args, result) -> NextCommands:
    """After a triage: a repro of each cause's first op (three at most), then the page."""
    dumps = [(_cause_dump(args, group), f"cause {number}: {group.cause}")
             for number, group in enumerate(result.groups[:TRIAGE_DUMPS_SUGGESTED], 1)]
    causes = [op.index for group in result.groups for op in group.ops]
    kept = set(causes) | set(getattr(args, "kept", ()))
    past = [(_command("run", args.trace, "--offload", "all", "--keep", kept_selector(kept), args=args),
             "the whole model on the target with every cause kept on the source")] if causes else []
    return NextCommands([*dumps, *past, (_command("report", args.trace, "-o", DEFAULT_REPORT_DIR, args=args),
                                         "every op's error along the model, as a page")])


def _fix_next(args, result) -> NextCommands:
    """After a fix: the model run, and triaged, with the fix as the transform."""
    args_fixed = argparse.Namespace(**{**vars(args), "transform": result.transform})
    return NextCommands([(_command("run", args.trace, "--offload", "all", args=args_fixed),
                          "the whole model on the target with the fix" + ("" if result.output_passed else
                                                                         " (still failing: see unfixed)")),
                         (_command("triage", args.trace, args=args_fixed), "what is left with the fix applied")])


def _report(args, out, err) -> int:
    prepare_folder(args.output)  # a folder that cannot hold the page fails before the trace is opened
    return _call(find_command("report"), args, out, err)


def _report_next(args, result) -> NextCommands:
    """After a report: the culprit's repro."""
    if result.report.culprit is None:
        return NextCommands([])
    return NextCommands([(result.page.dump_command, "the culprit as a standalone repro (tvm + numpy only)")])


def _dump(args, out, err) -> int:
    with _open(args) as replay:
        with progress("minimizing", err, show=args.minimize and _bar(args)) as report:
            result = replay.dump(args.op, args.output, minimize=args.minimize, progress=report, ops=args.ops,
                                 command=" ".join(["tapml-dbg"] + args.argv))
    render(result, out)
    return 0


def _replay(args, out, err) -> int:
    return run_replay(args)


def _serve(args, out, err) -> int:
    folder = fork_server.server_folder(settings.value(settings.CACHE_DIR))
    if args.stop:
        pid = fork_server.stop(folder)
        out.print(f"stopped the server (pid {pid}) of {folder}" if pid else f"no server serves from {folder}")
        return 0
    running = fork_server.serving_pid(folder)
    if running is not None:
        raise UsageError(f"a server (pid {running}) serves from {folder} already: `tapml-dbg serve --stop` stops it")
    if fork_server.starting(folder):
        raise UsageError(f"a server is starting to serve from {folder} (a command started it for the next ones): "
                         "`tapml-dbg serve --stop` stops it")
    log = None
    if args.detach:  # its lines go to its log
        os.makedirs(folder, exist_ok=True)
        log = open(os.path.join(folder, "log"), "a")
    try:
        process = fork_server.start(folder, args.idle * 60, log)
    except OSError as exc:
        raise UsageError(f"tapml-dbg serve: {exc} (its log: {os.path.join(folder, 'log')}; set "
                         f"TAPML_CACHE_DIR to a short path if the socket's path is too long)") from exc
    finally:
        if log is not None:
            log.close()
    until = f"{args.idle:g} minutes without a command" if args.idle > 0 else "never idle"
    out.print(f"serving tapml-dbg commands from {folder} (pid {process.pid}): each starts as a fork with TVM and "
              f"torch imported; it stops after {until}, with `tapml-dbg serve --stop`"
              + ("" if args.detach else " or Ctrl-C"))
    if args.detach:
        return 0
    try:
        process.wait()
    except KeyboardInterrupt:
        fork_server.stop(folder)
        process.wait()
        out.print("stopped")
    return 0


# the subcommands that are the command line's only (entries without a function: replay, serve), and those
# whose handler does more than `_call` (bisect writes a report too; dump writes its command line into the
# repro; report refuses a bad folder before it opens the trace)
_HANDLERS = {"replay": _replay, "serve": _serve, "bisect": _bisect, "dump": _dump, "report": _report}
_NEXT = {"record": _record_next, "info": _info_after, "run": _run_next, "migrate": _migrate_next,
         "triage": _triage_next, "fix": _fix_next, "report": _report_next}  # `next:` lines
_EXIT = {"info": lambda result: 0 if getattr(result, "ok", True) else 1}  # `info --verify`: 1 for a damaged trace


if __name__ == "__main__":
    sys.exit(main())
