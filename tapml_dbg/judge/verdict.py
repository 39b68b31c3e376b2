"""A verdict: one op's target value judged against the source, in one mode, with the evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tapml_dbg.judge.compare import Metrics, worst


class Mode(StrEnum):
    """Which inputs the op was fed on the target."""

    ISOLATED = "isolated"  # the recorded source inputs: "this kernel is wrong"
    PROPAGATED = "propagated"  # the target's own upstream values: "the error arrives here"
    FUSED = "fused"  # recorded inputs of a unit holding the op and its producers: "wrong only compiled together"


ISOLATED, PROPAGATED, FUSED = Mode.ISOLATED, Mode.PROPAGATED, Mode.FUSED


class Status(StrEnum):
    """A verdict's outcome. The unit statuses of a failed run (compile-error ...) keep their names."""

    PASS = "pass"
    FAIL = "fail"
    COMPILE_ERROR = "compile-error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    ERROR = "error"  # the unit ran but raised, or the target gave no value
    MISSING = "missing"  # the trace holds no value to feed or compare: no verdict
    UNDEFINED = "undefined"  # the source value is uninitialised memory (torch.empty): nothing to judge

    @property
    def failed(self) -> bool:
        return self not in (Status.PASS, Status.MISSING, Status.UNDEFINED)

    @property
    def judged(self) -> bool:
        """The target ran and its values were compared (pass or fail), as opposed to a failed run."""
        return self in (Status.PASS, Status.FAIL)


class WrongClass(StrEnum):
    """What kind of wrong a failing verdict is (judge/classify.py says how each is told)."""

    TYPE = "type"  # the import declares another dtype or shape than the source computed
    NAN_INF = "nan/inf"  # NaN or Inf where the source has none (or the other way round)
    PRECISION = "precision"  # explained by accumulating in the output's low precision
    SEMANTIC = "semantic"  # far outside any precision explanation: the kernel computes something else
    NONDETERMINISTIC = "nondeterministic"  # two runs of the same unit differ: out-of-bounds reads, races
    FUSED = "fused"  # right alone and on right inputs, wrong compiled with its producers: a fusion/schedule bug


@dataclass
class Verdict:
    """One op's comparison in one mode; a failing one carries its class and the evidence for it."""

    index: int
    name: str
    mode: Mode
    status: Status
    metrics: list[Metrics] = field(default_factory=list)
    message: str = ""
    wrong: WrongClass | None = None  # the class of a failing judged verdict
    evidence: str = ""  # why it is that class, in one line

    @property
    def passed(self) -> bool:
        return self.status == Status.PASS

    @property
    def failed(self) -> bool:
        return self.status.failed

    @property
    def worst(self) -> Metrics | None:
        return worst(self.metrics) if self.metrics else None

    @property
    def summary(self) -> str:
        if self.metrics and self.status.judged:
            return self.worst.summary()
        return self.message

    def to_json(self) -> dict:
        return {"mode": self.mode, "status": self.status, "message": self.message,
                "class": self.wrong, "evidence": self.evidence,
                "metrics": self.worst.to_json() if self.metrics else {}}
