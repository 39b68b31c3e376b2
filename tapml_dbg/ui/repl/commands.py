"""The REPL's one command table and its handlers.

Each `Command` carries its name, aliases, usage line, help text, what to complete for each
argument, and a handler `handler(ctx, args) -> result`. Handlers call the engine and return a
result object (see `results.py`); they never print. `help`, the completer and the
unknown-command hint are all generated from `COMMANDS`.

Execution model (documented in docs/repl.md):
- the position is the next op to run; `step`, `next` and `continue` run ops on the target one
  at a time, each with both verdicts (`Session.compare`), and advance;
- a breakpoint stops any of them *after* the op it names has run, so its verdicts are on screen;
- `next` and `continue` also always stop at a new divergence: the first op whose verdict in the
  current `mode` fails and whose failure is not inherited from an upstream op that already
  failed (in propagated mode an op that passes isolated but reads a diverged value is
  "inherited"). `break diverge` stops at every failing op, inherited or not, for every command.
"""

from __future__ import annotations

import contextlib
import fnmatch
import shlex
from dataclasses import dataclass, field
from typing import Callable

from tapml_dbg.judge.compare import DEFAULT_TOLERANCES, Tolerance, TolerancePolicy
from tapml_dbg.errors import TapmlError, UsageError
from tapml_dbg.judge.verdict import PROPAGATED, StepResult
from tapml_dbg.ui.repl import results as R
from tapml_dbg.ui.repl.parsing import ArgError, format_slice, parse_float, parse_int, parse_slice
from tapml_dbg.ui.repl.state import BREAK_DIVERGE, BREAK_LAYER, BREAK_NAN, BREAK_OP, MODES, ReplState

OPS_PAGE = 200  # `ops` shows at most this many rows; narrow with a pattern or a range
UNKNOWN_COMMAND_CUTOFF = 0.6  # difflib similarity needed to suggest a command for a typo
TOL_DTYPES = ("float16", "bfloat16", "float32", "float64")


# --------------------------------------------------------------------------- plumbing
@dataclass
class Context:
    """What a handler may touch: the engine, the REPL state, a progress factory, how we started."""

    session: object  # tapml_dbg.engine.session.Session
    state: ReplState
    # progress(label) is a context manager yielding callback(done, total, note="")
    progress: Callable = field(default=lambda label: contextlib.nullcontext(lambda *a, **k: None))
    launch: dict = field(default_factory=dict)  # trace path and target options, for `dump`


@dataclass(frozen=True)
class Command:
    name: str
    aliases: tuple[str, ...]
    usage: str
    help: str  # first line: the summary shown by `help`; the rest: `help CMD`
    handler: Callable
    # what to complete for each argument position: a tuple of keywords and kinds ("<op>",
    # "<layer>", "<command>", "<path>", "<breakpoint>"), or a function of the previous arguments
    # returning such a tuple
    args: tuple = ()

    @property
    def summary(self) -> str:
        return self.help.strip().splitlines()[0]

    def completion_for(self, previous: list[str]) -> tuple:
        if callable(self.args):
            return tuple(self.args(previous))
        if len(previous) < len(self.args):
            return tuple(self.args[len(previous)])
        return ()


def _need(args: list[str], low: int, high: int | None = None) -> None:
    if len(args) < low:
        raise ArgError("missing argument")
    if high is not None and len(args) > high:
        raise ArgError(f"too many arguments: {' '.join(args[high:])}")


def offload_summary(session) -> str:
    """`0..12, 15..25 (24 of 26 ops)`, or `none`."""
    indices = sorted(session.offload)
    if not indices:
        return f"none (0 of {len(session.ops)} ops)"
    spans, start, prev = [], indices[0], indices[0]
    for index in indices[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        spans.append(f"{start}" if start == prev else f"{start}..{prev}")
        if index is not None:
            start = prev = index
    return f"{', '.join(spans)} ({len(indices)} of {len(session.ops)} ops)"


def _clamp_range(session, indices: list[int]) -> list[int]:
    return [i for i in indices if 0 <= i < len(session.ops)]


def _is_range(text: str) -> bool:
    return ":" in text and all(part.strip().lstrip("#").isdigit() or not part.strip()
                               for part in text.split(":", 1))


def _compare(ctx: Context, index: int) -> StepResult:
    result = ctx.session.compare(index)
    ctx.state.record(result)
    return result


# --------------------------------------------------------------------------- handlers
def cmd_help(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    if not args:
        return R.HelpResult(COMMANDS)
    return R.HelpResult(COMMANDS, lookup(args[0]))


def cmd_info(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    from tapml_dbg.trace.inspect import trace_info

    session = ctx.session
    info = trace_info(session.reader.path)
    info.pop("ops", None)
    policy = session.policy
    tolerance = ", ".join(f"{dtype} rtol={tol.rtol:g} atol={tol.atol:g}" for dtype, tol in policy.by_dtype.items())
    tolerance += f"; propagated x{policy.propagated_factor:g}"
    if policy.by_op:
        tolerance += f"; {len(policy.by_op)} op override(s)"
    remote = session.rpc or (f"tracker {session.tracker} key {session.rpc_key}" if session.tracker else "local")
    return R.InfoResult(trace=info, target=session.target, remote=remote, transform=session.transform or "none",
                        mode=ctx.state.mode, position=session.position, ops=len(session.ops),
                        offload=offload_summary(session), breakpoints=len(ctx.state.breakpoints),
                        tolerance=tolerance)


def cmd_ops(ctx: Context, args: list[str]):
    session = ctx.session
    query = " ".join(args).strip()
    if not query:
        indices = list(range(len(session.ops)))
    elif _is_range(query):
        indices = _clamp_range(session, session.resolve_ops(query))
    elif query.lstrip("#").lstrip("-").isdigit():
        indices = [session.resolve(query).index]
    else:
        pattern = query if any(c in query for c in "*?[") else f"*{query}*"
        pattern = pattern.lower()
        indices = [op.index for op in session.ops
                   if any(fnmatch.fnmatchcase(field_.lower(), pattern) for field_ in (op.name, op.op, op.layer))]
    rows = [R.OpRow(session.ops[i], i in session.offload, i == session.position, ctx.state.results.get(i))
            for i in indices[:OPS_PAGE]]
    return R.OpsResult(rows, len(indices), query)


def cmd_layers(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    session = ctx.session
    rows = []
    for path in session.layers():
        indices = session.layer_ops(path)
        rows.append(R.LayerRow(path, path.count("."), min(indices), max(indices), len(indices)))
    return R.LayersResult(rows)


def cmd_where(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    session = ctx.session
    op = session.ops[session.position] if session.position < len(session.ops) else None
    return R.WhereResult(session.position, len(session.ops), op, ctx.state.last, session.where,
                         ctx.state.mode, offload_summary(session), len(ctx.state.breakpoints))


def cmd_show(ctx: Context, args: list[str]):
    _need(args, 1, 1)
    from tapml_dbg.model.units import build_unit

    session = ctx.session
    op = session.resolve(args[0])
    func, _spec = build_unit(session.main, [op.name], [op.name])
    inputs = []
    for name in op.inputs:
        if name in session.by_name:
            source = session.by_name[name]
            spec = ", ".join(f"{tuple(o.shape)} {o.dtype}" for o in source.outputs[:2])
            inputs.append(R.InputRow(name, f"op #{source.index}", spec))
        elif name in session.param_names:
            inputs.append(R.InputRow(name, "param", _stored_spec(session.reader.param_stats, name)))
        elif name in session.input_names:
            inputs.append(R.InputRow(name, "input", _stored_spec(session.reader.input_stats, name)))
        else:
            inputs.append(R.InputRow(name, "?", ""))
    recorded = op.index in session.recorded
    stats = session.reader.op_stats(op.index) if recorded else []
    note = session.reader.op_note(op.index) if recorded else "not recorded"
    return R.ShowResult(op, func.script(), inputs, stats, note, op.index in session.offload,
                        ctx.state.results.get(op.index))


def _stored_spec(stats_of, name: str) -> str:
    try:
        stats = stats_of(name)
    except TapmlError:  # stats are a convenience here; an unreadable one must not break `show`
        return ""
    absmax = stats.get("absmax")
    return f"numel {stats.get('numel', '?')}" + (f", absmax {absmax:.4g}" if isinstance(absmax, (int, float)) else "")


def _ops_of(session, text: str) -> list[int]:
    indices = _clamp_range(session, session.resolve_ops(text))
    if not indices:
        raise ArgError(f"{text!r} selects no op (ops are 0..{len(session.ops) - 1})")
    return indices


def cmd_boundary(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    session = ctx.session
    if not args:
        return R.OffloadResult("offloaded (running on the target)", offload_summary(session))
    text = args[0]
    if text.lstrip("#").isdigit():
        k = int(text.lstrip("#"))
        session.set_boundary(k)
        what = f"ops [0, {k}) run on the target"
    else:
        indices = session.layer_ops(text)  # UsageError with close matches if not a layer
        k = max(indices) + 1
        session.set_boundary(k)
        what = f"ops [0, {k}) run on the target: everything up to the end of layer {text}"
    ctx.state.forget_run()
    return R.OffloadResult(f"boundary {k}: {what}; the rest runs on the source", offload_summary(session))


def cmd_offload(ctx: Context, args: list[str]):
    session = ctx.session
    if not args:
        return R.OffloadResult("offloaded (running on the target)", offload_summary(session))
    _need(args, 2, 2)
    action, text = args
    if action not in ("add", "remove"):
        raise ArgError(f"expected add or remove, not {action!r}")
    indices = _ops_of(session, text)
    if action == "add":
        session.offload_add(indices)
    else:
        session.offload_remove(indices)
    ctx.state.forget_run()
    verb = "added" if action == "add" else "removed"
    return R.OffloadResult(f"{verb} {len(indices)} op(s)", offload_summary(session))


# ---- running
def _stop_reasons(ctx: Context, result: StepResult, stop_on_divergence: bool) -> tuple[list[str], bool]:
    """Why execution stops after `result` (empty: go on), and whether its failure is inherited."""
    session, state = ctx.session, ctx.state
    op = session.ops[result.index]
    verdict = result.verdict(state.mode)
    failed = verdict is not None and verdict.failed
    upstream_failed = any(name in state.diverged for name in op.inputs)
    isolated_failed = result.isolated is not None and result.isolated.failed
    inherited = failed and state.mode == PROPAGATED and upstream_failed and not isolated_failed
    reasons, diverge_breakpoint = [], False
    for bp in state.breakpoints:
        hit = False
        if bp.kind in (BREAK_OP, BREAK_LAYER):
            hit = result.index in bp.ops
        elif bp.kind == BREAK_NAN:
            hit = any(m.nan_mismatch or m.inf_mismatch for v in (result.isolated, result.propagated)
                      if v is not None for m in v.metrics)
        elif bp.kind == BREAK_DIVERGE:
            hit = failed
        if hit:
            bp.hits += 1
            diverge_breakpoint = diverge_breakpoint or bp.kind == BREAK_DIVERGE
            reasons.append(f"breakpoint {bp.number} ({bp.kind} {bp.spec})" if bp.kind in (BREAK_OP, BREAK_LAYER)
                           else f"breakpoint {bp.number} ({bp.kind})")
    if stop_on_divergence and failed and not inherited and not diverge_breakpoint:
        reasons.append(f"divergence: the {state.mode} verdict failed")
    if result.propagated is not None and result.propagated.failed:
        state.diverged.add(op.name)
    return reasons, inherited


def _run(ctx: Context, command: str, limit: int | None = None, layer_bound: bool = False,
         stop_on_divergence: bool = True, verbose: bool = True) -> R.RunResult:
    session, state = ctx.session, ctx.state
    total_ops = len(session.ops)
    run = R.RunResult(command, state.mode, verbose=verbose)
    if session.position >= total_ops:
        run.at_end = True
        return run
    layer = session.ops[session.position].layer
    if limit is not None:
        planned = min(limit, total_ops - session.position)
    elif layer_bound:
        planned = sum(1 for op in session.ops[session.position:] if op.layer == layer)
    else:
        planned = total_ops - session.position
    with ctx.progress(f"{command} on {session.target}") as progress:
        try:
            while session.position < total_ops:
                if limit is not None and len(run.steps) >= limit:
                    break
                if layer_bound and run.steps and session.ops[session.position].layer != layer:
                    break
                op = session.ops[session.position]
                progress(len(run.steps), planned, f"#{op.index} {op.name}")
                steps = session.step(1)
                if not steps:
                    break
                result = steps[0]
                state.record(result)
                state.last = result
                run.steps.append(result)
                reasons, inherited = _stop_reasons(ctx, result, stop_on_divergence)
                if inherited:
                    run.inherited.add(result.index)
                if reasons:
                    result.breakpoint = "; ".join(reasons)
                    run.reasons = reasons
                    break
        except KeyboardInterrupt:
            run.cancelled = True
    run.at_end = session.position >= total_ops
    run.next_op = session.ops[session.position] if not run.at_end else None
    return run


def cmd_step(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    count = parse_int(args[0], "N", minimum=1) if args else 1
    return _run(ctx, "step", limit=count, stop_on_divergence=False)


def cmd_next(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    return _run(ctx, "next", layer_bound=True)


def cmd_continue(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    return _run(ctx, "continue", verbose=False)


def cmd_break(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    state, session = ctx.state, ctx.session
    if not args:
        return R.BreakResult(list(state.breakpoints), "" if state.breakpoints else "no breakpoints")
    text = args[0]
    if text in (BREAK_NAN, BREAK_DIVERGE):
        bp = state.add_breakpoint(text, text)
    elif text in session.by_name or text.lstrip("#").lstrip("-").isdigit():
        op = session.resolve(text)
        bp = state.add_breakpoint(BREAK_OP, op.name, frozenset({op.index}))
    elif text in session.layers():
        bp = state.add_breakpoint(BREAK_LAYER, text, frozenset(session.layer_ops(text)))
    else:
        raise _no_op_or_layer(session, text)
    return R.BreakResult([bp], f"breakpoint {bp.number}: {bp.describe()}")


def _no_op_or_layer(session, text: str) -> UsageError:
    import difflib

    close = difflib.get_close_matches(text, list(session.by_name) + session.layers(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `ops` and `layers` list them"
    return UsageError(f"no op or layer named {text!r}{hint}")


def cmd_delete(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    number = parse_int(args[0].lstrip("#"), "N", minimum=1) if args else None
    gone = ctx.state.delete_breakpoint(number)
    if number is not None and not gone:
        raise ArgError(f"no breakpoint {number}; `break` lists them")
    return R.Message(f"deleted {len(gone)} breakpoint(s)")


def cmd_bisect(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    sweep = True
    if args:
        if args[0] != "--no-sweep":
            raise ArgError(f"unknown option {args[0]!r}")
        sweep = False
    with ctx.progress(f"bisect on {ctx.session.target}") as progress:
        return ctx.session.bisect(sweep=sweep, progress=progress)


def cmd_compare(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    session = ctx.session
    if args:
        op = session.resolve(args[0])
    elif ctx.state.last is not None:
        op = session.ops[ctx.state.last.index]
    else:
        raise ArgError("which op? nothing has run yet")
    with ctx.progress(f"compare #{op.index} on {session.target}"):
        step = _compare(ctx, op.index)
    return R.CompareResult(step, op, op.index in session.offload)


def cmd_print(ctx: Context, args: list[str]):
    _need(args, 1)
    session, mode = ctx.session, ctx.state.mode
    op = session.resolve(args[0])
    index = parse_slice("".join(args[1:])) if len(args) > 1 else ()
    sources = session.source_values(op.index)
    with ctx.progress(f"print #{op.index} on {session.target}"):
        targets = _target_value(session, op.index, mode)
    note = ""
    if targets is None:
        verdict = session.propagated(op.index) if mode == PROPAGATED else session.isolated(op.index)
        note = f"{verdict.status}: {verdict.message}" if verdict.message else "the target gave no value"
    outputs = []
    for number, source in enumerate(sources):
        target = targets[number] if targets is not None and number < len(targets) else None
        try:
            source_part = source[index] if index else source
            target_part = target[index] if (index and target is not None) else target
        except (IndexError, TypeError) as exc:
            raise ArgError(f"slice [{format_slice(index)}] does not fit shape {tuple(source.shape)}: {exc}") from None
        outputs.append(R.PrintedOutput(number, source_part, target_part, note))
    return R.PrintResult(op, mode, format_slice(index) if index else "", outputs, op.index in session.offload)


def _target_value(session, index: int, mode: str):
    """The op's target value in `mode`, the one its verdict compared."""
    return session.target_output(index, mode)


def cmd_tol(ctx: Context, args: list[str]):
    session = ctx.session
    policy: TolerancePolicy = session.policy
    if not args:
        return R.TolResult(policy.to_json())
    head = args[0]
    if head == "reset":
        _need(args, 1, 1)
        fresh = TolerancePolicy()
        policy.by_dtype, policy.by_op, policy.propagated_factor = fresh.by_dtype, fresh.by_op, fresh.propagated_factor
        message = "tolerances back to the defaults"
    elif head == "propagated":
        _need(args, 2, 2)
        policy.propagated_factor = parse_float(args[1], "FACTOR", positive=True)
        message = f"propagated verdicts use {policy.propagated_factor:g}x the isolated tolerance"
    elif head == "op":
        _need(args, 3, 4)
        op = session.resolve(args[1])
        if args[2] in ("clear", "off"):
            _need(args, 3, 3)
            policy.by_op.pop(op.name, None)
            message = f"op #{op.index} {op.name} uses its dtype's tolerance again"
        else:
            rtol = parse_float(args[2], "RTOL")
            dtype = op.outputs[0].dtype if op.outputs else "float32"
            atol = parse_float(args[3], "ATOL") if len(args) > 3 else policy.for_value(dtype, op.name).atol
            policy.by_op[op.name] = Tolerance(rtol, atol)
            message = f"op #{op.index} {op.name}: rtol={rtol:g} atol={atol:g}"
    elif head in TOL_DTYPES:
        _need(args, 2, 3)
        rtol = parse_float(args[1], "RTOL")
        current = policy.by_dtype.get(head, DEFAULT_TOLERANCES.get(head))
        atol = parse_float(args[2], "ATOL") if len(args) > 2 else current.atol
        policy.by_dtype[head] = Tolerance(rtol, atol)
        message = f"{head}: rtol={rtol:g} atol={atol:g}"
    else:
        raise ArgError(f"expected a dtype ({', '.join(TOL_DTYPES)}), op, propagated or reset; not {head!r}")
    session.invalidate_verdicts()
    return R.TolResult(policy.to_json(), message + " (verdicts from now on; `reset` to re-run from op 0)")


def cmd_mode(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    if not args:
        return R.Message(f"mode {ctx.state.mode}: the {ctx.state.mode} verdict decides divergence stops")
    if args[0] not in MODES:
        raise ArgError(f"expected isolated or propagated, not {args[0]!r}")
    ctx.state.mode = args[0]
    return R.Message(f"mode {args[0]}: the {args[0]} verdict decides divergence stops")


def cmd_dump(ctx: Context, args: list[str]):
    _need(args, 2, 2)
    op = ctx.session.resolve(args[0])
    try:
        from tapml_dbg.repro import dump_op
    except ImportError as exc:
        raise UsageError(f"dump is not available: tapml_dbg.repro cannot be imported ({exc})") from None
    launch = ctx.launch
    parts = ["tapml-dbg", "dump", str(launch.get("trace", ctx.session.reader.path)), "--op", op.name, "-o", args[1],
             "--target", ctx.session.target]
    for option, key in (("--rpc", "rpc"), ("--tracker", "tracker"), ("--key", "key"), ("--transform", "transform")):
        if launch.get(key):
            parts += [option, str(launch[key])]
    command = " ".join(shlex.quote(p) for p in parts)
    with ctx.progress(f"dump #{op.index}"):
        result = dump_op(ctx.session, op.name, args[1], command=command)
    return R.DumpDone(result)


def cmd_reset(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    ctx.session.reset()
    ctx.state.forget_run()
    return R.Message("back to op 0 with every op offloaded; breakpoints, mode and tolerances kept")


def cmd_quit(ctx: Context, args: list[str]):
    return R.Quit()


def _tol_completion(previous: list[str]) -> tuple:
    if not previous:
        return TOL_DTYPES + ("op", "propagated", "reset")
    if previous[0] == "op" and len(previous) == 1:
        return ("<op>",)
    if previous[0] == "op" and len(previous) == 2:
        return ("clear",)
    return ()


COMMANDS: list[Command] = [
    Command("help", ("h", "?"), "help [CMD]",
            "List the commands, or explain one.", cmd_help, (("<command>",),)),
    Command("info", ("i",), "info",
            "Summarize the trace and this session.\n"
            "Model, source, sizes, target, transform, position, offload set, mode, tolerances.", cmd_info),
    Command("ops", (), "ops [PATTERN|RANGE]",
            "List ops, all or those matching.\n"
            "PATTERN matches the name, source op or layer (substring, or a glob like `add*`); RANGE is\n"
            "`a:b` (b excluded). `→` marks the next op to run, `T` an offloaded op; `iso/prop` holds\n"
            "the verdicts seen so far.", cmd_ops, (("<op>", "<layer>"),)),
    Command("layers", (), "layers", "List layers (nn.Module paths) with their op ranges.", cmd_layers),
    Command("where", ("w",), "where",
            "Show the next op, the last op run and its verdicts.\n"
            "Also the target, the mode, the breakpoints and the offload set.", cmd_where),
    Command("show", (), "show OP",
            "Show an op: Relax IR, source op, layer, inputs, stats.\n"
            "OP is an index (`12`, `#12`, `-1`) or a name. The IR is the op alone, as the target compiles it.",
            cmd_show, (("<op>",),)),
    Command("boundary", (), "boundary [K|LAYER]",
            "Offload ops [0, K) to the target, the rest to the source.\n"
            "With LAYER: offload everything up to the END of that layer (its last op included), so\n"
            "`boundary blocks.1` runs blocks.0 and blocks.1 on the target. Without argument: show the\n"
            "offload set. Target values computed so far are dropped.", cmd_boundary, (("<layer>",),)),
    Command("offload", (), "offload [add|remove OP|LAYER|RANGE]",
            "Add ops to or remove ops from the offload set.\n"
            "The offload set is the ops that run on the target; the others feed recorded source values.\n"
            "Without argument: show it.", cmd_offload, (("add", "remove"), ("<op>", "<layer>"))),
    Command("step", ("s",), "step [N]",
            "Run the next N ops (default 1), one verdict line each.\n"
            "Each op gets both verdicts (isolated and propagated). Stops early only at a breakpoint.",
            cmd_step),
    Command("next", ("n",), "next",
            "Run to the end of the current layer.\n"
            "Runs ops while they belong to the layer of the next op; stops early at a breakpoint or a\n"
            "new divergence.", cmd_next),
    Command("continue", ("c", "cont"), "continue",
            "Run until a breakpoint, a new divergence or the end.\n"
            "It always stops at a new divergence, like a debugger stopping on an exception: an op\n"
            "whose verdict in the current `mode` fails and, in propagated mode, whose failure is not\n"
            "inherited (an op that passes isolated but reads an already diverged value is inherited).\n"
            "Prints a summary, the failing ops and the op it stopped at.", cmd_continue),
    Command("break", ("b",), "break [OP|LAYER|nan|diverge]",
            "Set a breakpoint, or list them.\n"
            "Execution stops after OP has run, after any op of LAYER, when the target's NaN/Inf pattern\n"
            "differs from the source (`nan`), or at every failing op (`diverge`, inherited failures\n"
            "included, also during `step N`).", cmd_break, (("nan", "diverge", "<op>", "<layer>"),)),
    Command("delete", ("d",), "delete [N]", "Delete breakpoint N, or all of them.", cmd_delete,
            (("<breakpoint>",),)),
    Command("bisect", (), "bisect [--no-sweep]",
            "Find the first divergent op.\n"
            "A propagated search over prefixes, an isolated confirmation, and an isolated sweep of the\n"
            "ops before it that catches faults which wash out (skip it with --no-sweep). Ctrl-C cancels.",
            cmd_bisect, (("--no-sweep",),)),
    Command("compare", ("cmp",), "compare [OP]",
            "Both verdicts of an op side by side (default: the last op run).\n"
            "isolated: the op fed recorded inputs (is this kernel wrong?); propagated: fed the target's\n"
            "own upstream values (does the error arrive or grow here?).", cmd_compare, (("<op>",),)),
    Command("print", ("p",), "print OP [SLICE]",
            "Source and target values of an op, with stats.\n"
            "The target value is the current mode's. SLICE is numpy-style (`0,:4`, `...,-1`, `1:8:2`),\n"
            "parsed, never evaluated.", cmd_print, (("<op>",),)),
    Command("tol", (), "tol [DTYPE RTOL [ATOL] | op OP RTOL [ATOL] | op OP clear | propagated FACTOR | reset]",
            "Show or change the tolerance policy.\n"
            "An output passes when max_abs_err <= atol + rtol * absmax(source) and its NaN/Inf pattern\n"
            "matches. DTYPE: float16, bfloat16, float32, float64. `tol op OP ...` overrides one op;\n"
            "`tol propagated F` makes propagated verdicts F times looser.", cmd_tol, _tol_completion),
    Command("mode", (), "mode [isolated|propagated]",
            "Choose the verdict that decides divergence stops.\n"
            "It counts for `continue`, `next` and `break diverge`, and picks the target value `print`\n"
            "shows. Default: propagated.", cmd_mode, (("isolated", "propagated"),)),
    Command("dump", (), "dump OP DIR",
            "Write an op as a standalone repro into DIR.\n"
            "The repro needs only tvm and numpy.", cmd_dump, (("<op>",), ("<path>",))),
    Command("reset", (), "reset",
            "Back to op 0, every op offloaded, no target values.\n"
            "Breakpoints, mode and tolerances are kept.", cmd_reset),
    Command("quit", ("q", "exit"), "quit", "Leave the REPL (Ctrl-D does too).", cmd_quit),
]

_BY_NAME = {c.name: c for c in COMMANDS}
_BY_ALIAS = {alias: c for c in COMMANDS for alias in c.aliases}


def lookup(word: str) -> Command:
    """A command by name or alias; an unknown word raises with the closest command named."""
    command = _BY_NAME.get(word) or _BY_ALIAS.get(word)
    if command is not None:
        return command
    raise UnknownCommand(word)


class UnknownCommand(UsageError):
    def __init__(self, word: str):
        import difflib

        names = list(_BY_NAME) + list(_BY_ALIAS)
        close = difflib.get_close_matches(word, names, n=1, cutoff=UNKNOWN_COMMAND_CUTOFF)
        self.word = word
        self.suggestion = (_BY_ALIAS.get(close[0]) or _BY_NAME[close[0]]).name if close else None
        hint = f"; did you mean `{self.suggestion}`?" if self.suggestion else "; `help` lists the commands"
        super().__init__(f"unknown command {word!r}{hint}")


def command_names() -> list[str]:
    return [c.name for c in COMMANDS]

