"""Result objects the engine returns; the REPL and CLI only render them."""

from __future__ import annotations

from dataclasses import dataclass, field

from tapml_dbg.judge.compare import Metrics, worst

ISOLATED = "isolated"
PROPAGATED = "propagated"
FAILURE_STATUSES = ("fail", "compile-error", "crash", "timeout", "error")


@dataclass
class Verdict:
    """One op's comparison in one mode. status: pass, fail, compile-error, crash, timeout, error, missing."""

    index: int
    name: str
    mode: str
    status: str
    metrics: list[Metrics] = field(default_factory=list)
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def failed(self) -> bool:
        return self.status in FAILURE_STATUSES

    @property
    def worst(self) -> Metrics | None:
        return worst(self.metrics) if self.metrics else None

    @property
    def summary(self) -> str:
        if self.metrics and self.status in ("pass", "fail"):
            return self.worst.summary()
        return self.message

    def to_json(self) -> dict:
        return {"mode": self.mode, "status": self.status, "message": self.message,
                "metrics": self.worst.to_json() if self.metrics else {}}


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

    def verdict(self, mode: str) -> Verdict | None:
        return self.isolated if mode == ISOLATED else self.propagated


@dataclass
class Culprit:
    index: int
    name: str
    op: str
    layer: str
    verdict: str  # isolated | propagated | compile-error | crash | timeout
    metrics: Metrics | None
    message: str = ""

    @property
    def summary(self) -> str:
        return self.metrics.summary() if self.metrics else self.message

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "op": self.op, "layer": self.layer,
                "verdict": self.verdict, "metrics": self.metrics.to_json() if self.metrics else {},
                "message": self.message}


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

    def to_json(self) -> dict:
        return {"diverged": self.diverged, "ops": self.ops, "probes": self.probes,
                "seconds": round(self.seconds, 3), "target": self.target,
                "op": self.culprit.to_json() if self.culprit else None,
                "search": [{"index": k, "failed": f} for k, f in self.search], "notes": self.notes}


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
