"""What the engine returns: ops run with their verdicts, bisection and compile reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from tapml_dbg.judge.compare import Metrics
from tapml_dbg.judge.diagnosis import diagnose, diagnosis
from tapml_dbg.judge.verdict import ISOLATED, Mode, Verdict, WrongClass
from tapml_dbg.model.graph import SourceLocation


@dataclass
class StepResult:
    """An op run on the target, with the verdicts computed for it."""

    index: int
    name: str
    op: str
    layer: str
    isolated: Verdict | None = None
    propagated: Verdict | None = None
    breakpoint: str = ""  # why execution stopped here, if it did
    step: int | None = None  # its generation step (0 = the prefill); None outside a generation trace

    def verdict(self, mode: Mode) -> Verdict | None:
        return self.isolated if mode == ISOLATED else self.propagated

    @property
    def diagnosis(self) -> str:
        """What its verdicts say about where the bug is (judge/diagnosis.py: the one wording)."""
        return diagnose(self.isolated, self.propagated)

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "op": self.op, "layer": self.layer, "step": self.step,
                "isolated": self.isolated.to_json() if self.isolated else None,
                "propagated": self.propagated.to_json() if self.propagated else None}


@dataclass
class Culprit:
    index: int
    name: str
    op: str
    layer: str
    verdict: str  # a Mode (isolated | propagated) or the failed run's Status (compile-error | crash | timeout)
    metrics: Metrics | None
    message: str = ""
    wrong: WrongClass | None = None  # what kind of wrong (judge/classify.py); None for a failed run
    evidence: str = ""  # why it is that class
    unit: list[tuple[int, str]] = field(default_factory=list)  # a fused culprit's unit: (index, name) in order
    source_location: SourceLocation | None = None  # the user's model line it came from (None: unknown)
    step: int | None = None  # its generation step (0 = the prefill); None outside a generation trace
    attribution: str | None = None  # under a reference target: "target" (this platform's) or "tvm" (every target's)

    @property
    def summary(self) -> str:
        return self.metrics.summary() if self.metrics else self.message

    @property
    def diagnosis(self) -> str:
        """What its verdict and class say about where the bug is (judge/diagnosis.py: the one wording)."""
        return diagnosis(self.verdict, self.wrong)

    def to_json(self) -> dict:
        fused = {"first": self.unit[0][0], "last": self.unit[-1][0], "size": len(self.unit),
                 "ops": [{"index": i, "name": n} for i, n in self.unit]} if self.unit else None
        return {"index": self.index, "name": self.name, "op": self.op, "layer": self.layer,
                "verdict": self.verdict, "class": self.wrong, "evidence": self.evidence,
                "diagnosis": self.diagnosis,
                "metrics": self.metrics.to_json() if self.metrics else {}, "message": self.message,
                "fused": fused,
                "source_location": self.source_location.to_json() if self.source_location else None,
                "step": self.step, "attribution": self.attribution}


@dataclass
class BisectResult:
    diverged: bool
    ops: int
    probes: int
    seconds: float
    target: str
    culprit: Culprit | None = None
    neighbourhood: list[StepResult] = field(default_factory=list)
    search: list[tuple[int, bool]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # ops kept on the source: never searched (engine/kept.py)
    tokens: object = None  # engine.generation.TokenReport of a generation trace (teacher-forced); None otherwise
    host_only: list[dict] = field(default_factory=list)  # ops TVM cannot import, run on the host: {"index", "name", "op", "reason"}
    reference: dict = field(default_factory=lambda: {"kind": "source", "target": None})  # what it was judged against
    tvm_wide: list = field(default_factory=list)  # engine.reference.TvmWideOp: the reference target differs here too

    @property
    def first_bad_token(self):
        """The first step whose target top-1 differs from the source's (judge.tokens.TokenStep), or None."""
        return self.tokens.first_bad if self.tokens is not None else None

    def to_json(self) -> dict:
        first = self.first_bad_token
        return {"diverged": self.diverged, "ops": self.ops, "probes": self.probes,
                "seconds": round(self.seconds, 3), "target": self.target,
                "op": self.culprit.to_json() if self.culprit else None,
                "search": [{"index": k, "failed": f} for k, f in self.search], "kept": list(self.kept),
                "host_only": list(self.host_only), "notes": self.notes,
                "first_bad_token": first.first_bad_json() if first is not None else None,
                "tokens": self.tokens.to_json() if self.tokens is not None else None,
                "reference": self.reference, "tvm_wide": [op.to_json() for op in self.tvm_wide]}


@dataclass
class CompileReport:
    target: str
    ops: int
    failures: list[dict] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)

    def to_json(self) -> dict:
        return {"target": self.target, "ops": self.ops, "failed": self.failed, "failures": self.failures}
