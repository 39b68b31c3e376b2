"""Argument parsing only: each subcommand calls the engine and hands its result to a renderer.

Exit codes: 0 done (a divergence found is still "done"), 1 a `TapmlError`, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tapml_dbg.engine.session import Session
from tapml_dbg.errors import TapmlError
from tapml_dbg.record.recorder import record
from tapml_dbg.repro.carve import carve
from tapml_dbg.repro.dump import dump_op
from tapml_dbg.runtime.target import TargetSpec
from tapml_dbg.trace.inspect import trace_info
from tapml_dbg.ui.console import error_line, make_console, progress
from tapml_dbg.ui.render import TraceSummary, render
from tapml_dbg.ui.repl.app import run_replay

os.environ.setdefault("TVM_LOG_DEBUG", "0")


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="llvm", help="TVM target (default llvm)")
    remote = parser.add_mutually_exclusive_group()
    remote.add_argument("--rpc", metavar="HOST:PORT", help="run on a TVM RPC server")
    remote.add_argument("--tracker", metavar="HOST:PORT", help="lease devices from a TVM RPC tracker")
    parser.add_argument("--key", help="device key at the tracker")
    parser.add_argument("--transform", metavar="FILE.py:FUNC",
                        help="IRModule -> IRModule pass applied before every target compile")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds one unit may take to compile and run (default 300)")
    parser.add_argument("--parallel", type=int, default=None, metavar="N",
                        help="worker lanes for independent units (sweep batches, per-op compiles); default: "
                             "one per free tracker server for --tracker/--key, else 1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tapml-dbg", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    rec = commands.add_parser("record", help="run a model on the source and write a trace")
    rec.add_argument("model", metavar="MODEL", help="FILE.py[:FUNC], FUNC() -> (module, inputs)")
    rec.add_argument("-o", "--output", required=True, metavar="TRACE")
    rec.add_argument("--source", default="torch", help="torch (default) or tvm:TARGET")
    rec.add_argument("--inputs", metavar="FILE.npz", help="real inputs, one array per model input")
    rec.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    rec.add_argument("--compression", choices=["none", "lzf", "gzip"], default="none")
    rec.add_argument("--window", metavar="OPS|LAYER",
                     help="store tensors only for these ops (A:B, end exclusive; an op; or a layer such as "
                          "transformer.h.3) plus the values they read; every op keeps its stats")
    rec.add_argument("--max-bytes", metavar="SIZE",
                     help="budget for stored op tensors (e.g. 200M, 1.5G): tensors of ops from the window's "
                          "start (or op 0) until the budget is spent; every op keeps its stats")

    info = commands.add_parser("info", help="summarize a trace")
    info.add_argument("trace", metavar="TRACE")
    info.add_argument("--json", action="store_true", help="one JSON object with the op table")

    replay = commands.add_parser("replay", help="interactive replay on a target")
    replay.add_argument("trace", metavar="TRACE")
    _add_target_options(replay)
    replay.add_argument("-c", dest="commands", metavar='"CMD; CMD"', help="run commands and exit")
    replay.add_argument("--script", metavar="FILE", help="run commands from FILE and exit")

    bisect = commands.add_parser("bisect", help="find the first divergent op")
    bisect.add_argument("trace", metavar="TRACE")
    _add_target_options(bisect)
    bisect.add_argument("--json", action="store_true", help="one JSON object on stdout")
    bisect.add_argument("--no-sweep", action="store_true",
                        help="skip the isolated sweep that catches faults which wash out downstream")

    dump = commands.add_parser("dump", help="write one op as a standalone repro")
    dump.add_argument("trace", metavar="TRACE")
    dump.add_argument("--op", required=True, metavar="OP", help="op index or name")
    dump.add_argument("-o", "--output", required=True, metavar="DIR")
    _add_target_options(dump)

    carve = commands.add_parser("carve", help="write every op as a pytest suite")
    carve.add_argument("trace", metavar="TRACE")
    carve.add_argument("-o", "--output", required=True, metavar="DIR")
    carve.add_argument("--max-mb", type=float, default=None, help="size budget for the suite's data")
    _add_target_options(carve)

    check = commands.add_parser("compile", help="compile every op for a target without running it")
    check.add_argument("trace", metavar="TRACE")
    _add_target_options(check)
    check.add_argument("--json", action="store_true")
    return parser


def _quiet_libraries() -> None:
    """torch.export and transformers warn at length on stderr; the CLI speaks for itself."""
    import logging
    import warnings

    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    for name in ("torch", "torch.export", "torch.fx", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    _quiet_libraries()
    out, err = make_console(sys.stdout), make_console(sys.stderr)
    try:
        handler = _HANDLERS[args.command]
        return handler(args, out, err) or 0
    except TapmlError as exc:
        error_line(str(exc), err)
        return 1
    except KeyboardInterrupt:
        error_line("interrupted", err)
        return 130


def _bar(args) -> bool | None:
    """No progress bar under --json (scripts read stdout; keep stderr quiet too); else on a terminal."""
    return False if getattr(args, "json", False) else None


def _record(args, out, err) -> int:
    with progress("recording", err) as report:
        result = record(args.model, args.output, source=args.source, inputs_npz=args.inputs, seed=args.seed,
                        compression=None if args.compression == "none" else args.compression,
                        progress=report, window=args.window, max_bytes=args.max_bytes)
    render(result, out)
    return 0


def _info(args, out, err) -> int:
    info = trace_info(args.trace)
    if args.json:
        print(json.dumps(info))
    else:
        render(TraceSummary.from_info(info), out)
    return 0


def _open_session(args):
    """The session of a subcommand's trace and target options: one TargetSpec, nothing dropped."""
    return Session.open(args.trace, TargetSpec.from_args(args))


def _bisect(args, out, err) -> int:
    with _open_session(args) as session:
        with progress("bisecting", err, show=_bar(args)) as report:
            result = session.bisect(sweep=not args.no_sweep, progress=report)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        render(result, out)
    return 0


def _dump(args, out, err) -> int:
    with _open_session(args) as session:
        result = dump_op(session, args.op, args.output, command=" ".join(["tapml-dbg"] + args.argv))
    render(result, out)
    return 0


def _carve(args, out, err) -> int:
    with _open_session(args) as session:
        with progress("carving", err) as report:
            result = carve(session, args.output, max_mb=args.max_mb, progress=report)
    render(result, out)
    return 0


def _compile(args, out, err) -> int:
    with _open_session(args) as session:
        with progress("compiling", err, show=_bar(args)) as report:
            result = session.compile_all(progress=report)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        render(result, out)
    return 0


def _replay(args, out, err) -> int:
    return run_replay(args)


_HANDLERS = {"record": _record, "info": _info, "bisect": _bisect, "dump": _dump, "carve": _carve,
             "compile": _compile, "replay": _replay}


if __name__ == "__main__":
    sys.exit(main())
