"""The debugger's semantics: breakpoints, step / next / continue, and why a run stops.

As in `bdb`, the engine owns the stepping rules and a front end only calls them: the REPL's
`step N` is `Debugger.step(N)`, `continue` is `Debugger.continue_()`. Rules (docs/repl.md):
- the position is the next op to run; each op run gets both verdicts (`Session.compare`);
- a breakpoint stops any run *after* the op it names has run, so its verdicts are on screen;
- `next` and `continue` also stop at a new divergence (`judge_divergence`, THE rule, which
  bisect's answer and the report's culprit follow too): an op *diverges* when its isolated
  verdict fails (its kernel is wrong, whatever happens downstream) or its verdict in the current
  `mode` fails; the divergence is *inherited*, not new, when only the propagated verdict fails and
  the op reads a value whose propagated verdict already failed (its kernel is fine, the error
  flows through it). Both verdicts are computed for every op, so an isolated failure that washes
  out downstream stops `continue` where bisect's sweep finds it;
- `break diverge` stops at every diverging op, inherited or not, for every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

from tapml_dbg.engine.results import StepResult
from tapml_dbg.engine.session import Session
from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, Mode
from tapml_dbg.model.graph import OpInfo

DEFAULT_MODE = PROPAGATED  # the verdict that counts for `continue`, `next` and `break diverge`

Progress = Callable[..., None]


def _noop(*_args, **_kwargs) -> None:
    return None


@dataclass(frozen=True)
class Divergence:
    """How one op's two verdicts read under a mode."""

    failing: bool  # the isolated verdict fails, or the verdict of the mode does
    inherited: bool  # only the propagated verdict fails, and the op reads an already diverged value
    isolated_failed: bool
    mode_failed: bool
    mode: Mode

    @property
    def new(self) -> bool:
        """A divergence that stops `continue` and `next`, and that bisect names."""
        return self.failing and not self.inherited

    @property
    def reason(self) -> str:
        """Why a run stops here ("" when it does not): which verdicts failed."""
        if not self.new:
            return ""
        if self.mode == ISOLATED or not self.isolated_failed:
            return f"divergence: the {self.mode} verdict failed"
        if self.mode_failed:
            return "divergence: the isolated and propagated verdicts failed"
        return "divergence: the isolated verdict failed (the propagated verdict passes)"


def judge_divergence(result: StepResult, mode: Mode, upstream_diverged: bool) -> Divergence:
    """THE divergence rule of stepping (see the module docstring); `upstream_diverged`: the op reads
    a value whose propagated verdict failed earlier in this run."""
    isolated_failed = result.isolated is not None and result.isolated.failed
    verdict = result.verdict(mode)
    mode_failed = verdict is not None and verdict.failed
    failing = isolated_failed or mode_failed
    inherited = failing and not isolated_failed and mode == PROPAGATED and upstream_diverged
    return Divergence(failing, inherited, isolated_failed, mode_failed, mode)


def first_divergence(steps: list[StepResult], ops: list[OpInfo], mode: Mode = DEFAULT_MODE) -> StepResult | None:
    """The op a `continue` over `steps` (in order, no breakpoints) stops at: the first new divergence."""
    diverged: set[str] = set()
    for step in steps:
        op = ops[step.index]
        if judge_divergence(step, mode, any(name in diverged for name in op.inputs)).new:
            return step
        if step.propagated is not None and step.propagated.failed:
            diverged.add(op.name)
    return None


class BreakKind(StrEnum):
    OP = "op"  # after one op
    LAYER = "layer"  # after any op of a layer (nested layers included)
    STEP = "step"  # after any op of a generation step (`@2`), or of a selector within one (`@2/model.layers.1`)
    NAN = "nan"  # when the target's NaN/Inf pattern differs from the source's
    DIVERGE = "diverge"  # at every diverging op, inherited or not


class Command(StrEnum):
    """How a run ends (besides breakpoints and the end of the trace)."""

    STEP = "step"  # after N ops; only breakpoints stop it early
    NEXT = "next"  # at the end of the current layer, or a new divergence
    CONTINUE = "continue"  # at a new divergence


@dataclass
class Breakpoint:
    number: int
    kind: BreakKind
    spec: str  # what the user typed, resolved: an op name, a layer path, "nan" or "diverge"
    ops: frozenset[int] = frozenset()  # the op indices it covers (op and layer kinds)
    hits: int = 0

    def describe(self) -> str:
        if self.kind == BreakKind.OP:
            (index,) = tuple(self.ops)
            return f"op #{index} {self.spec}"
        if self.kind in (BreakKind.LAYER, BreakKind.STEP):
            return f"{self.kind} {self.spec} ({len(self.ops)} ops)"
        if self.kind == BreakKind.NAN:
            return "nan: the target's NaN/Inf pattern differs from the source"
        return "diverge: every op whose verdict fails, inherited or not"

    def label(self) -> str:
        """How a stop reason names it."""
        if self.kind in (BreakKind.OP, BreakKind.LAYER, BreakKind.STEP):
            return f"breakpoint {self.number} ({self.kind} {self.spec})"
        return f"breakpoint {self.number} ({self.kind})"

    def hit_by(self, result: StepResult, failed: bool) -> bool:
        if self.kind in (BreakKind.OP, BreakKind.LAYER, BreakKind.STEP):
            return result.index in self.ops
        if self.kind == BreakKind.NAN:
            return any(m.nan_mismatch or m.inf_mismatch for v in (result.isolated, result.propagated)
                       if v is not None for m in v.metrics)
        return failed


@dataclass
class RunResult:
    """What step / next / continue did: the ops run, and why it stopped."""

    command: Command
    mode: Mode
    steps: list[StepResult] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why it stopped early (breakpoint, divergence)
    inherited: set[int] = field(default_factory=set)  # failing ops whose failure came from upstream
    cancelled: bool = False  # Ctrl-C
    at_end: bool = False  # the trace's last op has run
    next_op: OpInfo | None = None


class Debugger:
    """Stepping over one session: the verdict mode, breakpoints, and what this run has seen."""

    def __init__(self, session: Session):
        self.session = session
        self.position = 0  # the next op to run
        self.mode: Mode = DEFAULT_MODE
        self.breakpoints: list[Breakpoint] = []
        self._next_number = 1
        self.seen: dict[int, StepResult] = {}  # latest verdicts seen per op
        self.diverged: set[str] = set()  # ops whose propagated verdict failed this run
        self.last: StepResult | None = None  # the op the last run ran last
        session.observers.observe(self._session_forgot)

    # -- breakpoints ------------------------------------------------------------------------
    def add_breakpoint(self, kind: BreakKind, spec: str, ops: frozenset[int] = frozenset()) -> Breakpoint:
        for existing in self.breakpoints:
            if existing.kind == kind and existing.spec == spec:
                return existing
        bp = Breakpoint(self._next_number, kind, spec, ops)
        self._next_number += 1
        self.breakpoints.append(bp)
        return bp

    def delete_breakpoint(self, number: int | None) -> list[Breakpoint]:
        """Delete breakpoint `number`, or all of them; returns what went."""
        if number is None:
            gone, self.breakpoints = self.breakpoints, []
            return gone
        gone = [bp for bp in self.breakpoints if bp.number == number]
        self.breakpoints = [bp for bp in self.breakpoints if bp.number != number]
        return gone

    # -- state --------------------------------------------------------------------------------
    def forget_run(self) -> None:
        """After `reset` or an offload change: target values are gone, so is what diverged."""
        self.diverged.clear()
        self.last = None

    def reset(self) -> None:
        """Back to op 0 (the session's `reset`: every op offloaded, no target values)."""
        self.session.reset()

    def _session_forgot(self, what: str) -> None:
        """The session forgot computed state (`Session.observe`): a reset starts the run over from op
        0; an edited pass makes the verdicts seen the old text's."""
        if what == "reset":
            self.position = 0
            self.forget_run()
        elif what == "transform":
            self.seen.clear()

    def compare(self, index: int) -> StepResult:
        """Both verdicts of one op, remembered as seen."""
        result = self.session.compare(index)
        self.seen[result.index] = result
        return result

    # -- running ------------------------------------------------------------------------------
    def step(self, count: int = 1, progress: Progress = _noop) -> RunResult:
        return self.run_until(Command.STEP, count, progress)

    def next(self, progress: Progress = _noop) -> RunResult:
        return self.run_until(Command.NEXT, None, progress)

    def continue_(self, progress: Progress = _noop) -> RunResult:
        return self.run_until(Command.CONTINUE, None, progress)

    def run_until(self, command: Command, limit: int | None = None, progress: Progress = _noop) -> RunResult:
        """Run ops from the position until `command`'s rule, a breakpoint or the end says stop."""
        session = self.session
        total = len(session.ops)
        run = RunResult(command, self.mode)
        if self.position >= total:
            run.at_end = True
            return run
        layer = session.ops[self.position].layer
        planned = self._planned(command, limit, layer)
        try:
            while self.position < total:
                if limit is not None and len(run.steps) >= limit:
                    break
                if command == Command.NEXT and run.steps and session.ops[self.position].layer != layer:
                    break
                op = session.ops[self.position]
                progress(len(run.steps), planned, f"#{op.index} {op.name}")
                result = session.run_op(self.position)
                self.position += 1
                self.seen[result.index] = result
                self.last = result
                run.steps.append(result)
                reasons, inherited = self.stop_reasons(result, on_divergence=command != Command.STEP)
                if inherited:
                    run.inherited.add(result.index)
                if reasons:
                    result.breakpoint = "; ".join(reasons)
                    run.reasons = reasons
                    break
        except KeyboardInterrupt:
            run.cancelled = True
        run.at_end = self.position >= total
        run.next_op = session.ops[self.position] if not run.at_end else None
        return run

    def _planned(self, command: Command, limit: int | None, layer: str) -> int:
        """How many ops the run will take at most (for the progress bar)."""
        session = self.session
        left = len(session.ops) - self.position
        if limit is not None:
            return min(limit, left)
        if command == Command.NEXT:
            return sum(1 for op in session.ops[self.position:] if op.layer == layer)
        return left

    def stop_reasons(self, result: StepResult, on_divergence: bool) -> tuple[list[str], bool]:
        """Why a run stops after `result` (empty: go on), and whether its failure is inherited."""
        op = self.session.ops[result.index]
        divergence = judge_divergence(result, self.mode, any(name in self.diverged for name in op.inputs))
        reasons, diverge_breakpoint = [], False
        for bp in self.breakpoints:
            if bp.hit_by(result, divergence.failing):
                bp.hits += 1
                diverge_breakpoint = diverge_breakpoint or bp.kind == BreakKind.DIVERGE
                reasons.append(bp.label())
        if on_divergence and divergence.new and not diverge_breakpoint:
            reasons.append(divergence.reason)
        if result.propagated is not None and result.propagated.failed:
            self.diverged.add(op.name)
        return reasons, divergence.inherited
