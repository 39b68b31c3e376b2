"""Kept ops: getting past a known bug. An op the user keeps on the source (a bug already found, or
one assumed fixed) is cut out of the target's units, so that `bisect`, `run`, `migrate`, `triage`
and the REPL's stepping go on past it (`--keep OPS`, the REPL's `keep OPS`; docs/keep.md).

The session owns the kept set (`Session.kept`, like the offload set); these are its rules:

- a kept op never runs on the target and gets no verdict that can be named: no culprit, no
  triage cause, no stop of `continue`; a kept op is kept with every binding of its source op
  (the helper bindings of one FX node run where their node runs, as in mixed runs);
- target units are cut around it: a chain never holds its kernel; a fused unit (a bisect probe,
  the report's propagated segments, a fused culprit's unit, a mixed run's unit) never holds it:
  its value enters the unit as an input;
- isolated verdicts of every other op are unchanged (they are fed recorded inputs anyway);
- what the ops after it are fed instead of its target value:
  * in a mixed run (`run`, `migrate`) the source runner re-executes it on the host fed the run's
    values (the target's where its producers ran there), as every op off the offload set is:
    a mixed run is the model as it would deploy with that op on the host;
  * in a search (bisect's chain and fused probes, the report's and triage's propagated chain, the
    REPL's propagated replay) its **recorded** value, cast to the declared type where the import
    changed it (what a consumer compiled for the target expects). A search only goes past an op
    while every value before it passes against its recording, so the kept op's inputs agree with
    the recording and a re-execution would give its recorded value to within the source's own
    noise; the recording keeps the chain in one worker (no torch there, no round trip to the host
    per kept op), and it is what `offload remove` has always fed downstream in the propagated
    replay. A propagated verdict downstream of a kept op therefore says what the target does to
    right values, not what it does to the kept op's error.

Host-only ops (model/host_only.py: ops TVM cannot import, placeholders in the graph) are kept always:
`Session.kept` holds them whatever `--keep` says, and results list them apart (`host_only`), as
findings, never among the user's kept ops (docs/host-only-ops.md).
"""

from __future__ import annotations

from tapml_dbg.errors import UsageError
from tapml_dbg.judge.verdict import Mode, Status, Verdict, WrongClass
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.model.host_only import HostOnlyOp, host_only_names, host_only_text
from tapml_dbg.model.select import OpTable
from tapml_dbg.trace.schema import META_HOST_ONLY

KEEP_NONE = "none"  # `--keep none` / `keep none`: nothing kept


def parse_kept(table: OpTable, text: str, what: str = "--keep") -> list[int]:
    """`--keep OPS`: op selectors as everywhere (`14,37`, `cumsum`, `a:b`, a layer), or `none`
    (`what`: how the user wrote the option, for the one-line error)."""
    spec = str(text).strip()
    if spec == KEEP_NONE:
        return []
    if not spec:
        raise UsageError(f"empty {what}: give ops (`14,37`, `cumsum`, `30:40`), a layer, or `{KEEP_NONE}`")
    try:
        return table.select_many(spec)
    except UsageError as exc:
        raise UsageError(f"{what} {spec}: {exc}") from None


def with_node_groups(ops: list[OpInfo], indices) -> frozenset[int]:
    """`indices` and every other binding of their source ops (ops of one FX node go together)."""
    chosen = set(indices)
    nodes = {ops[i].fx_node for i in chosen if ops[i].fx_node}
    chosen.update(op.index for op in ops if op.fx_node and op.fx_node in nodes)
    return frozenset(chosen)


def kept_text(ops: list[OpInfo], kept) -> str:
    """`#14 cumsum, #37 eq` (the kept ops, in order)."""
    return ", ".join(f"#{i} {ops[i].name}" for i in sorted(kept))


def kept_note(ops: list[OpInfo], kept, mixed: bool = False) -> str:
    """The note a result carries when ops were kept on the source (`mixed`: a mixed run's, where the
    source re-executes them; a search feeds their recorded values on)."""
    fed = ("re-executed on the source, fed the run's values" if mixed else
           "their recorded values feed the ops after them")
    return f"kept on the source: {kept_text(ops, kept)} (cut out of the target's units; {fed})"


def segments(indices: list[int], kept) -> list[list[int]]:
    """`indices` (in order) without the kept ops, cut into runs at each kept op."""
    runs: list[list[int]] = [[]]
    for index in indices:
        if index in kept:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(index)
    return [run for run in runs if run]


def kept_selector(indices) -> str:
    """The shortest `--keep` text for `indices`: `14,35:38` (a:b, b excluded, for three or more in a row)."""
    ordered = sorted(set(indices))
    parts, start = [], 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ordered[start]}:{ordered[end] + 1}")
        else:
            parts += [str(index) for index in ordered[start:end + 1]]
        start = end + 1
    return ",".join(parts)


_BLOCKING = (Status.COMPILE_ERROR, Status.CRASH, Status.TIMEOUT, Status.ERROR)


def blocks_target(culprit) -> bool:
    """A culprit (`engine.results.Culprit`) that no unit holding it gets past on the target (it does not
    build or run) or whose type the import changed: what to keep on the source first, to go on."""
    return culprit.verdict in _BLOCKING or culprit.wrong == WrongClass.TYPE


def host_only_of(main, ops: list[OpInfo], meta: dict) -> list[HostOnlyOp]:
    """The trace's host-only ops, from its graph (the placeholders); their reasons from its meta."""
    names = set(host_only_names(main))
    reasons = {entry.get("name"): entry.get("reason") for entry in meta.get(META_HOST_ONLY) or []
               if isinstance(entry, dict)}
    return [HostOnlyOp(op.index, op.name, op.op, reasons.get(op.name) or "TVM cannot import it")
            for op in ops if op.name in names]


def host_only_note(host_only: list[HostOnlyOp], mixed: bool = False) -> str:
    """The note a result carries when the model holds ops TVM cannot import (run on the host), with why."""
    fed = ("re-executed on the host, fed the run's values" if mixed else
           "their recorded values feed the ops after them")
    return (f"on the host only, cut out of the target's units ({fed}): "
            f"{host_only_text([entry.to_json() for entry in host_only])}")


def host_only_verdict(host_only: list[HostOnlyOp], index: int, mode: Mode) -> Verdict:
    """What a host-only op gets instead of a verdict: none (MISSING), with the reason."""
    entry = next(entry for entry in host_only if entry.index == index)
    return Verdict(index, entry.name, mode, Status.MISSING, message=f"runs on the host only: {entry.reason}")


class KeptOps:
    """The session's kept set, by origin: the host-only ops (always), a reference target's TVM-wide
    ops (always, engine/reference.py) and the user's (`--keep`, replaced by `keep_user`). One object,
    shared by the collaborators that cut units around kept ops (the propagated replay, chains,
    mixed runs), so that the user's change reaches them all."""

    def __init__(self, ops: list[OpInfo], host_only: list[HostOnlyOp], reference: frozenset[int] = frozenset()):
        self.ops = ops
        self.host_only = host_only
        self.host_only_ops = frozenset(entry.index for entry in host_only)
        self.reference = reference
        self.user: frozenset[int] = frozenset()  # the ops the user keeps: what results list as kept
        self.all: frozenset[int] = self.host_only_ops | reference  # every op kept on the source

    def keep_user(self, indices) -> frozenset[int]:
        """The user's kept ops become `indices` with the other bindings of their source ops (through
        `Session.set_kept`, which forgets the replay's target values and updates its own `kept`)."""
        self.user = with_node_groups(self.ops, indices)
        self.all = self.user | self.host_only_ops | self.reference
        return self.user

    def host_only_verdict(self, index: int, mode: Mode) -> Verdict | None:
        """A host-only op's stand-in verdict (none to compute), None for any other op."""
        return host_only_verdict(self.host_only, index, mode) if index in self.host_only_ops else None
