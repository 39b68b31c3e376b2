"""What the REPL remembers beyond the engine: the verdict mode, breakpoints, verdicts seen.

The engine (`Session`) owns the position, the offload set and the target values; this object
owns only front-end choices. It is plain data so a test can build one without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tapml_dbg.judge.verdict import ISOLATED, PROPAGATED, StepResult

MODES = (ISOLATED, PROPAGATED)
DEFAULT_MODE = PROPAGATED  # the verdict that counts for `continue`, `next` and `break diverge`

# breakpoint kinds
BREAK_OP = "op"
BREAK_LAYER = "layer"
BREAK_NAN = "nan"
BREAK_DIVERGE = "diverge"


@dataclass
class Breakpoint:
    number: int
    kind: str  # op | layer | nan | diverge
    spec: str  # what the user typed, resolved: an op name, a layer path, "nan" or "diverge"
    ops: frozenset[int] = frozenset()  # the op indices it covers (op and layer kinds)
    hits: int = 0

    def describe(self) -> str:
        if self.kind == BREAK_OP:
            (index,) = tuple(self.ops)
            return f"op #{index} {self.spec}"
        if self.kind == BREAK_LAYER:
            return f"layer {self.spec} ({len(self.ops)} ops)"
        if self.kind == BREAK_NAN:
            return "nan: the target's NaN/Inf pattern differs from the source"
        return "diverge: every op whose verdict fails, inherited or not"


@dataclass
class ReplState:
    mode: str = DEFAULT_MODE
    breakpoints: list[Breakpoint] = field(default_factory=list)
    next_breakpoint: int = 1
    results: dict[int, StepResult] = field(default_factory=dict)  # latest verdicts seen per op
    diverged: set[str] = field(default_factory=set)  # ops whose propagated verdict failed this run
    last: StepResult | None = None  # the op the last step/next/continue ran last

    def add_breakpoint(self, kind: str, spec: str, ops: frozenset[int] = frozenset()) -> Breakpoint:
        for existing in self.breakpoints:
            if existing.kind == kind and existing.spec == spec:
                return existing
        bp = Breakpoint(self.next_breakpoint, kind, spec, ops)
        self.next_breakpoint += 1
        self.breakpoints.append(bp)
        return bp

    def delete_breakpoint(self, number: int | None) -> list[Breakpoint]:
        if number is None:
            gone, self.breakpoints = self.breakpoints, []
            return gone
        gone = [bp for bp in self.breakpoints if bp.number == number]
        self.breakpoints = [bp for bp in self.breakpoints if bp.number != number]
        return gone

    def forget_run(self) -> None:
        """After `reset` or an offload change: target values are gone, so is what diverged."""
        self.diverged.clear()
        self.last = None

    def record(self, result: StepResult) -> None:
        self.results[result.index] = result
