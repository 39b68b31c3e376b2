"""The REPL's one command table and its handlers.

Each `Command` carries its name, aliases, usage line, help text, what to complete for each
argument, and a handler `handler(ctx, args) -> result`. Handlers call the engine and return a
result object (see `results.py`); they never print. `help`, the completer and the
unknown-command hint are all generated from `COMMANDS`. The commands the CLI has too are the
entries of the one table of commands (`tapml_dbg.api.COMMANDS` with a `repl_help`): their usage,
help and completion come from it, and so does their handler, the entry's API method on this
session, unless the REPL's words need one of their own (`run OPS`, `dump OP DIR`).

The execution model (step / next / continue, breakpoints, divergence stops) is the engine's:
see `tapml_dbg.engine.stops`; these handlers only call it. docs/repl.md documents it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import shlex
from dataclasses import dataclass, field, replace
from typing import Callable

from tapml_dbg.api import COMMANDS as TABLE, Replay, find_command
from tapml_dbg.api import Command as Entry
from tapml_dbg.engine.generation import free_running, teacher_forced, trace_generation
from tapml_dbg.engine.kept import KEEP_NONE, kept_text, parse_kept, with_node_groups
from tapml_dbg.engine.mixed import parse_offload, spans_text
from tapml_dbg.engine.report import error_points, first_divergent
from tapml_dbg.engine.session import Session
from tapml_dbg.engine.stops import BreakKind, Debugger
from tapml_dbg.errors import TapmlError, UsageError
from tapml_dbg.judge.compare import DEFAULT_TOLERANCES, PolicyKind, Tolerance, TolerancePolicy
from tapml_dbg.judge.verdict import PROPAGATED, Mode
from tapml_dbg.model.select import INDEX_MARK, OP, RANGE, STEP, is_index, is_positional
from tapml_dbg.model.units import build_unit
from tapml_dbg.trace.inspect import trace_info
from tapml_dbg.ui.repl import results as R
from tapml_dbg.ui.repl.parsing import ArgError, format_slice, parse_float, parse_int, parse_slice
from tapml_dbg.ui import verbs

OPS_PAGE = 200  # `ops` shows at most this many rows; narrow with a pattern or a range
UNKNOWN_COMMAND_CUTOFF = 0.6  # difflib similarity needed to suggest a command for a typo
TOL_DTYPES = ("float16", "bfloat16", "float32", "float64")
GLOB_CHARS = "*?["  # an `ops` pattern holding one of these is a glob, else a substring
TOKENS_FREE = "free"  # `tokens free`: the target fed its own tokens


# --------------------------------------------------------------------------- plumbing
@dataclass
class Context:
    """What a handler may touch: the engine (session and debugger), a progress factory, how we started."""

    session: Session
    debugger: Debugger  # the engine's stepping, breakpoints and verdict mode
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
    return spans_text(session.replay.offload, len(session.ops))


# --------------------------------------------------------------------------- handlers
def cmd_help(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    if not args:
        return R.HelpResult(COMMANDS)
    return R.HelpResult(COMMANDS, lookup(args[0]))


def cmd_info(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    session = ctx.session
    info = trace_info(session.reader.path)
    info.pop("ops", None)
    policy = session.verdicts.policy
    tolerance = ", ".join(f"{dtype} rtol={tol.rtol:g} atol={tol.atol:g}" for dtype, tol in policy.by_dtype.items())
    tolerance += f"; propagated x{policy.propagated_factor:g}"
    tolerance = f"rule {policy.kind}" + ("" if session.reference.available else " (no source graph: fixed)") + \
        f"; fixed table: {tolerance}"
    if policy.by_op:
        tolerance += f"; {len(policy.by_op)} op override(s)"
    spec = session.spec
    remote = spec.rpc or (f"tracker {spec.tracker} key {spec.key}" if spec.tracker else "local")
    remote += f", {session.lanes.size} lane{'s' if session.lanes.size > 1 else ''}"
    return R.InfoResult(trace=info, target=session.target, remote=remote, transform=spec.transform or "none",
                        mode=ctx.debugger.mode, position=ctx.debugger.position, ops=len(session.ops),
                        offload=offload_summary(session), breakpoints=len(ctx.debugger.breakpoints),
                        tolerance=tolerance)


def cmd_ops(ctx: Context, args: list[str]):
    session = ctx.session
    query = " ".join(args).strip()
    if not query:
        indices = list(range(len(session.ops)))
    elif is_positional(query):  # `12`, `-1`, `3:5`, `0:5,9`, `@2`: a selector, by the one set of rules
        indices = session.resolve_ops(query)
    else:
        indices = _search_ops(session, query)
    rows = [R.OpRow(session.ops[i], i in session.replay.on_target, i == ctx.debugger.position, ctx.debugger.seen.get(i))
            for i in indices[:OPS_PAGE]]
    return R.OpsResult(rows, len(indices), query)


def _search_ops(session, query: str) -> list[int]:
    """`ops PATTERN` is a search, not a selector: a glob or substring of name, source op or layer."""
    pattern = query if any(c in query for c in GLOB_CHARS) else f"*{query}*"
    pattern = pattern.lower()
    return [op.index for op in session.ops
            if any(fnmatch.fnmatchcase(field_.lower(), pattern) for field_ in (op.name, op.op, op.layer))]


def cmd_layers(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    session = ctx.session
    rows = []
    for path in session.op_table.layers():
        indices = session.op_table.layer_ops(path)
        rows.append(R.LayerRow(path, path.count("."), min(indices), max(indices), len(indices)))
    return R.LayersResult(rows)


def cmd_where(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    session = ctx.session
    position = ctx.debugger.position
    op = session.ops[position] if position < len(session.ops) else None
    return R.WhereResult(position, len(session.ops), op, ctx.debugger.last, session.where,
                         ctx.debugger.mode, offload_summary(session), len(ctx.debugger.breakpoints),
                         _step_place(session, op))


def _step_place(session, op) -> R.StepPlace | None:
    """Where `op` sits in a generation: its step, the step's kind and positions, its place among the
    step's ops (None outside a generation trace)."""
    info = trace_generation(session)
    if op is None or op.step is None or info is None:
        return None
    in_step = session.op_table.step_ops(op.step)
    recorded = next((step for step in info.steps if step.step == op.step), None)
    return R.StepPlace(op.step, session.op_table.steps()[-1], recorded, in_step.index(op.index), len(in_step))


def cmd_show(ctx: Context, args: list[str]):
    _need(args, 1, 1)
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
            inputs.append(R.InputRow(name, "param", _stored_spec(session.reader.tensors.param_stats, name)))
        elif name in session.input_names:
            inputs.append(R.InputRow(name, "input", _stored_spec(session.reader.tensors.input_stats, name)))
        else:
            inputs.append(R.InputRow(name, "?", ""))
    recorded = op.index in session.recorded
    stats = session.reader.tensors.op_stats(op.index) if recorded else []
    note = session.reader.recorded.op_note(op.index) if recorded else "not recorded"
    return R.ShowResult(op, func.script(), inputs, stats, note, op.index in session.replay.offload,
                        ctx.debugger.seen.get(op.index))


def _stored_spec(stats_of, name: str) -> str:
    try:
        stats = stats_of(name)
    except TapmlError:  # stats are a convenience here; an unreadable one must not break `show`
        return ""
    absmax = stats.get("absmax")
    return f"numel {stats.get('numel', '?')}" + (f", absmax {absmax:.4g}" if isinstance(absmax, (int, float)) else "")


def cmd_boundary(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    session = ctx.session
    if not args:
        return R.OffloadResult("offloaded (running on the target)", offload_summary(session))
    text = args[0]
    if is_index(text):  # K is a count of ops, not an op index: `boundary 26` offloads all 26
        k = int(text.lstrip(INDEX_MARK))
        session.replay.set_boundary(k)
        what = f"ops [0, {k}) run on the target"
    else:
        indices = session.op_table.layer_ops(text)  # UsageError with close matches if not a layer
        k = max(indices) + 1
        session.replay.set_boundary(k)
        what = f"ops [0, {k}) run on the target: everything up to the end of layer {text}"
    ctx.debugger.forget_run()
    return R.OffloadResult(f"boundary {k}: {what}; the rest runs on the source", offload_summary(session))


def cmd_offload(ctx: Context, args: list[str]):
    session = ctx.session
    if not args:
        return R.OffloadResult("offloaded (running on the target)", offload_summary(session))
    _need(args, 2, 2)
    action, text = args
    if action not in ("add", "remove"):
        raise ArgError(f"expected add or remove, not {action!r}")
    indices = session.resolve_ops(text)  # never empty: an empty selection is a UsageError
    before = set(session.replay.offload)
    if action == "add":
        session.replay.add(indices)
        changed, verb, already = len(session.replay.offload - before), "added", "already offloaded"
    else:
        session.replay.remove(indices)
        changed, verb, already = len(before - session.replay.offload), "removed", "not offloaded"
    ctx.debugger.forget_run()
    unchanged = len(indices) - changed
    note = f" ({unchanged} of the {len(indices)} selected were {already})" if unchanged else ""
    return R.OffloadResult(f"{verb} {changed} op(s){note}", offload_summary(session))


def cmd_keep(ctx: Context, args: list[str]):
    """`keep` lists the kept ops; `keep OPS` adds, `keep remove OPS` removes, `keep none` clears."""
    session = ctx.session
    if not args:
        return R.KeepResult("", kept_text(session.ops, session.kept))
    before = set(session.kept)
    if args[0] == "remove":
        _need(args, 2, 2)
        gone = with_node_groups(session.ops, parse_kept(session.op_table, args[1], "keep remove"))  # whole source ops
        session.set_kept(before - gone)
        message = f"removed {len(before - session.kept)} op(s)"
    else:
        _need(args, 1, 1)
        chosen = parse_kept(session.op_table, args[0], "keep")
        session.set_kept(before | set(chosen) if args[0] != KEEP_NONE else set())
        message = (f"kept {len(session.kept - before)} more op(s) on the source" if args[0] != KEEP_NONE else
                   f"nothing kept on the source ({len(before)} op(s) back on the target)")
    ctx.debugger.forget_run()  # target values are gone, so is what diverged
    past = "; `bisect`, `run`, `migrate`, `triage` and `continue` go on past them" if session.kept else ""
    return R.KeepResult(message + past, kept_text(session.ops, session.kept))


# ---- running
def cmd_step(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    count = parse_int(args[0], "N", minimum=1) if args else 1
    with ctx.progress(f"step on {ctx.session.target}") as progress:
        return ctx.debugger.step(count, progress)


def cmd_next(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    with ctx.progress(f"next on {ctx.session.target}") as progress:
        return ctx.debugger.next(progress)


def cmd_continue(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    with ctx.progress(f"continue on {ctx.session.target}") as progress:
        return ctx.debugger.continue_(progress)


def cmd_break(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    debugger, session = ctx.debugger, ctx.session
    if not args:
        return R.BreakResult(list(debugger.breakpoints), "" if debugger.breakpoints else "no breakpoints")
    text = args[0]
    if text in (BreakKind.NAN, BreakKind.DIVERGE):
        bp = debugger.add_breakpoint(BreakKind(text), text)
    elif (kind := _op_or_layer(session, text)) == OP:
        op = session.resolve(text)
        bp = debugger.add_breakpoint(BreakKind.OP, op.name, frozenset({op.index}))
    elif kind == STEP:  # `@2`, `@2/model.layers.1`: after any of its ops
        selection = session.op_table.select(text)
        bp = debugger.add_breakpoint(BreakKind.STEP, selection.label, frozenset(selection.indices))
    else:
        bp = debugger.add_breakpoint(BreakKind.LAYER, text, frozenset(session.op_table.layer_ops(text)))
    return R.BreakResult([bp], f"breakpoint {bp.number}: {bp.describe()}")


def _op_or_layer(session, text: str) -> str:
    """OP, LAYER or STEP, by the selector rules; a breakpoint on a range is refused."""
    kind = session.op_table.select(text).kind
    if kind == RANGE:
        raise ArgError(f"break takes one op or a layer, not the range {text!r}; set one breakpoint per op")
    return kind


def cmd_delete(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    number = parse_int(args[0].lstrip("#"), "N", minimum=1) if args else None
    gone = ctx.debugger.delete_breakpoint(number)
    if number is not None and not gone:
        raise ArgError(f"no breakpoint {number}; `break` lists them")
    return R.Message(f"deleted {len(gone)} breakpoint(s)")


def cmd_bisect(ctx: Context, args: list[str]):
    sweep = not verbs.parse(find_command("bisect"), args)["no_sweep"]
    with ctx.progress(f"bisect on {ctx.session.target}") as progress:
        return R.BisectDone(ctx.session.bisect(sweep=sweep, progress=progress))


def cmd_run(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    session = ctx.session
    offload = parse_offload(session.op_table, args[0]) if args else None  # default: the offload set
    with ctx.progress(f"mixed run on {session.target}") as progress:
        return session.run_mixed(offload, progress=progress)


def cmd_tokens(ctx: Context, args: list[str]):
    """A generation trace's tokens on the target beside the source's (engine/generation.py)."""
    _need(args, 0, 1)
    if args and args[0] != TOKENS_FREE:
        raise ArgError(f"expected `{TOKENS_FREE}` or nothing, not {args[0]!r}")
    run = free_running if args else teacher_forced
    with ctx.progress(f"tokens on {ctx.session.target}"):
        return run(ctx.session)


def cmd_plot(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    session = ctx.session
    indices = session.resolve_ops(args[0]) if args else list(range(len(session.ops)))
    with ctx.progress(f"plot on {session.target}") as progress:  # values flow from op 0: run up to the range's end
        upstream = error_points(session, list(range(indices[-1] + 1)), progress)
    shown = set(indices)
    return R.PlotResult([p for p in upstream if p.index in shown], first_divergent(upstream, session.ops),
                        session.where)


def cmd_compare(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    session = ctx.session
    if args:
        op = session.resolve(args[0])
    elif ctx.debugger.last is not None:
        op = session.ops[ctx.debugger.last.index]
    else:
        raise ArgError("which op? nothing has run yet")
    with ctx.progress(f"compare #{op.index} on {session.target}"):
        step = ctx.debugger.compare(op.index)
        # a failing verdict is run once more: a nondeterministic kernel is told from a wrong one
        step.isolated = session.verdicts.explain(step.isolated) if step.isolated is not None else None
        step.propagated = session.verdicts.explain(step.propagated) if step.propagated is not None else None
    return R.CompareResult(step, op, op.index in session.replay.offload)


def cmd_print(ctx: Context, args: list[str]):
    _need(args, 1)
    session, mode = ctx.session, ctx.debugger.mode
    op = session.resolve(args[0])
    index = parse_slice("".join(args[1:])) if len(args) > 1 else ()
    sources = session.source_values(op.index)
    with ctx.progress(f"print #{op.index} on {session.target}"):
        targets = _target_value(session, op.index, mode)
    note = ""
    if targets is None:
        verdict = session.verdicts.propagated(op.index) if mode == PROPAGATED else session.isolated(op.index)
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
    return R.PrintResult(op, mode, format_slice(index) if index else "", outputs, op.index in session.replay.offload)


def _target_value(session, index: int, mode: str):
    """The op's target value in `mode`, the one its verdict compared (None: the run failed)."""
    return session.verdicts.propagated_value(index)[1] if mode == PROPAGATED else session.isolated_verdicts.value(index)


def cmd_tol(ctx: Context, args: list[str]):
    session = ctx.session
    policy: TolerancePolicy = session.verdicts.policy
    if not args:
        return R.TolResult(policy.to_json())
    head = args[0]
    if head == "reset":
        _need(args, 1, 1)
        fresh = TolerancePolicy()
        policy = replace(policy, by_dtype=fresh.by_dtype, by_op=fresh.by_op, propagated_factor=fresh.propagated_factor,
                         kind=fresh.kind)
        message = "tolerances back to the defaults"
    elif head in tuple(PolicyKind) and head != PolicyKind.EXACT:
        _need(args, 1, 1)
        policy = replace(policy, kind=PolicyKind(head))
        message = (f"rule {head}: " + ("every output against the recorded source value with the table's rtol/atol"
                                       if head == PolicyKind.FIXED else
                                       "against the float64 reference and the source's own error"))
    elif head == "propagated":
        _need(args, 2, 2)
        factor = parse_float(args[1], "FACTOR", positive=True)
        _refuse_ignored(session, "propagated_factor", f"tol propagated {args[1]}")
        policy = replace(policy, propagated_factor=factor)
        message = f"propagated verdicts use {policy.propagated_factor:g}x the isolated tolerance"
    elif head == "op":
        _need(args, 3, 4)
        op = session.resolve(args[1])
        by_op = dict(policy.by_op)
        if args[2] in ("clear", "off"):
            _need(args, 3, 3)
            by_op.pop(op.name, None)
            message = f"op #{op.index} {op.name} uses its dtype's tolerance again"
        else:
            rtol = parse_float(args[2], "RTOL")
            dtype = op.outputs[0].dtype if op.outputs else "float32"
            atol = parse_float(args[3], "ATOL") if len(args) > 3 else policy.for_value(dtype, op.name).atol
            by_op[op.name] = Tolerance(rtol, atol)
            message = f"op #{op.index} {op.name}: rtol={rtol:g} atol={atol:g}"
        policy = replace(policy, by_op=by_op)
    elif head in TOL_DTYPES:
        _need(args, 2, 3)
        rtol = parse_float(args[1], "RTOL")
        current = policy.by_dtype.get(head, DEFAULT_TOLERANCES.get(head))
        atol = parse_float(args[2], "ATOL") if len(args) > 2 else current.atol
        _refuse_ignored(session, "by_dtype", " ".join(["tol", *args]))
        policy = replace(policy, by_dtype={**policy.by_dtype, head: Tolerance(rtol, atol)})
        message = f"{head}: rtol={rtol:g} atol={atol:g}"
    else:
        raise ArgError(f"expected a dtype ({', '.join(TOL_DTYPES)}), op, propagated, fixed, noise-floor or "
                       f"reset; not {head!r}")
    session.verdicts.set_policy(policy)  # the cached verdicts were judged by the old one
    return R.TolResult(policy.to_json(), message + " (verdicts from now on; `reset` to re-run from op 0)")


IGNORED_SETTINGS = {  # a fixed-rule setting the noise floor ignores: why, and how to make it count
    "by_dtype": ("judges every op that has a float64 reference against it, not by a dtype's rtol/atol",
                 "`tol fixed` first to judge by the table, or `tol op OP RTOL` for one op"),
    "propagated_factor": ("has its own propagated floor (docs/tolerance.md)",
                          "`tol fixed` first to judge by the table and its propagated factor"),
}


def _refuse_ignored(session: Session, setting: str, typed: str) -> None:
    """A setting the active rule ignores is refused, saying how to make it count."""
    if session.verdicts.policy.ignores(setting, session.reference.available):
        why, instead = IGNORED_SETTINGS[setting]
        raise UsageError(f"`{typed}` changes nothing: the noise-floor rule {why}; {instead}")


def cmd_mode(ctx: Context, args: list[str]):
    _need(args, 0, 1)
    if not args:
        return R.Message(f"mode {ctx.debugger.mode}: the {ctx.debugger.mode} verdict decides divergence stops")
    if args[0] not in tuple(Mode):
        raise ArgError(f"expected isolated or propagated, not {args[0]!r}")
    ctx.debugger.mode = Mode(args[0])
    return R.Message(f"mode {args[0]}: the {args[0]} verdict decides divergence stops")


def cmd_dump(ctx: Context, args: list[str]):
    _need(args, 2, 2)
    ops = args[0] if ":" in args[0] else None  # a range `a:b`: those ops as one unit (dump --ops)
    op = ctx.session.ops[ctx.session.resolve_ops(ops)[-1]] if ops else ctx.session.resolve(args[0])
    launch = ctx.launch
    parts = ["tapml-dbg", "dump", str(launch.get("trace", ctx.session.reader.path)), *(("--ops", ops) if ops else
             ("--op", op.name)), "-o", args[1], "--target", ctx.session.target]
    spec = ctx.session.spec
    for option, value in (("--rpc", spec.rpc), ("--tracker", spec.tracker), ("--key", spec.key),
                          ("--transform", spec.transform)):
        if value:
            parts += [option, str(value)]
    command = " ".join(shlex.quote(p) for p in parts)
    with ctx.progress(f"dump #{op.index}"):
        result = Replay(ctx.session).dump(op.name, args[1], ops=ops, command=command)
    return R.DumpDone(result)


def cmd_reset(ctx: Context, args: list[str]):
    _need(args, 0, 0)
    ctx.debugger.reset()
    return R.Message("back to op 0 with every op offloaded; breakpoints, mode and tolerances kept")


def cmd_quit(ctx: Context, args: list[str]):
    return R.Quit()


def _tol_completion(previous: list[str]) -> tuple:
    if not previous:
        return TOL_DTYPES + ("op", "propagated", "fixed", "noise-floor", "reset")
    if previous[0] == "op" and len(previous) == 1:
        return ("<op>",)
    if previous[0] == "op" and len(previous) == 2:
        return ("clear",)
    return ()


def _from_table(name: str, handler: Callable | None = None) -> Command:
    """The REPL command of an entry of the table of commands: usage, help and completion from the entry,
    and its handler (`_table_handler`) unless the REPL's words need one of their own."""
    entry = find_command(name)
    return Command(entry.name, (), verbs.usage(entry), entry.repl_help, handler or _table_handler(entry),
                   verbs.completion(entry))


def _table_handler(entry: Entry) -> Callable:
    """The entry's API method on this session, its options parsed from the words after it."""
    def handle(ctx: Context, args: list[str]):
        if not entry.repl_options:
            _need(args, 0, 0)
        values = verbs.parse(entry, args)
        with ctx.progress(f"{entry.name} on {ctx.session.target}") as progress:
            return entry.function(Replay(ctx.session), **entry.params(values), progress=progress)

    return handle


COMMANDS: list[Command] = [
    Command("help", ("h", "?"), "help [CMD]",
            "List the commands, or explain one.", cmd_help, (("<command>",),)),
    Command("info", ("i",), "info",
            "Summarize the trace and this session.\n"
            "Model, source, sizes, target, transform, position, offload set, mode, tolerances.", cmd_info),
    Command("ops", (), "ops [PATTERN|RANGE|@K]",
            "List ops, all or those matching.\n"
            "PATTERN matches the name, source op or layer (substring, or a glob like `add*`); RANGE is\n"
            "`a:b` (b excluded), or `@K` (the ops of generation step K; `@K/LAYER`: that layer's ops in\n"
            "it). `→` marks the next op to run, `T` an offloaded op; `iso/prop` holds the verdicts seen\n"
            "so far.", cmd_ops, (("<op>", "<layer>"),)),
    Command("layers", (), "layers", "List layers (nn.Module paths) with their op ranges.", cmd_layers),
    Command("where", ("w",), "where",
            "Show the next op, the last op run and its verdicts.\n"
            "Also the target, the mode, the breakpoints and the offload set; in a generation trace, the\n"
            "step of the next op (prefill or decode, the positions it adds).", cmd_where),
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
    Command("keep", (), "keep [OPS | remove OPS | none]",
            "Keep ops on the source, to get past a known bug (or one assumed fixed).\n"
            "Kept ops are cut out of the target's units: `bisect`, `run`, `migrate`, `triage` and `continue`\n"
            "go on past them (a search feeds their recorded values on, a mixed run re-executes them on the\n"
            "source). OPS: op selectors (`14,37`, `cumsum`, `30:40`, a layer). Without argument: list them\n"
            "(docs/keep.md).", cmd_keep, (("none", "remove", "<op>", "<layer>"),)),
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
    Command("break", ("b",), "break [OP|LAYER|@K|nan|diverge]",
            "Set a breakpoint, or list them.\n"
            "Execution stops after OP has run, after any op of LAYER (or of generation step K, or of LAYER\n"
            "in step K), when the target's NaN/Inf pattern differs from the source (`nan`), or at every\n"
            "failing op (`diverge`, inherited failures included, also during `step N`).", cmd_break,
            (("nan", "diverge", "<op>", "<layer>"),)),
    Command("delete", ("d",), "delete [N]", "Delete breakpoint N, or all of them.", cmd_delete,
            (("<breakpoint>",),)),
    _from_table("bisect", cmd_bisect),
    _from_table("run", cmd_run),
    _from_table("migrate"),
    _from_table("triage"),
    Command("tokens", (), "tokens [free]",
            "A generation trace's tokens: the target's beside the source's, step by step.\n"
            "Teacher-forced (default): every op chained on the target with its own KV cache, each step fed\n"
            "the source's token; each step's verdict (`same`, `drift`: the target's token is in the\n"
            "source's top-k, `bug`: it is not), KL and logits error. `tokens free`: the target fed its\n"
            "own tokens, what its user sees (docs/generation.md).", cmd_tokens, ((TOKENS_FREE,),)),
    Command("plot", (), "plot [RANGE|LAYER]",
            "Every op's error along the model, as a terminal chart.\n"
            "One column per op (or per few ops on a narrow terminal), log scale: the isolated error\n"
            "(`•`, `✖` when it fails) and the propagated one (`○`, `⊗` when it fails) with every op on the\n"
            "target, each op's tolerance (`┄`), and the first divergence (`▼`), by the rule `continue`\n"
            "stops at. The same data as `tapml-dbg report`; for when the browser is far away.",
            cmd_plot, (("<layer>",),)),
    Command("compare", ("cmp",), "compare [OP]",
            "Both verdicts of an op side by side (default: the last op run).\n"
            "isolated: the op fed recorded inputs (is this kernel wrong?); propagated: fed the target's\n"
            "own upstream values (does the error arrive or grow here?).", cmd_compare, (("<op>",),)),
    Command("print", ("p",), "print OP [SLICE]",
            "Source and target values of an op, with stats.\n"
            "The target value is the current mode's. SLICE is numpy-style (`0,:4`, `...,-1`, `1:8:2`),\n"
            "parsed, never evaluated.", cmd_print, (("<op>",),)),
    Command("tol", (), "tol [DTYPE RTOL [ATOL] | op OP RTOL [ATOL] | op OP clear | propagated FACTOR | fixed | "
                       "noise-floor | reset]",
            "Show or change the tolerance policy.\n"
            "Default rule `noise-floor`: an output fails when its error against a float64 reference of the op\n"
            "exceeds a multiple of the source's own error and an ulp floor (docs/tolerance.md); `tol fixed`\n"
            "judges by the per-dtype table below instead (as traces without a source graph always are).\n"
            "Under it an output passes when max_abs_err <= atol + rtol * absmax(source) and its NaN/Inf pattern\n"
            "matches. DTYPE: float16, bfloat16, float32, float64. `tol op OP ...` overrides one op;\n"
            "`tol propagated F` makes propagated verdicts F times looser.", cmd_tol, _tol_completion),
    Command("mode", (), "mode [isolated|propagated]",
            "Choose the verdict that decides divergence stops.\n"
            "It counts for `continue`, `next` and `break diverge`, and picks the target value `print`\n"
            "shows. Default: propagated.", cmd_mode, (("isolated", "propagated"),)),
    _from_table("dump", cmd_dump),
    Command("reset", (), "reset",
            "Back to op 0, every op offloaded, no target values.\n"
            "Breakpoints, mode and tolerances are kept.", cmd_reset),
    Command("quit", ("q", "exit"), "quit", "Leave the REPL (Ctrl-D does too).", cmd_quit),
]

# the table's other REPL commands (a command added there), before `reset` and `quit`
COMMANDS[-2:-2] = [_from_table(entry.name) for entry in TABLE
                   if entry.repl_help is not None and entry.name not in {command.name for command in COMMANDS}]
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
