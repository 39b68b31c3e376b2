"""What REPL command handlers return; `render.py` draws them. Plain data, no rich, no printing."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tapml_dbg.model.generation import StepInfo
from tapml_dbg.model.graph import OpInfo
from tapml_dbg.engine.report import OpPoint
from tapml_dbg.engine.results import BisectResult, Culprit, StepResult
from tapml_dbg.engine.stops import Breakpoint


@dataclass
class Message:
    """One or more lines of plain information."""

    text: str
    style: str = ""


@dataclass
class HelpResult:
    commands: list  # list[Command]: the whole table (overview) ...
    command: object | None = None  # ... or the one command asked about


@dataclass
class InfoResult:
    trace: dict  # tapml_dbg.trace.inspect.trace_info without the op table
    target: str
    remote: str
    transform: str
    mode: str
    position: int
    ops: int
    offload: str
    breakpoints: int
    tolerance: str


@dataclass
class OpRow:
    op: OpInfo
    offloaded: bool
    current: bool
    seen: StepResult | None  # the latest verdicts the REPL saw for it


@dataclass
class OpsResult:
    rows: list[OpRow]
    matched: int  # rows may be cut to a page; this is how many matched
    query: str


@dataclass
class LayerRow:
    path: str
    depth: int
    first: int
    last: int
    count: int


@dataclass
class LayersResult:
    rows: list[LayerRow]


@dataclass
class StepPlace:
    """Where an op sits in a generation trace: its step and its place among that step's ops."""

    step: int
    last_step: int  # the generation's last step (its steps are 0..last_step)
    recorded: StepInfo | None  # the step as recorded: kind, positions, token (None: not in the trace meta)
    offset: int  # the op's place among the step's ops, from 0
    count: int  # ops in the step


@dataclass
class WhereResult:
    position: int
    ops: int
    op: OpInfo | None  # the next op to run; None at the end of the trace
    last: StepResult | None
    target: str
    mode: str
    offload: str
    breakpoints: int
    place: StepPlace | None = None  # the next op's step, in a generation trace


@dataclass
class InputRow:
    name: str
    kind: str  # "op #12", "param", "input"
    spec: str  # shape and dtype when known


@dataclass
class ShowResult:
    op: OpInfo
    ir: str
    inputs: list[InputRow]
    stats: list[dict]  # recorded per-output stats (empty when not recorded)
    note: str
    offloaded: bool
    seen: StepResult | None


@dataclass
class OffloadResult:
    message: str
    offload: str


@dataclass
class KeepResult:
    """`keep`: what changed and the kept ops (engine/kept.py)."""

    message: str
    kept: str  # `#14 cumsum, #37 eq`, or "" when none


@dataclass
class CompareResult:
    step: StepResult
    op: OpInfo
    offloaded: bool


@dataclass
class PrintedOutput:
    number: int  # output index of a multi-output op
    source: np.ndarray
    target: np.ndarray | None
    note: str = ""  # why there is no target value


@dataclass
class PrintResult:
    op: OpInfo
    mode: str
    index_text: str  # the slice as typed, normalized ("" when none)
    outputs: list[PrintedOutput]
    offloaded: bool = True


@dataclass
class TolResult:
    policy: dict  # TolerancePolicy.to_json()
    message: str = ""


@dataclass
class BreakResult:
    breakpoints: list[Breakpoint]
    message: str = ""


@dataclass
class DumpDone:
    result: object  # whatever tapml_dbg.repro.dump_op returned


@dataclass
class BisectDone:
    """`bisect` in the REPL: the engine's result, rendered as the CLI does, then what to type next."""

    result: BisectResult


@dataclass
class PlotResult:
    """`plot`: both verdicts of a range of ops, and where `continue` would stop."""

    points: list[OpPoint]
    culprit: Culprit | None
    target: str


@dataclass
class Quit:
    pass
