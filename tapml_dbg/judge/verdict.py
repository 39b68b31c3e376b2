"""A verdict: one op's target value judged against the source, in one mode, with the evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tapml_dbg.judge.compare import Metrics, worst


class Mode(StrEnum):
    """Which inputs the op was fed on the target."""

    ISOLATED = "isolated"  # the recorded source inputs: "this kernel is wrong"
    PROPAGATED = "propagated"  # the target's own upstream values: "the error arrives here"


ISOLATED, PROPAGATED = Mode.ISOLATED, Mode.PROPAGATED


class Status(StrEnum):
    """A verdict's outcome. The unit statuses of a failed run (compile-error ...) keep their names."""

    PASS = "pass"
    FAIL = "fail"
    COMPILE_ERROR = "compile-error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    ERROR = "error"  # the unit ran but raised, or the target gave no value
    MISSING = "missing"  # the trace holds no value to feed or compare: no verdict

    @property
    def failed(self) -> bool:
        return self not in (Status.PASS, Status.MISSING)

    @property
    def judged(self) -> bool:
        """The target ran and its values were compared (pass or fail), as opposed to a failed run."""
        return self in (Status.PASS, Status.FAIL)


@dataclass
class Verdict:
    """One op's comparison in one mode."""

    index: int
    name: str
    mode: Mode
    status: Status
    metrics: list[Metrics] = field(default_factory=list)
    message: str = ""

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
                "metrics": self.worst.to_json() if self.metrics else {}}
